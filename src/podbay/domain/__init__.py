"""Records and state machines of the control plane: dataclasses, no I/O.

Separate from :mod:`podbay.wire` (what travels) on purpose: a record carries
facts the wire never shows (machine id, incarnation, deployment id).
"""

from .deployment import Deployment
from .options import SandboxOptions
from .sandbox import TRANSITIONS, Sandbox, SandboxState, StartKind, can_transition

__all__ = [
    "TRANSITIONS",
    "Deployment",
    "Sandbox",
    "SandboxOptions",
    "SandboxState",
    "StartKind",
    "can_transition",
]
