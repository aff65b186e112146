"""envd's PTY processes (``sandbox.pty``) on podbay's terminals (``/v1/pty``).

A ``Start`` with ``pty`` opens one WebSocket to the sandbox's terminal
endpoint on the data plane (as podbay's own SDK does) and keeps it in this
server process: the terminal outlives the request that started it, as in
envd. One reader task takes its output and hands each chunk to every stream
following it (``Start``'s, then each ``Connect``'s) as ``data.pty`` events;
output that arrives while nobody follows is dropped, as envd does.
``SendInput``/``StreamInput`` with ``pty`` bytes write to it, ``Update``
resizes it, ``SendSignal`` hangs it up (the WebSocket closes: podbay kills the
command and what it started, so SIGTERM is SIGKILL here) and answers once it
is gone. The end event is the command's exit status, or ``exitCode: -1``,
``status: "signal: killed"`` when it was hung up (a kill, its timeout).

The terminals live in this process's memory (:class:`Terminals`): another
replica does not see them, and a restart hangs them up. A terminal's pid is
chosen here (a random uint32 no terminal of the sandbox has); at most
:data:`MAX_TERMINALS` per sandbox run at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from podbay.control.services.sandboxes import Attached
from podbay.wire import paths
from podbay.wire.codec import dumps
from podbay.wire.data import PtyRequest

from . import connect
from .relay import SANDBOX_ID_HEADER, headers, home_of, refusal, stream_error, user_of

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

#: Terminals one sandbox may have open at once through this server.
MAX_TERMINALS = 16
#: Events a follower may lag behind by before its stream is ended (so a stalled
#: client cannot make this process hold a terminal's output without bound).
MAX_QUEUED = 1024
#: The largest message the terminal sends (its output comes in 64 KiB reads).
MESSAGE_LIMIT = 1024 * 1024
MAX_SIZE = 10_000
_KILLED = {"exitCode": -1, "exited": False, "status": "signal: killed"}

Event = bytes | None


@dataclass
class Terminal:
    """One open terminal: its WebSocket, what ``List`` reports, its followers."""

    pid: int
    ws: ClientConnection
    config: dict[str, Any]
    tag: str | None
    followers: set[asyncio.Queue[Event]] = field(default_factory=set)
    end: dict[str, Any] | None = None
    error: connect.ConnectError | None = None
    reader: asyncio.Task[None] | None = None
    killer: asyncio.Task[None] | None = None

    def follow(self) -> asyncio.Queue[Event]:
        queue: asyncio.Queue[Event] = asyncio.Queue(MAX_QUEUED)
        self.followers.add(queue)
        return queue

    def publish(self, event: Event) -> None:
        for queue in list(self.followers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:  # too far behind: its stream ends
                self.followers.discard(queue)
                queue.get_nowait()
                queue.put_nowait(None)

    async def hang_up(self) -> None:
        """Close the WebSocket (podbay kills the command) and wait for the reader."""
        await self.ws.close()
        if self.reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self.reader)


class Terminals:
    """The terminals this server opened, by (sandbox id, pid)."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, int], Terminal] = {}

    def get(self, sandbox_id: str, selector: Any) -> Terminal | None:
        """The terminal a ``ProcessSelector`` names, if it names one."""
        if not isinstance(selector, dict):
            return None
        pid, tag = selector.get("pid"), selector.get("tag")
        if isinstance(tag, str):
            for (sid, _), terminal in self.open.items():
                if sid == sandbox_id and terminal.tag == tag:
                    return terminal
            return None
        return self.open.get((sandbox_id, pid)) if isinstance(pid, int) else None

    def of(self, sandbox_id: str) -> list[Terminal]:
        return [t for (sid, _), t in self.open.items() if sid == sandbox_id]

    def close(self) -> None:
        for terminal in self.open.values():
            for task in (terminal.reader, terminal.killer):
                if task is not None:
                    task.cancel()
            transport = terminal.ws.transport
            transport.abort()
        self.open.clear()


def terminals_of(request: Request) -> Terminals:
    terminals: Terminals = request.app.state.terminals
    return terminals


def _event(event: dict[str, Any]) -> bytes:
    return connect.envelope({"event": event})


def _size(message: dict[str, Any]) -> tuple[int, int]:
    pty = message.get("pty")
    size = pty.get("size") if isinstance(pty, dict) else None
    if not isinstance(size, dict):
        raise connect.ConnectError("invalid_argument", "pty.size (rows and cols) is required")
    rows, cols = size.get("rows", 0), size.get("cols", 0)
    for value in (rows, cols):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_SIZE:
            raise connect.ConnectError(
                "invalid_argument", f"pty.size's rows and cols are 1 to {MAX_SIZE}"
            )
    return rows, cols


async def _open(attached: Attached, request: PtyRequest) -> ClientConnection:
    from websockets.asyncio.client import connect as ws_connect
    from websockets.exceptions import InvalidHandshake, InvalidStatus

    endpoint = attached.endpoint.rstrip("/") + paths.PTY
    url = ("wss://" if endpoint.startswith("https://") else "ws://") + endpoint.split("://", 1)[1]
    try:
        ws = await ws_connect(
            url,
            additional_headers=headers(attached),
            max_size=MESSAGE_LIMIT,
            open_timeout=30,
            compression=None,
        )
    except InvalidStatus as exc:
        raise refusal(exc.response.status_code, bytes(exc.response.body or b"")) from None
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        raise connect.ConnectError("unavailable", f"the sandbox's terminal failed: {exc}") from None
    await ws.send(dumps(request).decode())
    return ws


async def _read(terminals: Terminals, key: tuple[str, int], terminal: Terminal) -> None:
    """The terminal's output to its followers until it ends; then its end."""
    from websockets.exceptions import ConnectionClosed

    try:
        async for message in terminal.ws:
            if isinstance(message, bytes):
                terminal.publish(_event({"data": {"pty": base64.b64encode(message).decode()}}))
                continue
            try:
                parsed = json.loads(message)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict) and parsed.get("type") == "exit":
                code = int(parsed.get("exit_code", -1))
                terminal.end = {"exitCode": code, "exited": True, "status": f"exit status {code}"}
            else:  # a refusal: the command could not start
                terminal.error = refusal(400, message.encode())
    except ConnectionClosed:
        pass
    finally:
        if terminal.end is None and terminal.error is None:
            terminal.end = dict(_KILLED)
        terminals.open.pop(key, None)
        if terminal.killer is not None:
            terminal.killer.cancel()
        terminal.publish(None)


def keepalive_seconds(request: Request) -> float | None:
    """``Keepalive-Ping-Interval`` (the SDK sends 50): a quiet stream then
    carries a keepalive event, as envd's does, so nothing between the SDK and
    this server ends it for idling."""
    raw = request.headers.get("keepalive-ping-interval", "")
    return float(raw) if raw.isdigit() and 0 < int(raw) <= 3600 else None


async def _next(queue: asyncio.Queue[Event], keepalive: float | None) -> Event:
    if keepalive is None:
        return await queue.get()
    try:
        return await asyncio.wait_for(queue.get(), keepalive)
    except TimeoutError:
        return _event({"keepalive": {}})


async def _follow(
    terminal: Terminal, queue: asyncio.Queue[Event], keepalive: float | None
) -> AsyncIterator[bytes]:
    try:
        yield _event({"start": {"pid": terminal.pid}})
        while (event := await _next(queue, keepalive)) is not None:
            yield event
        if terminal.error is not None:
            yield connect.end_of_stream(terminal.error)
        elif terminal.end is not None:
            yield _event({"end": terminal.end})
            yield connect.end_of_stream()
        else:  # this follower fell too far behind
            yield connect.end_of_stream(
                connect.ConnectError("resource_exhausted", "the client read the output too slowly")
            )
    finally:
        terminal.followers.discard(queue)


async def _kill_at(terminal: Terminal, seconds: float) -> None:
    """envd ends a PTY at its timeout (``Connect-Timeout-Ms``), followed or not."""
    await asyncio.sleep(seconds)
    await terminal.ws.close()


async def start(
    request: Request, attached: Attached, env_vars: dict[str, str], message: dict[str, Any]
) -> Response:
    """``Start`` with ``pty``: the terminal, and its events from now on."""
    terminals, sandbox_id = terminals_of(request), request.headers.get(SANDBOX_ID_HEADER, "")
    process = message["process"]
    rows, cols = _size(message)
    if len(terminals.of(sandbox_id)) >= MAX_TERMINALS:
        raise connect.ConnectError(
            "resource_exhausted", f"at most {MAX_TERMINALS} terminals per sandbox"
        )
    envs: dict[str, str] = process.get("envs") or {}
    args: list[str] = process.get("args") or []
    user = user_of(request)
    cwd = process.get("cwd") or home_of(user)
    pty_request = PtyRequest(
        command=[process["cmd"], *args],
        cwd=cwd,
        env={**env_vars, **envs},
        rows=rows,
        cols=cols,
        term=envs.get("TERM", "xterm-256color"),
        user=user,
    )
    ws = await _open(attached, pty_request)
    pid = secrets.randbelow(1 << 32)
    while (sandbox_id, pid) in terminals.open:
        pid = secrets.randbelow(1 << 32)
    config = {"cmd": process["cmd"], "args": args, "envs": envs, "cwd": cwd}
    tag = message.get("tag") if isinstance(message.get("tag"), str) else None
    terminal = Terminal(pid=pid, ws=ws, config=config, tag=tag)
    queue = terminal.follow()
    key = (sandbox_id, pid)
    terminals.open[key] = terminal
    loop = asyncio.get_running_loop()
    terminal.reader = loop.create_task(_read(terminals, key, terminal))
    deadline = connect.timeout_ms(request.headers.get("connect-timeout-ms"))
    if deadline is not None:
        terminal.killer = loop.create_task(_kill_at(terminal, deadline / 1000))
    return StreamingResponse(
        _follow(terminal, queue, keepalive_seconds(request)), media_type=connect.STREAM_JSON
    )


def connect_rpc(request: Request, terminal: Terminal) -> Response:
    """``Connect``: follow a running terminal from now on (no replay, as envd)."""
    if terminal.end is not None or terminal.error is not None:
        return stream_error(connect.ConnectError("not_found", "the terminal has ended"))
    return StreamingResponse(
        _follow(terminal, terminal.follow(), keepalive_seconds(request)),
        media_type=connect.STREAM_JSON,
    )


def listed(terminal: Terminal) -> dict[str, Any]:
    info: dict[str, Any] = {"pid": terminal.pid, "config": terminal.config}
    if terminal.tag is not None:
        info["tag"] = terminal.tag
    return info


async def write(terminal: Terminal, value: Any) -> None:
    """``input``'s ``pty`` bytes (base64) to the terminal."""
    if not isinstance(value, dict) or not isinstance(value.get("pty"), str):
        raise connect.ConnectError("invalid_argument", "a PTY's input is input.pty")
    try:
        data = base64.b64decode(value["pty"], validate=True)
    except ValueError:
        raise connect.ConnectError("invalid_argument", "input.pty must be base64") from None
    await _send(terminal, data)


async def resize(terminal: Terminal, message: dict[str, Any]) -> None:
    rows, cols = _size(message)
    await _send(terminal, json.dumps({"type": "resize", "rows": rows, "cols": cols}))


async def _send(terminal: Terminal, data: bytes | str) -> None:
    from websockets.exceptions import ConnectionClosed

    try:
        await terminal.ws.send(data)
    except ConnectionClosed:
        raise connect.ConnectError("not_found", "the terminal has ended") from None
