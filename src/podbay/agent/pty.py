"""Terminals: a command on a pseudo-terminal, driven over one upgraded connection.

The gateway terminates the client's WebSocket and talks to the agent with
an HTTP/1.1 upgrade (``Upgrade: podbay-pty``): the request body is the
:class:`~podbay.wire.data.PtyRequest`; once the command runs the answer is
``101`` and the connection carries :mod:`podbay.wire.stream` frames. A
command that cannot start is refused like ``exec`` (400
``COMMAND_START_FAILED``) and nothing is upgraded.

One thread (the connection's) runs the session with ``poll``: terminal
input is written to the pty as the command reads it (at most
:data:`MAX_PENDING_INPUT` waits; past that the socket is not read, which
holds the sender back), output is framed as it comes. The session ends
with an EXIT frame once the command has exited and its terminal is drained
(or :data:`EXIT_DRAIN_SECONDS` later, when a background process keeps it
open). When the other side goes away first, the command and everything it
started are killed: closing a terminal hangs up its session.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import socket
import struct
import time
from collections.abc import Mapping

from podbay.errors import ApiError, FrameError
from podbay.wire import paths, stream
from podbay.wire.codes import ErrorCode
from podbay.wire.data import PtyRequest

from . import guard, ttysignals, users
from .environment import check_env, command_env
from .exec import resolve_cwd
from .http import Response
from .launch import Child, check_command, launch_on_terminal
from .reaper import Reaper

READ_SIZE = 64 * 1024
#: Terminal input accepted but not yet read by the command.
MAX_PENDING_INPUT = 256 * 1024
#: After the command exits, how long output is still collected from its
#: terminal when something it started keeps the terminal open.
EXIT_DRAIN_SECONDS = 0.2
MAX_TERM_LENGTH = 64


def set_size(fd: int, rows: int, cols: int) -> None:
    # Imported with the first terminal, not at start-up: an extension module is
    # looked up, opened and mapped in the sandbox, dear at a gVisor agent's start.
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def start(
    reaper: Reaper,
    workspace: str,
    declared_env: Mapping[str, str],
    req: PtyRequest,
    default_user: str | None = None,
) -> Response:
    """Start ``req.command`` on a new pty; the answer takes the connection over."""
    check_command(req.command, req.cwd)
    account = users.resolve(req.user, default_user)
    try:
        stream.check_size(req.rows, req.cols)
    except FrameError as exc:
        raise ApiError(ErrorCode.REQUEST_INVALID, str(exc)) from None
    if not req.term or len(req.term) > MAX_TERM_LENGTH or not req.term.isprintable():
        raise ApiError(
            ErrorCode.REQUEST_INVALID, f"term must be 1 to {MAX_TERM_LENGTH} printable characters"
        )
    problem = check_env(req.env or {}, "env")
    if problem:
        raise ApiError(ErrorCode.REQUEST_INVALID, problem)
    env = command_env(declared_env, req.env)
    env["TERM"] = req.term
    leader, follower = os.openpty()
    try:
        set_size(follower, req.rows, req.cols)
        child = launch_on_terminal(
            reaper, req.command, resolve_cwd(workspace, req.cwd), env, follower, account=account
        )
    except BaseException:
        os.close(leader)
        raise
    finally:
        os.close(follower)
    return Response(
        101,
        headers=[("Connection", "Upgrade"), ("Upgrade", paths.UPGRADE_PTY)],
        content_type=None,
        upgrade=lambda sock, rest: Session(child, leader, sock, rest).run(),
    )


class Session:
    """One terminal's traffic; see the module docstring."""

    def __init__(self, child: Child, leader: int, sock: socket.socket, received: bytes) -> None:
        self.child = child
        self.leader = leader
        self.sock = sock
        self.inbox = bytearray(received)  # frames from the gateway, not yet parsed
        self.pending = bytearray()  # terminal input the command has not read yet
        self.terminal_open = True

    def run(self) -> None:
        # The connection's idle timeout is for requests; a terminal may idle for hours.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("@ll", 0, 0))
        os.set_blocking(self.leader, False)
        finished = False
        try:
            finished = self._loop()
        except (OSError, FrameError):
            finished = False
        finally:
            if not finished:
                self.child.kill_tree()
                self.child.kill_group()
            os.close(self.leader)

    def _loop(self) -> bool:
        """True when the command ended and its exit was sent; False when the
        other side went away or broke the protocol."""
        self._take_frames()
        drain_until: float | None = None
        while True:
            if self.child.code is not None and drain_until is None:
                drain_until = time.monotonic() + EXIT_DRAIN_SECONDS
            if drain_until is not None and (
                not self.terminal_open or time.monotonic() >= drain_until
            ):
                self.sock.sendall(stream.exit_frame(self.child.code or 0))
                return True
            poller = select.poll()
            if len(self.pending) < MAX_PENDING_INPUT:
                poller.register(self.sock, select.POLLIN)
            if self.terminal_open:
                poller.register(
                    self.leader, select.POLLIN | (select.POLLOUT if self.pending else 0)
                )
            # Wake now and then to notice the command's exit (the reaper sets it).
            timeout = 20 if drain_until is not None else 100
            for fd, event in poller.poll(timeout):
                if fd == self.leader:
                    self._terminal_ready(event)
                elif event & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    data = self.sock.recv(READ_SIZE)
                    if not data:
                        return False
                    self.inbox += data
                    self._take_frames()

    def _terminal_ready(self, event: int) -> None:
        if event & select.POLLOUT and self.pending:
            try:
                n = os.write(self.leader, self.pending)
                del self.pending[:n]
            except BlockingIOError:
                pass
            except OSError:
                self.pending.clear()
        if event & (select.POLLIN | select.POLLHUP | select.POLLERR):
            try:
                data = os.read(self.leader, READ_SIZE)
            except BlockingIOError:
                return
            except OSError as exc:  # EIO: no process holds the terminal any more
                if exc.errno != errno.EIO:
                    raise
                data = b""
            if data:
                self.sock.sendall(stream.frame(stream.DATA, data))
            else:
                self.terminal_open = False
                self.pending.clear()

    def _take_frames(self) -> None:
        """Act on every whole frame received; a partial one stays in the inbox."""
        inbox = self.inbox
        while len(inbox) >= stream.HEADER.size:
            kind, length = stream.parse_header(bytes(inbox[: stream.HEADER.size]))
            end = stream.HEADER.size + length
            if len(inbox) < end:
                return
            payload = bytes(inbox[stream.HEADER.size : end])
            del inbox[:end]
            if kind == stream.DATA:
                if self.terminal_open:
                    if guard.active():  # gVisor: its terminal raises no signal
                        payload, echo, flush = ttysignals.raise_signals(
                            self.leader, self.child.pid, payload
                        )
                        if flush:
                            self.pending.clear()
                        if echo:
                            self.sock.sendall(stream.frame(stream.DATA, echo))
                    self.pending += payload
            elif kind == stream.RESIZE:
                rows, cols = stream.parse_resize(payload)
                with contextlib.suppress(OSError):
                    set_size(self.leader, rows, cols)
            else:
                raise FrameError("the gateway sent an exit frame")
