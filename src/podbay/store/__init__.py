"""Where the control plane keeps what exists: deployments and sandboxes.

:class:`~podbay.store.base.Store` is the seam; :mod:`.sqlite` the embedded
implementation (WAL, so the CLI and a running server share one file).
"""

from .base import InsertOutcome, Store

__all__ = ["InsertOutcome", "Store"]
