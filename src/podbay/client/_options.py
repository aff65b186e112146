"""Attach's options beyond the class, and the listening ports of a sandbox.

Sans-I/O, shared by both faces of the client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from podbay.wire.control import NetworkPolicy, VolumeMount

#: Read inside the sandbox by ``listening_ports``: the kernel's TCP sockets
#: (gVisor's and a vm guest's kernels keep the same files as the host's).
LISTENING_COMMAND = ("cat", "/proc/net/tcp", "/proc/net/tcp6")
#: ``st`` of a listening socket in ``/proc/net/tcp``.
_LISTEN = "0A"


@dataclass(frozen=True, kw_only=True)
class AttachOptions:
    """What ``attach`` may set on a new sandbox; None: the server's setting."""

    labels: Mapping[str, str] | None = None
    env: Mapping[str, str] | None = None
    cpus: float | None = None
    memory_mib: int | None = None
    idle_timeout_seconds: int | None = None
    network: NetworkPolicy | None = None
    #: Volumes by path in the sandbox: a name, or a VolumeMount (read-only).
    volumes: Mapping[str, str | VolumeMount] | None = None


def parse_listening(text: str) -> list[int]:
    """The ports of the listening sockets in ``/proc/net/tcp``-shaped ``text``.

    >>> parse_listening(
    ...     "  sl  local_address rem_address   st\\n"
    ...     "   0: 00000000:1F40 00000000:0000 0A\\n"
    ...     "   1: 0100007F:0050 0100007F:9C40 01\\n"
    ... )
    [8000]
    """
    ports: set[int] = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[3] != _LISTEN or ":" not in fields[1]:
            continue
        try:
            port = int(fields[1].rsplit(":", 1)[1], 16)
        except ValueError:
            continue
        if 0 < port <= 65535:
            ports.add(port)
    return sorted(ports)
