"""The async client (written by hand; the sync one is generated from it)."""
