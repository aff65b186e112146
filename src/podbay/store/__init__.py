"""Where the control plane keeps what exists: deployments and sandboxes.

:class:`~podbay.store.base.Store` is the seam; :mod:`.sqlite` the embedded
implementation (WAL, so the CLI and a running server share one file),
:mod:`.postgres` the shared one; :func:`.opening.open_store` picks by setting.
"""

from .base import InsertOutcome, Store

__all__ = ["InsertOutcome", "Store"]
