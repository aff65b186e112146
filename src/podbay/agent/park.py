"""The agent lets go of its host socket so gVisor can checkpoint the sandbox.

gVisor (runsc 20221219) refuses to save a unix socket bound on the host
("Cannot save endpoint with bound host socket"), and the agent's listening
socket is one (runsc's ``--host-uds=create``), as is every connection
accepted on it. So before a checkpoint the host asks ``POST /v1/park``: the
agent closes its listener, shuts every open connection (each thread then
closes its own), and waits in the sandbox with no host socket at all until
the host says it was restored: a file named :data:`RESUMED` appears in the
socket's directory (bound from the host, so a new gofer shows the host's
file after a restore). The agent then binds the socket again and serves on,
with every process and its memory as they were. The host deletes the file
before it parks the agent, so a park is never undone by a stale one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

#: The file whose appearance, beside the socket, tells a parked agent it runs again.
RESUMED = "resumed"

#: How often a parked agent looks for :data:`RESUMED`: a restored agent answers
#: within this (each look is one gofer request; nothing else runs meanwhile).
POLL_SECONDS = 0.02


def resumed_marker(socket_path: str) -> str:
    """The file beside ``socket_path`` that ends a park.

    >>> resumed_marker("/.podbay/run/agent.sock")
    '/.podbay/run/resumed'
    """
    return os.path.join(os.path.dirname(socket_path), RESUMED)


def wait_until_resumed(marker: str, *, poll: Callable[[float], object] | None = None) -> None:
    """Block until ``marker`` exists."""
    wait = poll or threading.Event().wait
    while not os.path.exists(marker):
        wait(POLL_SECONDS)
