"""Runtime drivers: the isolated machines sandboxes run in (see :mod:`.base`)."""
