"""Ports: a raw byte stream from the gateway to a server inside the sandbox.

``GET /v1/tunnel?port=N`` with ``Upgrade: podbay-tunnel``: the agent
connects to ``127.0.0.1:N`` (``[::1]:N`` when refused there) from inside the
sandbox's own network namespace, answers ``101`` and splices the two
connections until both directions end. Nothing ever listens for it on the
host or the sandbox's interfaces: the only way in is the agent's socket,
which only the gateway holds (after checking the caller's credential).
Nothing accepts on the port: 502 ``PORT_UNREACHABLE``, nothing upgraded.

Two threads per tunnel (one per direction), each moving at most
:data:`READ_SIZE` bytes at a time with blocking ``sendall``, so a slow
reader on either side holds the other back rather than filling memory.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

from podbay.errors import ApiError
from podbay.wire import paths
from podbay.wire.codes import ErrorCode

from .http import Request, Response

READ_SIZE = 64 * 1024
CONNECT_TIMEOUT_SECONDS = 5.0


def parse_port(raw: str | None) -> int:
    if not raw or not raw.isdigit() or len(raw) > 5 or not 1 <= int(raw) <= 65535:
        raise ApiError(ErrorCode.REQUEST_INVALID, "port must be a number from 1 to 65535")
    return int(raw)


def connect(port: int) -> socket.socket:
    errors = []
    for host in ("127.0.0.1", "::1"):
        try:
            upstream = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_SECONDS)
        except OSError as exc:
            errors.append(exc.strerror or str(exc))
            continue
        upstream.settimeout(None)
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return upstream
    raise ApiError(
        ErrorCode.PORT_UNREACHABLE,
        f"nothing inside the sandbox accepts connections on port {port} ({errors[0]})",
    )


def open_tunnel(req: Request) -> Response:
    upstream = connect(parse_port(req.query.get("port")))
    return Response(
        101,
        headers=[("Connection", "Upgrade"), ("Upgrade", paths.UPGRADE_TUNNEL)],
        content_type=None,
        upgrade=lambda sock, rest: splice(sock, upstream, rest),
    )


def splice(downstream: socket.socket, upstream: socket.socket, received: bytes) -> None:
    """Copy both ways until both directions have ended; then close both."""
    # A tunnel may idle as long as its WebSocket does: no request idle timeout here.
    downstream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("@ll", 0, 0))
    try:
        if received:
            upstream.sendall(received)
        back = threading.Thread(
            target=_copy, args=(upstream, downstream), name="tunnel-back", daemon=True
        )
        back.start()
        _copy(downstream, upstream)
        back.join()
    except (OSError, RuntimeError):  # RuntimeError: no thread to be had
        pass
    finally:
        upstream.close()


def _copy(source: socket.socket, sink: socket.socket) -> None:
    """``source`` to ``sink`` until ``source`` ends; then end ``sink``'s writing."""
    buf = bytearray(READ_SIZE)
    view = memoryview(buf)
    try:
        while n := source.recv_into(buf):
            sink.sendall(view[:n])
    except OSError:
        # One side broke: end the other one entirely, so its copier stops too.
        with contextlib.suppress(OSError):
            source.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
