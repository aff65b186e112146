"""Where the control plane keeps what exists: deployments and sandboxes.

:class:`~podbay.store.base.Store` is the seam; :mod:`.sql` holds its queries
once, :mod:`.rows` the row ↔ record mapping; :mod:`.sqlite` is the embedded
database (WAL, so the CLI and a running server share one file), :mod:`.postgres`
the shared one; :func:`.opening.open_store` picks by setting.
"""

from .base import InsertOutcome, Store

__all__ = ["InsertOutcome", "Store"]
