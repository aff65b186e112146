"""envd's process service on the agent's spawned processes (``/v1/processes``).

A command E2B starts is a spawned process, so it outlives the request that
started it, as in envd: ``Start`` streams it until it ends, and a client that
goes away (``background=True`` then ``disconnect``, or a dropped connection)
leaves it running until its timeout (``Connect-Timeout-Ms``, 60 s by the SDK's
default) kills it. ``Connect`` follows it again; ``List``, ``SendInput``,
``StreamInput``, ``CloseStdin`` and ``SendSignal`` act on it by pid or tag.

E2B's pid is a uint32; podbay's process id is 10 hex digits, so the pid is
its first 8 (``pid_of``) and a pid is resolved by listing the sandbox's
processes: nothing to keep, and any replica resolves it. What envd reports
that the agent does not keep (the tag, the env vars, the cwd) is held in this
process's memory (``Registry``); a process podbay's own API started lists with
its argv only.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from podbay.control.services.sandboxes import Attached
from podbay.wire.paths import PROCESSES, process_path, process_signal_path, process_stdin_path

from . import connect, pty, watchers
from .relay import (
    SANDBOX_ID_HEADER,
    call,
    home_of,
    reach,
    service_of,
    stream_error,
    unary,
    user_of,
)
from .service import E2BService

#: The longest one poll of a process waits for output (the agent's cap is 20 s).
POLL_WAIT_MS = 15_000
#: An output offset past any output (the agent takes up to 18 digits): its answer
#: is where the output ends now.
_PAST_THE_END = 10**17
_SIGNALS = {"SIGNAL_SIGKILL": "KILL", "SIGNAL_SIGTERM": "TERM", 9: "KILL", 15: "TERM"}


def pid_of(process_id: str) -> int:
    return int(process_id[:8], 16)


@dataclass
class Started:
    """What envd reports of a process that the agent does not keep."""

    tag: str | None
    cmd: str
    args: list[str]
    envs: dict[str, str]
    cwd: str | None
    followers: int = 0
    killer: asyncio.Task[None] | None = field(default=None, repr=False)


class Registry:
    """The processes this server started, by (sandbox id, process id)."""

    def __init__(self) -> None:
        self.started: dict[tuple[str, str], Started] = {}
        #: Agent-side forgets still under way (kept so they are not collected).
        self.cleanups: set[asyncio.Task[None]] = set()

    def unfollowed(self, sandbox_id: str) -> bool:
        """Whether a process of this sandbox started here has nobody following it
        (so a finished one may be left in the agent's slots)."""
        return any(
            sid == sandbox_id and meta.followers == 0 for (sid, _), meta in self.started.items()
        )

    def forget_later(self, service: E2BService, attached: Attached, key: tuple[str, str]) -> None:
        """Forget the process here now and in the agent after the caller's answer
        is complete: the DELETE is not on the command's round trips."""
        self.forget(*key)
        task = asyncio.get_running_loop().create_task(_forget_in_agent(service, attached, key[1]))
        self.cleanups.add(task)
        task.add_done_callback(self.cleanups.discard)

    def find_tag(self, sandbox_id: str, tag: str) -> str | None:
        for (sid, process_id), meta in self.started.items():
            if sid == sandbox_id and meta.tag == tag:
                return process_id
        return None

    def forget(self, sandbox_id: str, process_id: str) -> None:
        meta = self.started.pop((sandbox_id, process_id), None)
        if meta is not None and meta.killer is not None:
            meta.killer.cancel()

    def close(self) -> None:
        for key in list(self.started):
            self.forget(*key)


def _registry(request: Request) -> Registry:
    registry: Registry = request.app.state.processes
    return registry


def _sandbox_id(request: Request) -> str:
    return request.headers.get(SANDBOX_ID_HEADER, "")


def _terminal(request: Request, message: dict[str, Any]) -> pty.Terminal | None:
    """The terminal (``sandbox.pty``) a message's selector names, if any."""
    return pty.terminals_of(request).get(_sandbox_id(request), message.get("process"))


# -- talking to the agent ---------------------------------------------------------
async def _poll(
    service: E2BService,
    attached: Attached,
    process_id: str,
    offsets: tuple[int, int] = (_PAST_THE_END, _PAST_THE_END),
) -> dict[str, Any]:
    """The process's status and its output past ``offsets`` (base64), once
    there is some, it exited, or ``POLL_WAIT_MS`` passed."""
    params = {"stdout_from": offsets[0], "stderr_from": offsets[1], "wait_ms": POLL_WAIT_MS}
    answer = await call(
        service, attached, "GET", process_path(process_id), params={**params, "encoding": "base64"}
    )
    status: dict[str, Any] = answer.json()
    return status


async def _processes(service: E2BService, attached: Attached) -> list[dict[str, Any]]:
    answer = await call(service, attached, "GET", PROCESSES)
    listed: list[dict[str, Any]] = answer.json()["processes"]
    return listed


async def _resolve(request: Request, attached: Attached, message: dict[str, Any]) -> str:
    """The process id a ``ProcessSelector`` (pid or tag) names; not_found if none runs."""
    selector = message.get("process")
    if not isinstance(selector, dict):
        raise connect.ConnectError("invalid_argument", "process (a pid or a tag) is required")
    pid, tag = selector.get("pid"), selector.get("tag")
    if isinstance(tag, str):
        found = _registry(request).find_tag(_sandbox_id(request), tag)
        if found is None:
            raise connect.ConnectError("not_found", f"process with tag {tag!r} not found")
        return found
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise connect.ConnectError("invalid_argument", "process.pid must be a number")
    for status in await _processes(service_of(request), attached):
        if pid_of(status["process_id"]) == pid and status["state"] == "running":
            return str(status["process_id"])
    raise connect.ConnectError("not_found", f"process with pid {pid} not found")


# -- Start and Connect: a process's events until it ends ------------------------------
def _event(event: dict[str, Any]) -> bytes:
    return connect.envelope({"event": event})


async def _follow(
    service: E2BService,
    registry: Registry,
    sandbox_id: str,
    attached: Attached,
    process_id: str,
    offsets: tuple[int, int],
) -> AsyncIterator[bytes]:
    """start, then the output past ``offsets`` as it is written, then end; the
    process is forgotten by the agent once its end is delivered."""
    meta = registry.started.get((sandbox_id, process_id))
    if meta is not None:
        meta.followers += 1
    stdout_from, stderr_from = offsets
    try:
        yield _event({"start": {"pid": pid_of(process_id)}})
        while True:
            status = await _poll(service, attached, process_id, (stdout_from, stderr_from))
            # proto3 JSON carries bytes as base64: the agent's base64 passes through.
            for stream in ("stdout", "stderr"):
                if status.get(stream):
                    yield _event({"data": {stream: status[stream]}})
            stdout_from, stderr_from = status["stdout_next"], status["stderr_next"]
            if status["state"] == "exited":
                code = int(status["exit_code"])
                yield _event(
                    {"end": {"exitCode": code, "exited": True, "status": f"exit status {code}"}}
                )
                break
        if meta is None or meta.followers == 1:  # the last to follow it forgets it
            registry.forget_later(service, attached, (sandbox_id, process_id))
        yield connect.end_of_stream()
    except connect.ConnectError as exc:
        yield connect.end_of_stream(exc)
    finally:
        if meta is not None:
            meta.followers -= 1


def _spawn_body(
    message: dict[str, Any], env_vars: dict[str, str], request: Request
) -> tuple[dict[str, Any], Started]:
    process = message.get("process")
    if not isinstance(process, dict) or not isinstance(process.get("cmd"), str):
        raise connect.ConnectError("invalid_argument", "process.cmd is required")
    args = process.get("args") or []
    envs = process.get("envs") or {}
    cwd = process.get("cwd") or None
    tag = message.get("tag")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise connect.ConnectError("invalid_argument", "process.args must be strings")
    if not isinstance(envs, dict) or not all(isinstance(v, str) for v in envs.values()):
        raise connect.ConnectError("invalid_argument", "process.envs must be strings")
    if cwd is not None and not isinstance(cwd, str):
        raise connect.ConnectError("invalid_argument", "process.cwd must be a string")
    if tag is not None and not isinstance(tag, str):
        raise connect.ConnectError("invalid_argument", "tag must be a string")
    body: dict[str, Any] = {
        "command": [process["cmd"], *args],
        "env": {**env_vars, **envs},
        "stdin": bool(message.get("stdin")),
    }
    user = user_of(request)
    body["user"] = user
    if cwd or home_of(user):
        body["cwd"] = cwd or home_of(user)
    return body, Started(tag=tag, cmd=process["cmd"], args=args, envs=envs, cwd=cwd)


async def _kill_at(
    service: E2BService, attached: Attached, process_id: str, seconds: float
) -> None:
    """envd kills a command at its timeout whether or not anyone follows it."""
    await asyncio.sleep(seconds)
    with contextlib.suppress(connect.ConnectError):
        await call(
            service, attached, "POST", process_signal_path(process_id), json={"signal": "KILL"}
        )


async def _forget_in_agent(service: E2BService, attached: Attached, process_id: str) -> None:
    with contextlib.suppress(connect.ConnectError):
        await call(service, attached, "DELETE", process_path(process_id))


async def _prune(
    service: E2BService, registry: Registry, sandbox_id: str, attached: Attached
) -> None:
    """Forget this server's exited processes that nobody follows, so finished
    background commands do not fill the agent's 64 slots."""
    for status in await _processes(service, attached):
        key = (sandbox_id, str(status["process_id"]))
        meta = registry.started.get(key)
        if status["state"] == "exited" and meta is not None and meta.followers == 0:
            with contextlib.suppress(connect.ConnectError):
                await call(service, attached, "DELETE", process_path(key[1]))
            registry.forget(*key)


async def start(request: Request) -> Response:
    # Refusals before the stream (credentials, no such sandbox) are plain HTTP
    # answers, as E2B's proxy in front of envd gives them.
    attached, env_vars = await reach(request)
    service, registry, sandbox_id = service_of(request), _registry(request), _sandbox_id(request)
    try:
        message = connect.parse_request(
            await request.body(), request.headers.get("content-type", "")
        )
        body, meta = _spawn_body(message, env_vars, request)
        if message.get("pty"):
            return await pty.start(request, attached, env_vars, message)
        if registry.unfollowed(sandbox_id):  # else there is nothing to prune: no listing
            await _prune(service, registry, sandbox_id, attached)
        status = (await call(service, attached, "POST", PROCESSES, json=body)).json()
    except connect.ConnectError as exc:
        return stream_error(exc)
    process_id = str(status["process_id"])
    deadline = connect.timeout_ms(request.headers.get("connect-timeout-ms"))
    if deadline is not None:
        meta.killer = asyncio.get_running_loop().create_task(
            _kill_at(service, attached, process_id, deadline / 1000)
        )
    registry.started[(sandbox_id, process_id)] = meta
    return StreamingResponse(
        _follow(service, registry, sandbox_id, attached, process_id, (0, 0)),
        media_type=connect.STREAM_JSON,
    )


async def connect_rpc(request: Request) -> Response:
    """Follow a running process from now on (envd does not replay output)."""
    attached, _ = await reach(request)
    service = service_of(request)
    try:
        message = connect.parse_request(
            await request.body(), request.headers.get("content-type", "")
        )
        terminal = _terminal(request, message)
        if terminal is not None:
            return pty.connect_rpc(request, terminal)
        process_id = await _resolve(request, attached, message)
        now = (
            await call(
                service,
                attached,
                "GET",
                process_path(process_id),
                params={"stdout_from": _PAST_THE_END, "stderr_from": _PAST_THE_END},
            )
        ).json()
    except connect.ConnectError as exc:
        return stream_error(exc)
    offsets = (int(now["stdout_next"]), int(now["stderr_next"]))
    return StreamingResponse(
        _follow(service, _registry(request), _sandbox_id(request), attached, process_id, offsets),
        media_type=connect.STREAM_JSON,
    )


# -- the unary RPCs ------------------------------------------------------------------
async def _list(request: Request, attached: Attached, _: dict[str, Any]) -> dict[str, Any]:
    registry, sandbox_id = _registry(request), _sandbox_id(request)
    out = []
    for status in await _processes(service_of(request), attached):
        if status["state"] != "running" or watchers.is_watcher(status["command"]):
            continue
        meta = registry.started.get((sandbox_id, str(status["process_id"])))
        command = [str(c) for c in status["command"]]
        info: dict[str, Any] = {"pid": pid_of(status["process_id"])}
        if meta is None:
            info["config"] = {"cmd": command[0], "args": command[1:]}
        else:
            info["config"] = {"cmd": meta.cmd, "args": meta.args, "envs": meta.envs}
            if meta.cwd:
                info["config"]["cwd"] = meta.cwd
            if meta.tag is not None:
                info["tag"] = meta.tag
        out.append(info)
    out.extend(pty.listed(t) for t in pty.terminals_of(request).of(sandbox_id))
    return {"processes": out}


async def _send_signal(
    request: Request, attached: Attached, message: dict[str, Any]
) -> dict[str, Any]:
    signal = _SIGNALS.get(message.get("signal"))
    if signal is None:
        raise connect.ConnectError("invalid_argument", "signal must be SIGKILL or SIGTERM")
    terminal = _terminal(request, message)
    if terminal is not None:  # a terminal is hung up: its command is killed
        await terminal.hang_up()
        return {}
    process_id = await _resolve(request, attached, message)
    await call(
        service_of(request),
        attached,
        "POST",
        process_signal_path(process_id),
        json={"signal": signal},
    )
    if signal == "KILL":
        await _until_exited(service_of(request), attached, process_id)
    return {}


async def _until_exited(service: E2BService, attached: Attached, process_id: str) -> None:
    """SIGKILL's answer comes once the process is gone, so a ``kill`` that
    follows it, or ``list``, sees it ended (the agent reaps it at once)."""
    while True:
        try:
            status = await _poll(service, attached, process_id)
        except connect.ConnectError as exc:
            if exc.code == "not_found":  # its follower saw the end and forgot it
                return
            raise
        if status["state"] == "exited":
            return


def _stdin_bytes(value: Any) -> bytes:
    if not isinstance(value, dict):
        raise connect.ConnectError("invalid_argument", "input is required")
    if "pty" in value:
        raise connect.ConnectError("invalid_argument", "input.pty is for a PTY's input")
    try:
        return base64.b64decode(value.get("stdin") or "", validate=True)
    except (binascii.Error, TypeError):
        raise connect.ConnectError("invalid_argument", "input.stdin must be base64") from None


async def _write_stdin(
    request: Request, attached: Attached, process_id: str, data: bytes, *, close: bool = False
) -> None:
    await call(
        service_of(request),
        attached,
        "POST",
        process_stdin_path(process_id),
        content=data,
        params={"close": "true"} if close else None,
    )


async def _send_input(
    request: Request, attached: Attached, message: dict[str, Any]
) -> dict[str, Any]:
    terminal = _terminal(request, message)
    if terminal is not None:
        await pty.write(terminal, message.get("input"))
        return {}
    data = _stdin_bytes(message.get("input"))
    await _write_stdin(request, attached, await _resolve(request, attached, message), data)
    return {}


async def _close_stdin(
    request: Request, attached: Attached, message: dict[str, Any]
) -> dict[str, Any]:
    if _terminal(request, message) is not None:
        raise connect.ConnectError("failed_precondition", "a PTY has no stdin to close")
    process_id = await _resolve(request, attached, message)
    await _write_stdin(request, attached, process_id, b"", close=True)
    return {}


async def _update(request: Request, attached: Attached, message: dict[str, Any]) -> dict[str, Any]:
    """``Update``: a PTY's new size (``pty.size``)."""
    terminal = _terminal(request, message)
    if terminal is None:
        await _resolve(request, attached, message)  # not_found, or a command without a PTY
        raise connect.ConnectError("failed_precondition", "the process has no PTY to resize")
    await pty.resize(terminal, message)
    return {}


# -- StreamInput: a client stream -----------------------------------------------------
async def _messages(request: Request) -> AsyncIterator[dict[str, Any]]:
    """The envelopes of a client-streaming request body, as they arrive."""
    buffer = b""
    async for chunk in request.stream():
        buffer += chunk
        while len(buffer) >= 5:
            length = int.from_bytes(buffer[1:5], "big")
            if len(buffer) < 5 + length:
                break
            frame, buffer = buffer[: 5 + length], buffer[5 + length :]
            if frame[0] & connect.FLAG_END:
                return
            yield connect.parse_request(frame, connect.STREAM_JSON)
    if buffer:
        raise connect.ConnectError("invalid_argument", "the request stream ended mid-envelope")


async def stream_input(request: Request) -> Response:
    attached, _ = await reach(request)
    if not request.headers.get("content-type", "").startswith(connect.STREAM_JSON):
        return stream_error(connect.ConnectError("unimplemented", "only JSON is served"))
    try:
        process_id: str | None = None
        terminal: pty.Terminal | None = None
        async for message in _messages(request):
            if "start" in message:
                terminal = _terminal(request, message["start"] or {})
                if terminal is None:
                    process_id = await _resolve(request, attached, message["start"] or {})
            elif "data" in message:
                value = (message["data"] or {}).get("input")
                if terminal is not None:
                    await pty.write(terminal, value)
                    continue
                if process_id is None:
                    raise connect.ConnectError("failed_precondition", "start must come first")
                await _write_stdin(request, attached, process_id, _stdin_bytes(value))
    except connect.ConnectError as exc:
        return stream_error(exc)
    return Response(connect.envelope({}) + connect.end_of_stream(), media_type=connect.STREAM_JSON)


list_rpc = unary(_list)
send_signal = unary(_send_signal)
send_input = unary(_send_input)
close_stdin = unary(_close_stdin)
update = unary(_update)
