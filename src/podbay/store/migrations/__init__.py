"""Versioned schema: ``NNNN_<what>.sql``, applied in order, recorded in
``PRAGMA user_version`` (SQLite) or ``podbay_schema_version`` (PostgreSQL).
Never edit a released file; add the next one. One set serves both: write SQL
both run (``REAL`` becomes ``DOUBLE PRECISION`` on PostgreSQL; no
SQLite-only functions); ``tests/unit/store`` checks both end with one schema."""
