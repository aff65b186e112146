"""Versioned schema: ``NNNN_<what>.sql``, applied in order, recorded in
``PRAGMA user_version``. Never edit a released file; add the next one."""
