"""The sync client (generated from ``_async`` by scripts/unasync.py) and its backend."""
