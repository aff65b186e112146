"""envd's directory watchers: ``WatchDir`` (a server stream, the async SDK's
``files.watch_dir``) and the polling calls ``CreateWatcher``,
``GetWatcherEvents`` and ``RemoveWatcher`` (the sync SDK's).

A watcher is a process in the sandbox (``podbay.e2b._watch``, run by the
sandbox's ``python3`` as the caller's user, so it sees what that user may
see): inotify-backed in every class, through the agent's spawned processes,
so the agent needs nothing new. Its events are JSON lines on its stdout,
read with the agent's long poll and sent as envd's ``FilesystemEvent``.

Bounds: at most :data:`MAX_WATCHERS` per sandbox through this server; the
events a polling watcher queues between two ``GetWatcherEvents`` are what the
agent keeps of a process's output (its newest bytes: older events are lost
past it), and an event line longer than :data:`MAX_LINE` ends the watcher.
A watcher's stream that ends (client gone, its timeout) kills it; a polling
watcher runs until ``RemoveWatcher`` or the sandbox ends. Watcher processes
are not listed by ``commands.list``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from podbay.control.services.sandboxes import Attached
from podbay.wire.paths import PROCESSES, process_path

from . import connect
from .relay import SANDBOX_ID_HEADER, call, in_home, reach, service_of, stream_error, unary, user_of
from .service import E2BService

SCRIPT = Path(__file__).with_name("_watch.py").read_text()
#: The watcher's argv before its directory and recursive flag.
COMMAND = ["python3", "-c", SCRIPT]
MAX_WATCHERS = 16
#: The longest event line (a path is at most 4096 bytes, escaped in JSON).
MAX_LINE = 64 * 1024
#: How long one poll of a streamed watcher waits for events (then a keepalive).
POLL_WAIT_MS = 15_000
#: An output offset past any output: stderr is only read when the watcher fails.
_PAST_THE_END = 10**17
_KINDS = {
    "create": "EVENT_TYPE_CREATE",
    "write": "EVENT_TYPE_WRITE",
    "remove": "EVENT_TYPE_REMOVE",
    "rename": "EVENT_TYPE_RENAME",
    "chmod": "EVENT_TYPE_CHMOD",
}


def is_watcher(command: list[str]) -> bool:
    """A process that is a watcher (kept out of ``commands.list``)."""
    return command[:3] == COMMAND


@dataclass
class Watcher:
    """One watcher process, and where its output was read up to."""

    process_id: str
    attached: Attached
    offset: int = 0
    #: The start of a line not complete yet.
    pending: str = ""
    #: Lines read while starting, after its ``ready``.
    queued: list[dict[str, Any]] = field(default_factory=list)


class Watchers:
    """The polling watchers this server created, by (sandbox id, watcher id)."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, str], Watcher] = {}
        #: Streams' watchers being removed after their client went away.
        self.removing: set[asyncio.Task[None]] = set()

    def count(self, sandbox_id: str) -> int:
        return sum(1 for sid, _ in self.open if sid == sandbox_id)

    def close(self) -> None:
        for task in self.removing:
            task.cancel()
        self.open.clear()


def _watchers(request: Request) -> Watchers:
    watchers: Watchers = request.app.state.watchers
    return watchers


async def _poll(service: E2BService, watcher: Watcher, wait_ms: int) -> dict[str, Any]:
    params = {"stdout_from": watcher.offset, "stderr_from": _PAST_THE_END, "wait_ms": wait_ms}
    answer = await call(
        service, watcher.attached, "GET", process_path(watcher.process_id), params=params
    )
    status: dict[str, Any] = answer.json()
    return status


def _lines(watcher: Watcher, status: dict[str, Any]) -> list[dict[str, Any]]:
    """The complete lines the watcher wrote since the last poll, parsed."""
    watcher.offset = int(status["stdout_next"])
    text = str(status.get("stdout") or "")
    if int(status.get("stdout_dropped") or 0):
        # The agent kept only its newest output: what was lost is lost, and
        # the text now starts mid-line.
        text = text.partition("\n")[2]
    else:
        text = watcher.pending + text
    *lines, watcher.pending = text.split("\n")
    if len(watcher.pending) > MAX_LINE:
        raise connect.ConnectError("internal", "the watcher wrote a line too long")
    out = []
    for line in lines:
        try:
            parsed = json.loads(line)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):  # the sandbox's process: hostile output
            raise connect.ConnectError("internal", "the watcher wrote something unexpected")
        out.append(parsed)
    return out


def _events(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        kind, name = _KINDS.get(str(line.get("type"))), line.get("name")
        if kind is not None and isinstance(name, str):
            out.append({"name": name, "type": kind})
    return out


async def _remove(service: E2BService, watcher: Watcher) -> None:
    with contextlib.suppress(connect.ConnectError):
        await call(service, watcher.attached, "DELETE", process_path(watcher.process_id))


async def _start(request: Request, attached: Attached, message: dict[str, Any]) -> Watcher:
    """A running watcher of the message's directory, once its watches are set:
    or the Connect error it gave (no such directory, not a directory, denied)."""
    path = message.get("path")
    if not isinstance(path, str) or not path:
        raise connect.ConnectError("invalid_argument", "path is required")
    if "\0" in path:
        raise connect.ConnectError("invalid_argument", "path must not contain NUL")
    user = user_of(request)
    body = {
        "command": [*COMMAND, in_home(user, path), "1" if message.get("recursive") else "0"],
        "user": user,
        "cwd": "/",
    }
    service = service_of(request)
    try:
        status = (await call(service, attached, "POST", PROCESSES, json=body)).json()
    except connect.ConnectError as exc:
        raise connect.ConnectError(
            exc.code, f"watching needs python3 in the sandbox: {exc.message}"
        ) from None
    watcher = Watcher(process_id=str(status["process_id"]), attached=attached)
    try:
        while True:
            status = await _poll(service, watcher, POLL_WAIT_MS)
            lines = _lines(watcher, status)
            if lines:
                first = lines[0]
                if first.get("ready") is True:
                    watcher.queued = lines[1:]
                    return watcher
                code = str(first.get("error"))
                raise connect.ConnectError(
                    code if code in connect.STATUS else "internal", str(first.get("message"))
                )
            if status["state"] == "exited":
                raise connect.ConnectError("internal", "the watcher ended before it started")
    except BaseException:
        await _remove(service, watcher)
        raise


# -- WatchDir ---------------------------------------------------------------------------
async def watch_dir(request: Request) -> Response:
    attached, _ = await reach(request)
    try:
        message = connect.parse_request(
            await request.body(), request.headers.get("content-type", "")
        )
        watcher = await _start(request, attached, message)
    except connect.ConnectError as exc:
        return stream_error(exc)
    return StreamingResponse(
        _stream(service_of(request), _watchers(request), watcher),
        media_type=connect.STREAM_JSON,
    )


async def _stream(
    service: E2BService, watchers: Watchers, watcher: Watcher
) -> AsyncIterator[bytes]:
    """start, then each event as it comes (a keepalive after a quiet poll)."""
    try:
        yield connect.envelope({"start": {}})
        lines, watcher.queued, exited = watcher.queued, [], False
        while True:
            for event in _events(lines):
                yield connect.envelope({"filesystem": event})
            if exited:  # the directory was removed
                break
            status = await _poll(service, watcher, POLL_WAIT_MS)
            lines, exited = _lines(watcher, status), status["state"] == "exited"
            if not lines and not exited:
                yield connect.envelope({"keepalive": {}})
        yield connect.end_of_stream()
    except connect.ConnectError as exc:
        yield connect.end_of_stream(exc)
    finally:
        # The client may be gone (its timeout, stop()): this generator is being
        # closed, so the watcher is removed by a task of its own.
        task = asyncio.get_running_loop().create_task(_remove(service, watcher))
        watchers.removing.add(task)
        task.add_done_callback(watchers.removing.discard)


# -- the polling watchers --------------------------------------------------------------------
def _sandbox_id(request: Request) -> str:
    return request.headers.get(SANDBOX_ID_HEADER, "")


async def _create(request: Request, attached: Attached, message: dict[str, Any]) -> dict[str, Any]:
    watchers, sandbox_id = _watchers(request), _sandbox_id(request)
    if watchers.count(sandbox_id) >= MAX_WATCHERS:
        raise connect.ConnectError(
            "resource_exhausted", f"at most {MAX_WATCHERS} watchers per sandbox"
        )
    watcher = await _start(request, attached, message)
    watchers.open[(sandbox_id, watcher.process_id)] = watcher
    return {"watcherId": watcher.process_id}


def _find(request: Request, message: dict[str, Any]) -> Watcher:
    watcher_id = message.get("watcherId")
    if not isinstance(watcher_id, str) or not watcher_id:
        raise connect.ConnectError("invalid_argument", "watcherId is required")
    watcher = _watchers(request).open.get((_sandbox_id(request), watcher_id))
    if watcher is None:
        raise connect.ConnectError("not_found", f"watcher {watcher_id!r} not found")
    return watcher


async def _get_events(request: Request, _: Attached, message: dict[str, Any]) -> dict[str, Any]:
    watcher = _find(request, message)
    status = await _poll(service_of(request), watcher, 0)
    lines, watcher.queued = watcher.queued + _lines(watcher, status), []
    return {"events": _events(lines)}


async def _remove_rpc(request: Request, _: Attached, message: dict[str, Any]) -> dict[str, Any]:
    watcher = _find(request, message)
    _watchers(request).open.pop((_sandbox_id(request), watcher.process_id), None)
    await _remove(service_of(request), watcher)
    return {}


create_watcher = unary(_create)
get_watcher_events = unary(_get_events)
remove_watcher = unary(_remove_rpc)
