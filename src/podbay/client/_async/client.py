"""AsyncSandboxClient: every method of the reference client, awaitable.

Written once, async: ``scripts/unasync.py`` generates the sync face
(``_sync/client.py``) from ``_async/client.py``, and a test fails when the
generated file is stale. All decisions (what to send, how to read the answer, which
refusal means "re-attach") live in the sans-I/O :mod:`podbay.client._core`;
this class only sends, sleeps and streams.

>>> import asyncio
>>> from podbay import AsyncSandboxClient
>>> async def main():
...     async with AsyncSandboxClient() as sandboxes:
...         result = await sandboxes.exec("thread-42", ["python3", "-c", "print(2 + 2)"])
...         return result.stdout
>>> asyncio.run(main())  # doctest: +SKIP
'4\\n'
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import io
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, BinaryIO

import httpx

from podbay.errors import (
    PodbayError,
    SandboxPreparingError,
    SandboxRequestError,
    SandboxUnavailableError,
    refusal_error,
)
from podbay.wire import paths
from podbay.wire.codec import dumps, loads
from podbay.wire.codec import encode as codec_encode
from podbay.wire.codes import ErrorCode
from podbay.wire.control import (
    EgressAudit,
    ForkResult,
    NetworkPolicy,
    Preparing,
    SandboxHandle,
    SandboxRecord,
    Volume,
    VolumeEntry,
    VolumeMount,
)
from podbay.wire.data import (
    ChmodRequest,
    DirListing,
    ExecEvent,
    ExecResult,
    FileInfo,
    KeepPart,
    MakeDirRequest,
    MoveRequest,
    ProcessOutput,
    ProcessStatus,
)
from podbay.wire.limits import BASE64_WRITE_CHUNK, POLL_WAIT_MAX_MS
from podbay.wire.observe import CommandList, EventList, Metrics

from .. import _files, _interpreter
from .._core import (
    DEFAULT_PREPARE_TIMEOUT_SECONDS,
    DEFAULT_TIMEOUT_SECONDS,
    Core,
    FilesMode,
    for_the_sandbox,
    resolve_config,
    unavailable,
)
from .._interpreter import Execution
from .._models import BytesResult, Cancel, CombinedResult, DirEntry, GrepMatch, Progress, RunResult
from .._options import LISTENING_COMMAND, AttachOptions, parse_listening
from .._run import RunAccumulator
from .._transport import default_async_transport
from ._backend import ByteStream, EventStream, Lock, run_sync, shielded, sleep, ws_connect

if TYPE_CHECKING:
    from ._backend import WebSocket

#: Largest WebSocket message a terminal accepts (the gateway's own bound).
TERMINAL_MESSAGE_LIMIT = 1024 * 1024

#: What ``stdin`` may be: text (sent as UTF-8), bytes, or a binary file object
#: read in chunks as it is sent (never held whole).
Stdin = str | bytes | BinaryIO
#: Stdin is sent in chunks this big.
STDIN_CHUNK = 1024 * 1024

OnOutput = Callable[[ProcessOutput], object]


class AsyncSandboxClient:
    """Sandboxes by name: commands, processes and files, plus the control plane.

    With no arguments it reads ``ASTRO_AUTHZ_TOKEN`` and takes the server URL
    from the token's ``iss`` claim (read without verification; the server
    verifies it). ``transport`` is any ``httpx.AsyncBaseTransport``, e.g.
    ``httpx.MockTransport`` in tests. ``files="base64"`` forces the
    reference's exec+base64 file path even where the agent offers native files.

    Handles are attached on first use, cached per name and renewed a minute
    before they expire; a data-plane 401/403 re-attaches once and repeats the
    call. A transport failure is never retried: :class:`SandboxUnavailableError`.
    """

    # Methods spell out their parameters whole, one by one, on purpose: each is
    # public API a reader, help() and a type checker see entire, so many begin
    # alike (name, path, then keyword options). The generated sync twin repeats
    # all of this file by design (scripts/unasync.py).

    def __init__(
        self,
        *,
        identity_token: str | None = None,
        server_url: str | None = None,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        prepare_timeout_seconds: float = DEFAULT_PREPARE_TIMEOUT_SECONDS,
        transport: httpx.AsyncBaseTransport | None = None,
        files: FilesMode = "auto",
        on_preparing: Callable[[Preparing], None] | None = None,
    ) -> None:
        #: Called with each 202's body while an attach waits for the declared
        #: environment (``progress``: the build's step, where the server says).
        self._on_preparing = on_preparing
        config = resolve_config(
            identity_token, server_url, timeout_seconds, prepare_timeout_seconds, files
        )
        self._core = Core(config)
        #: Also what :meth:`port_transport` sends through.
        self._transport = transport or default_async_transport()
        self._http = httpx.AsyncClient(
            transport=self._transport,
            timeout=httpx.Timeout(config.timeout_seconds),
            follow_redirects=False,
        )
        self._locks: dict[str, Lock] = {}
        self._interpreters: dict[str, AsyncCodeInterpreter] = {}

    @property
    def server_url(self) -> str:
        return self._core.config.server_url

    def sandbox(self, name: str) -> AsyncSandbox:
        """A handle object bound to ``name``; no I/O until a method is called.

        >>> async with client.sandbox("thread-42") as sb:  # doctest: +SKIP
        ...     await sb.exec(["ls"])
        """
        return AsyncSandbox(self, name)

    async def aclose(self) -> None:
        """Close the transport (and its connections)."""
        for interpreter in self._interpreters.values():
            await interpreter.aclose()
        await self._http.aclose()

    async def __aenter__(self) -> AsyncSandboxClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- sending ------------------------------------------------------------------

    async def _send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        try:
            return await self._http.send(request, stream=stream)
        except httpx.TransportError as exc:
            raise unavailable(request, exc) from exc

    # Its parameters are Core.data_request's on purpose: this does the I/O
    # (re-attach, retry) around the request that one builds.
    async def _data(
        self,
        name: str,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str | int] | None = None,
        headers: Mapping[str, str] | None = None,
        body: Callable[[], Any] | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        """One data-plane call; a 401/403 re-attaches ONCE and repeats it.

        Those refusals come before anything runs, so repeating is safe; a
        transport failure is not (the command may have run) and propagates.
        ``body`` makes a fresh request body for each attempt.
        """
        handle = await self._handle(name)
        for attempt in (1, 2):
            request = self._core.data_request(
                handle,
                method,
                path,
                json=json,
                params=params,
                headers=headers,
                content=body() if body else None,
            )
            response = await self._send(request, stream=stream)
            if attempt == 1 and self._core.is_credential_refusal(response):
                await response.aclose()
                handle = await self._handle(name, stale=handle)
                continue
            if attempt == 1 and response.status_code == 503:
                await self._read(response)
                if self._core.is_restart_refusal(response):
                    handle = await self._handle(name, stale=handle)
                    continue
            if stream and response.status_code >= 300:
                await self._read(response)
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    async def _read(self, response: httpx.Response) -> None:
        try:
            await response.aread()
        except httpx.TransportError as exc:
            raise unavailable(response.request, exc) from exc

    async def _control(self, request: httpx.Request) -> httpx.Response:
        response = await self._send(request)
        self._core.server_answered = True
        return response

    # -- attach and handles ---------------------------------------------------------

    async def attach(
        self,
        name: str,
        sandbox_class: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        cpus: float | None = None,
        memory_mib: int | None = None,
        idle_timeout_seconds: int | None = None,
        network: NetworkPolicy | None = None,
        volumes: Mapping[str, str | VolumeMount] | None = None,
    ) -> SandboxHandle:
        """Create, resume or reuse the sandbox ``name`` and return its handle.

        Beyond the reference, a new sandbox may get ``labels`` (shown in its
        record, matched by ``list(labels=...)``), ``env`` (variables for every
        command; a call's own ``env`` wins), ``cpus``, ``memory_mib`` and an
        ``idle_timeout_seconds``, each within the server's bounds, and a
        ``network`` egress policy (instead of the deployment's; see
        :meth:`set_network`), and ``volumes`` of the deployment to mount
        (``{"/data": "name"}``, or ``VolumeMount(name=..., read_only=True)``;
        see :meth:`create_volume`). They apply at
        creation: an existing sandbox created with others is refused
        (``SANDBOX_OPTIONS_CONFLICT``); one attached without them is reused.

        Optional: ``exec``, ``run``, ``spawn`` and the file methods attach on
        first use. While the declared environment is being prepared the server
        answers 202; the client waits ``Retry-After`` (default 5 s) and asks
        again until ``prepare_timeout_seconds``, then raises
        :class:`SandboxPreparingError`. Each 202 goes to the client's
        ``on_preparing`` callback, if given: a :class:`Preparing` whose
        ``progress`` (a :class:`BuildStep`, or None) is the build's current step.

        >>> handle = await client.attach("thread-42")  # doctest: +SKIP
        >>> handle.state, handle.start  # doctest: +SKIP
        ('running', 'created')
        """
        options = AttachOptions(
            labels=labels,
            env=env,
            cpus=cpus,
            memory_mib=memory_mib,
            idle_timeout_seconds=idle_timeout_seconds,
            network=network,
            volumes=volumes,
        )
        async with self._lock(name):
            return await self._attach(name, sandbox_class, options)

    async def _attach(
        self,
        name: str,
        sandbox_class: str | None = None,
        options: AttachOptions | None = None,
    ) -> SandboxHandle:
        deadline = time.monotonic() + self._core.config.prepare_timeout_seconds
        # A server restarting refuses connections (waited out for a bounded
        # restart_deadline), then answers 503 with Retry-After while it starts
        # or checks a class: attach (idempotent) waits that out too.
        restart_deadline = time.monotonic() + self._core.restart_wait_seconds()
        pause = 0.1
        while True:
            try:
                response = await self._control(
                    self._core.attach_request(name, sandbox_class, options)
                )
            except SandboxUnavailableError as exc:
                if not self._core.never_connected(exc) or time.monotonic() > restart_deadline:
                    raise
                await sleep(pause)
                pause = min(1.0, pause * 2)
                continue
            if self._core.is_restarting(response):
                # The server answered: it is there, starting or checking the
                # class asked for, and says when to ask again. Wait as for a
                # 202, within the same bound (prepare_timeout_seconds).
                wait = max(0.1, self._core.retry_after(response))
                if time.monotonic() + wait <= deadline:
                    await sleep(wait)
                    continue
            if response.status_code == 202:
                wait = self._core.retry_after(response)
                if self._on_preparing is not None:
                    self._on_preparing(self._core.parse_preparing(name, response))
                if time.monotonic() + wait > deadline:
                    raise SandboxPreparingError(
                        f"sandbox {name!r} is still being prepared after "
                        f"{self._core.config.prepare_timeout_seconds:g} s; retry in {wait:g} s",
                        wait,
                    )
                await sleep(wait)
                continue
            handle = self._core.parse_handle(response)
            self._core.store(name, handle)
            return handle

    def _lock(self, name: str) -> Lock:
        lock = self._locks.get(name)
        if lock is None:  # setdefault: two threads racing here still share one lock
            lock = self._locks.setdefault(name, Lock())
        return lock

    async def _handle(self, name: str, *, stale: SandboxHandle | None = None) -> SandboxHandle:
        """The cached handle, or a fresh one; ``stale`` is a handle that was just refused."""
        handle = self._core.cached(name)
        if handle is not None and handle is not stale:
            return handle
        async with self._lock(name):
            handle = self._core.cached(name)  # another caller may have renewed it
            if handle is not None and handle is not stale:
                return handle
            return await self._attach(name)

    # -- commands --------------------------------------------------------------------
    # exec, exec_bytes, stream, run and spawn spell out the same command
    # parameters on purpose: each is public API whose whole signature a reader,
    # help() and a type checker see; what they share lives in Core.exec_body.

    async def exec(
        self,
        name: str,
        command: builtins.list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_ms: int | None = None,
        user: str | None = None,
        stdin: Stdin | None = None,
        max_output_bytes: int | None = None,
        keep: KeepPart | None = None,
    ) -> ExecResult:
        """Run argv to completion and return its exit code and output (1 MiB per stream).

        The deadline sent is ``timeout_ms`` bounded to one second under
        ``timeout_seconds``, so a command never outlives the request waiting
        for it. A non-zero ``exit_code`` is a result, not an exception.

        Beyond the reference (where the agent offers them): ``user`` runs it
        as that account of the sandbox; ``stdin`` (text, bytes or a binary
        file) is streamed to the command; ``max_output_bytes`` (up to 16 MiB)
        and ``keep`` (``"head"``, ``"tail"``, ``"head_tail"``) say what an
        over-cap stream keeps, and the result then counts ``stdout_dropped``.

        >>> r = await client.exec("thread-42", ["python3", "-c", "print(2 + 2)"])  # doctest: +SKIP
        >>> r.exit_code, r.stdout  # doctest: +SKIP
        (0, '4\\n')
        >>> r = await client.exec("thread-42", ["wc", "-c"], stdin=b"abc")  # doctest: +SKIP
        """
        # Keyword arguments passed by like names: alike in shape to the CLI's
        # shell call by coincidence only.
        body = self._core.exec_body(
            command,
            cwd=cwd,
            env=env,
            timeout_ms=timeout_ms,
            user=user,
            max_output_bytes=max_output_bytes,
            keep=keep,
        )
        return self._core.parse_exec(await self._exec(name, body, stdin))

    async def exec_bytes(
        self,
        name: str,
        command: builtins.list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_ms: int | None = None,
        user: str | None = None,
        stdin: Stdin | None = None,
        max_output_bytes: int | None = None,
        keep: KeepPart | None = None,
    ) -> BytesResult:
        """:meth:`exec` with stdout and stderr as raw bytes (base64 on the wire).

        >>> r = await client.exec_bytes("thread-42", ["cat", "/bin/true"])  # doctest: +SKIP
        >>> r.stdout[:4]  # doctest: +SKIP
        b'\\x7fELF'
        """
        await self._require(name, paths.FEATURE_EXEC_OUTPUT, "bytes output")
        body = self._core.exec_body(
            command,
            cwd=cwd,
            env=env,
            timeout_ms=timeout_ms,
            user=user,
            output_encoding="base64",
            max_output_bytes=max_output_bytes,
            keep=keep,
        )
        result = self._core.parse_exec(await self._exec(name, body, stdin))
        return BytesResult(
            exit_code=result.exit_code,
            stdout=base64.b64decode(result.stdout),
            stderr=base64.b64decode(result.stderr),
            duration_ms=result.duration_ms,
            timed_out=result.timed_out,
            truncated=result.truncated,
            stdout_dropped=result.stdout_dropped or 0,
            stderr_dropped=result.stderr_dropped or 0,
        )

    async def stream(
        self,
        name: str,
        command: builtins.list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_ms: int | None = None,
        user: str | None = None,
        stdin: Stdin | None = None,
    ) -> EventStream:
        """Run argv and yield its output as it is written: :class:`ExecEvent`
        items with ``stdout`` or ``stderr`` text, the last one with ``result``
        (exit code, duration; ``timed_out``). Leaving the loop early (or the
        connection dropping) kills the command's whole tree.

        >>> async for ev in client.stream("thread-42", ["make"]):  # doctest: +SKIP
        ...     print(ev.stdout or ev.stderr or ev.result, end="")
        """
        await self._require(name, paths.FEATURE_LIVE_OUTPUT, "streamed output")
        body = self._core.exec_body(command, cwd=cwd, env=env, timeout_ms=timeout_ms, user=user)
        response = await self._exec(name, body, stdin, stream=True)
        if response.status_code != 200:
            raise self._core.refusal(response)
        try:
            async for line in response.aiter_lines():
                if line:
                    yield loads(ExecEvent, line, strict=False)
        except httpx.TransportError as exc:
            raise unavailable(response.request, exc) from exc
        finally:
            await response.aclose()

    async def _exec(
        self, name: str, body: dict[str, Any], stdin: Stdin | None, *, stream: bool = False
    ) -> httpx.Response:
        """POST the exec: plain JSON, or the request line then ``stdin`` streamed."""
        headers = {"Accept": paths.EXEC_STREAM_CONTENT_TYPE} if stream else None
        if stdin is None:
            return await self._data(
                name, "POST", paths.EXEC, json=body, headers=headers, stream=stream
            )
        await self._require(name, paths.FEATURE_STDIN, "stdin")
        source = (
            io.BytesIO(stdin.encode() if isinstance(stdin, str) else stdin)
            if isinstance(stdin, str | bytes | bytearray)
            else stdin
        )
        head = dumps(body) + b"\n"
        start = _position(source)
        sent = False

        def make_body() -> ByteStream:
            nonlocal sent
            if sent:
                if start is None:
                    raise SandboxRequestError(
                        409,
                        "stdin was already read in part and cannot be sent again "
                        "after a re-attach; retry the call",
                        "STDIN_NOT_REPEATABLE",
                    )
                source.seek(start)
            sent = True
            return _stdin_chunks(head, source)

        all_headers = {"Content-Type": paths.EXEC_STDIN_CONTENT_TYPE, **(headers or {})}
        return await self._data(
            name, "POST", paths.EXEC, headers=all_headers, body=make_body, stream=stream
        )

    async def _features(self, name: str) -> frozenset[str]:
        """What the sandbox's agent offers beyond the reference (asked once per handle)."""
        await self._handle(name)
        features = self._core.features(name)
        if features is None:
            features = self._core.parse_features(await self._data(name, "GET", paths.INFO))
            self._core.store_features(name, features)
        return features

    async def _require(self, name: str, feature: str, what: str) -> None:
        await self._features(name)
        self._core.require(name, feature, what)

    async def exec_combined(
        self, name: str, command: str, timeout_ms: int | None = None
    ) -> CombinedResult:
        """Run a SHELL LINE with stderr folded into stdout, interleaved as a terminal shows it.

        >>> r = await client.exec_combined("thread-42", "echo out; echo err >&2")  # doctest: +SKIP
        >>> r.output  # doctest: +SKIP
        'out\\nerr\\n'
        """
        result = await self.exec(name, _files.combined_command(command), timeout_ms=timeout_ms)
        return _files.combined_result(result)

    async def spawn(
        self,
        name: str,
        command: builtins.list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        user: str | None = None,
    ) -> ProcessStatus:
        """Start argv and return at once; read its output with :meth:`poll`.

        ``stdin=True`` gives it a pipe to write with :meth:`write_stdin` (else
        it reads ``/dev/null``); ``user`` runs it as that account.

        >>> proc = await client.spawn("thread-42", ["sleep", "60"])  # doctest: +SKIP
        >>> proc.state  # doctest: +SKIP
        'running'
        """
        if stdin:
            await self._require(name, paths.FEATURE_STDIN, "stdin")
        body = self._core.spawn_body(command, cwd=cwd, env=env, stdin=stdin, user=user)
        return self._core.parse_status(await self._data(name, "POST", paths.PROCESSES, json=body))

    async def write_stdin(
        self, name: str, process_id: str, data: Stdin, *, close: bool = False
    ) -> None:
        """Write ``data`` (text, bytes or a binary file, streamed) to the stdin of a
        process spawned with ``stdin=True``; ``close`` then closes it (EOF). Call
        as often as needed; writes block while the process does not read.

        >>> p = await client.spawn("thread-42", ["cat"], stdin=True)  # doctest: +SKIP
        >>> await client.write_stdin("thread-42", p.process_id, "hi", close=True)  # doctest: +SKIP
        """
        await self._require(name, paths.FEATURE_STDIN, "stdin")
        source = (
            io.BytesIO(data.encode() if isinstance(data, str) else data)
            if isinstance(data, str | bytes | bytearray)
            else data
        )
        start = _position(source)

        def make_body() -> ByteStream:
            if start is not None:
                source.seek(start)
            return _stdin_chunks(b"", source)

        response = await self._data(
            name,
            "POST",
            paths.process_stdin_path(process_id),
            params={"close": "true"} if close else None,
            headers={"Content-Type": "application/octet-stream"},
            body=make_body,
        )
        self._core.check(response, 200, 204)

    async def close_stdin(self, name: str, process_id: str) -> None:
        """Close the stdin of a process spawned with ``stdin=True`` (it reads EOF)."""
        await self.write_stdin(name, process_id, b"", close=True)

    async def poll(
        self,
        name: str,
        process_id: str,
        *,
        stdout_from: int = 0,
        stderr_from: int = 0,
        wait_ms: int | None = None,
    ) -> ProcessOutput:
        """A process's status and its output after the given byte offsets.

        Pass ``stdout_next``/``stderr_next`` back as the next offsets; a
        non-zero ``*_dropped`` means output was lost to the 1 MiB retention.
        ``wait_ms`` (where the agent offers it; at most 20 s): answer as soon as
        there is output past the offsets or the process exited, else after
        ``wait_ms``.
        """
        params: dict[str, str | int] = {"stdout_from": stdout_from, "stderr_from": stderr_from}
        if wait_ms and paths.FEATURE_LIVE_OUTPUT in await self._features(name):
            # Never longer than the request may take (a second under its timeout).
            params["wait_ms"] = max(
                1, min(wait_ms, POLL_WAIT_MAX_MS, self._core.exec_timeout_ms(None))
            )
        response = await self._data(name, "GET", paths.process_path(process_id), params=params)
        return self._core.parse_output(response)

    async def processes(self, name: str) -> builtins.list[ProcessStatus]:
        """Every process the sandbox tracks (running, or exited and not yet killed)."""
        return self._core.parse_processes(await self._data(name, "GET", paths.PROCESSES))

    async def signal(self, name: str, process_id: str, signal: str = "TERM") -> None:
        """Send TERM, KILL, INT, HUP, QUIT, USR1 or USR2 to the process group."""
        response = await self._data(
            name, "POST", paths.process_signal_path(process_id), json={"signal": signal}
        )
        self._core.check(response, 200, 204)

    async def kill(self, name: str, process_id: str) -> None:
        """Stop the process if it still runs, then forget it (frees one of 64 slots)."""
        response = await self._data(name, "DELETE", paths.process_path(process_id))
        self._core.check(response, 200, 204)

    async def kill_all(self, name: str) -> None:
        """SIGKILL every process in the sandbox but its agent, tracked or not (a
        runaway or fork bomb included); tracked ones stay listed, exited (137)."""
        response = await self._data(name, "DELETE", paths.PROCESSES)
        self._core.check(response, 200, 204)

    async def run(
        self,
        name: str,
        command: builtins.list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        interval_ms: int = 500,
        on_output: OnOutput | None = None,
        timeout_ms: int | None = None,
        cancel: Cancel | None = None,
    ) -> RunResult:
        """Spawn argv and follow it until it exits; no output cap.

        Where the agent offers it, each poll waits for news (a long-poll), so
        output arrives within milliseconds of being written; otherwise it
        polls every ``interval_ms``.

        ``on_output`` gets every poll that brought output. When ``timeout_ms``
        passes or ``cancel.is_set()`` the process is killed and the result says
        ``killed`` (and ``timed_out``). Cancelling the caller (task cancellation
        here; KeyboardInterrupt in the sync client) kills the process too, then
        propagates. The finished process
        is reaped.

        >>> show = lambda chunk: print(chunk.stdout, end="")
        >>> r = await client.run("thread-42", ["make"], on_output=show)  # doctest: +SKIP
        >>> r.killed, r.exit_code  # doctest: +SKIP
        (False, 0)
        """
        status = await self.spawn(name, command, cwd=cwd, env=env)
        acc = RunAccumulator(status, on_output)
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        ending: str | None = None
        live = paths.FEATURE_LIVE_OUTPUT in await self._features(name)
        try:
            while True:
                wait_ms = None
                if live:
                    # Bounded by the deadline and by how often ``cancel`` is checked.
                    wait_ms = interval_ms if cancel is not None else POLL_WAIT_MAX_MS
                    if deadline is not None:
                        wait_ms = max(1, min(wait_ms, int((deadline - time.monotonic()) * 1000)))
                acc.add(
                    await self.poll(
                        name,
                        status.process_id,
                        stdout_from=acc.stdout_next,
                        stderr_from=acc.stderr_next,
                        wait_ms=wait_ms,
                    )
                )
                if acc.exited:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    ending = "timeout"
                    break
                if cancel is not None and cancel.is_set():
                    ending = "cancel"
                    break
                if live:
                    continue
                wait = interval_ms / 1000
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - time.monotonic()))
                await sleep(wait)
        except BaseException:
            with shielded(10):
                await self._end_process(name, acc, quiet=True)
            raise
        if ending is None:
            with contextlib.suppress(SandboxRequestError):
                await self.kill(name, status.process_id)
        else:
            await self._end_process(name, acc)
        return acc.result(timed_out=ending == "timeout", killed=ending is not None)

    async def _end_process(self, name: str, acc: RunAccumulator, *, quiet: bool = False) -> None:
        """KILL the group, collect what it still printed, then reap it."""
        pid = acc.process_id
        try:
            with contextlib.suppress(SandboxRequestError):
                await self.signal(name, pid, "KILL")
            deadline = time.monotonic() + 5
            while not acc.exited and time.monotonic() < deadline:
                try:
                    acc.add(
                        await self.poll(
                            name, pid, stdout_from=acc.stdout_next, stderr_from=acc.stderr_next
                        )
                    )
                except SandboxRequestError:
                    break
                if not acc.exited:
                    await sleep(0.05)
            with contextlib.suppress(SandboxRequestError):
                await self.kill(name, pid)
        except PodbayError:
            if not quiet:
                raise

    # -- files ---------------------------------------------------------------------------

    async def _native(self, name: str) -> bool:
        """Whether to use the native files API (``/v1/info`` asked once per handle)."""
        if self._core.config.files == "base64":
            return False
        return self._core.wants_native_files(await self._features(name))

    async def read_file_bytes(
        self, name: str, path: str, *, progress: Progress | None = None, user: str | None = None
    ) -> bytes:
        """The bytes of ``path``; 404 :class:`SandboxRequestError` when it cannot be read.

        Native files: streamed and checked against the agent's SHA-256 (a
        mismatch raises; bad bytes are never returned). Fallback: base64
        through exec, refused (not cut) above exec's 1 MiB output cap.
        ``user``: read with that account's permissions (409
        ``PATH_ACCESS_DENIED`` when it may not).
        """
        if await self._native(name):
            buffer = bytearray()
            await self._download(name, path, buffer.extend, progress, user)
            return bytes(buffer)
        result = await self.exec(name, _files.read_command(path), user=user)
        data = _files.decode_read(result, path)
        if progress is not None:
            progress(len(data), len(data))
        return data

    async def read_file(self, name: str, path: str, *, user: str | None = None) -> str:
        """``path`` as UTF-8 text (undecodable bytes replaced)."""
        return (await self.read_file_bytes(name, path, user=user)).decode("utf-8", errors="replace")

    # Alike in shape to cli.quick_exec.print_exec_result's parameters by
    # coincidence only.
    async def write_file_bytes(
        self,
        name: str,
        path: str,
        contents: bytes,
        *,
        progress: Progress | None = None,
        user: str | None = None,
    ) -> None:
        """Write ``contents`` to ``path`` (replacing it whole).

        Native files: streamed with its SHA-256, which the agent checks before
        the file becomes visible. Fallback: base64 through exec in 48 KiB chunks.
        ``user``: written as that account (a new file is owned by it).

        >>> await client.write_file_bytes("thread-42", "data.bin", b"\\x00\\xff")  # doctest: +SKIP
        """
        await self._put(name, path, io.BytesIO(bytes(contents)), progress, user)

    async def write_file(
        self, name: str, path: str, contents: str, *, user: str | None = None
    ) -> None:
        """Write ``contents`` to ``path`` as UTF-8."""
        await self.write_file_bytes(name, path, contents.encode("utf-8"), user=user)

    async def list_dir(self, name: str, path: str = ".") -> builtins.list[DirEntry]:
        """Entries of a directory (relative paths start at ``/workspace``)."""
        if await self._native(name):
            response = await self._data(name, "GET", paths.FILES_LIST, params={"path": path})
            listing = self._core.expect(response, DirListing, 200)
            return [
                DirEntry(name=e.name, is_directory=e.type == "directory") for e in listing.entries
            ]
        return _files.parse_list(await self.exec(name, _files.list_command(path)), path)

    async def grep(self, name: str, pattern: str, path: str = ".") -> builtins.list[GrepMatch]:
        """Lines matching a regular expression (``grep -rn``); no match is ``[]``.

        >>> for m in await client.grep("thread-42", "TODO", "/workspace"):  # doctest: +SKIP
        ...     print(f"{m.path}:{m.line}: {m.text}")
        """
        result = await self.exec(name, _files.grep_command(pattern, path))
        return _files.grep_result(result, pattern, path)

    async def stat(self, name: str, path: str, *, user: str | None = None) -> FileInfo:
        """Size, permission bits, owner (``uid``, ``gid``, ``owner``), mtime and
        ``type`` (file, directory, symlink, other) of ``path``, not following a
        final symlink; 404 :class:`SandboxRequestError` when it does not exist.

        >>> info = await client.stat("thread-42", "setup.py")  # doctest: +SKIP
        >>> info.type, info.size, oct(info.mode), info.owner  # doctest: +SKIP
        ('file', 1234, '0o644', 'root')
        """
        if await self._files_ops(name):
            params = {"path": path, "owner": "true", **_as_user(user)}
            return self._core.expect(
                await self._data(name, "GET", paths.FILES_STAT, params=params), FileInfo, 200
            )
        result = await self.exec(name, _files.stat_command(path), user=user)
        return _files.parse_stat(result, path)

    async def exists(self, name: str, path: str, *, user: str | None = None) -> bool:
        """Whether ``path`` exists (a dangling symlink counts: it is there)."""
        try:
            await self.stat(name, path, user=user)
        except SandboxRequestError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def mkdir(
        self,
        name: str,
        path: str,
        *,
        parents: bool = True,
        mode: int | None = None,
        user: str | None = None,
    ) -> None:
        """Create a directory (with its parents unless ``parents=False``; an
        existing directory is fine then)."""
        if await self._files_ops(name):
            body = codec_encode(MakeDirRequest(path=path, parents=parents, mode=mode))
            response = await self._data(
                name, "POST", paths.FILES_MKDIR, json=body, params=_as_user(user)
            )
            self._core.check(response, 200, 201)
            return
        result = await self.exec(name, _files.mkdir_command(path, parents, mode), user=user)
        _files.check_ok(result, f"mkdir {path}")

    async def chmod(self, name: str, path: str, mode: int, *, user: str | None = None) -> None:
        """Set the permission bits of ``path`` (e.g. ``0o755``)."""
        if await self._files_ops(name):
            response = await self._data(
                name,
                "POST",
                paths.FILES_CHMOD,
                json=codec_encode(ChmodRequest(path=path, mode=mode)),
                params=_as_user(user),
            )
            self._core.check(response, 200)
            return
        _files.check_ok(
            await self.exec(name, _files.chmod_command(path, mode), user=user), f"chmod {path}"
        )

    async def remove(
        self, name: str, path: str, *, recursive: bool = False, user: str | None = None
    ) -> None:
        """Delete a file, an empty directory, or with ``recursive`` a whole tree."""
        if await self._files_ops(name):
            params = {"path": path, **_as_user(user)}
            if recursive:
                params["recursive"] = "true"
            response = await self._data(name, "DELETE", paths.FILES, params=params)
            self._core.check(response, 200, 204)
            return
        _files.check_ok(
            await self.exec(name, _files.remove_path_command(path, recursive), user=user),
            f"rm {path}",
        )

    async def move(
        self,
        name: str,
        source: str,
        destination: str,
        *,
        overwrite: bool = False,
        user: str | None = None,
    ) -> None:
        """Rename ``source`` to ``destination`` (parents created); an existing
        destination is refused (409 ``PATH_EXISTS``) unless ``overwrite``."""
        if await self._files_ops(name):
            body = codec_encode(
                MoveRequest(source=source, destination=destination, overwrite=overwrite)
            )
            response = await self._data(
                name, "POST", paths.FILES_MOVE, json=body, params=_as_user(user)
            )
            self._core.check(response, 200)
            return
        result = await self.exec(
            name, _files.move_command(source, destination, overwrite), user=user
        )
        _files.check_move(result, destination)

    async def _files_ops(self, name: str) -> bool:
        return await self._native(name) and paths.FEATURE_FILES_OPS in await self._features(name)

    async def upload(
        self,
        name: str,
        local_path: str | os.PathLike[str],
        remote_path: str,
        *,
        progress: Progress | None = None,
    ) -> None:
        """Copy a local file, or a whole directory (as a tar stream), into the sandbox.

        A directory's contents land in ``remote_path`` (created if missing).
        Permission bits are kept, as ``docker cp`` keeps them; what is written
        is owned by the account the sandbox runs commands as (root by default).
        Memory stays constant whatever the size.
        """
        local = os.fspath(local_path)
        # Local metadata and open() are microseconds; the bytes stream in chunks.
        if not os.path.isdir(local):  # noqa: ASYNC240
            with open(local, "rb") as source:  # noqa: ASYNC230
                mode = _files.upload_mode(os.fstat(source.fileno()).st_mode)
                await self._put(name, remote_path, source, progress, mode=mode)
            return
        with tempfile.TemporaryFile() as archive:
            await run_sync(_files.pack, local, archive)
            remote_archive = _files.remote_temp("upload")
            await self._put(name, remote_archive, archive, progress)
            result = await self.exec(name, _files.untar_command(remote_archive, remote_path))
            _files.check_ok(result, f"unpacking into {remote_path}")

    async def download(
        self,
        name: str,
        remote_path: str,
        local_path: str | os.PathLike[str],
        *,
        progress: Progress | None = None,
    ) -> None:
        """Copy a sandbox file, or a whole directory (as a tar stream), to this machine.

        A file is written to a temporary sibling and renamed into place once
        its digest checks out; into an existing local directory it keeps its
        name. A directory's contents land in ``local_path``. Permission bits
        are kept but for set-id, sticky and group/other write bits (dropped, as
        Python's tar ``data`` filter does); what is written is owned by the
        local user.
        """
        local = os.fspath(local_path)
        is_dir = (await self.exec(name, _files.is_dir_command(remote_path))).exit_code == 0
        if not is_dir:
            if os.path.isdir(local):  # noqa: ASYNC240
                local = os.path.join(local, os.path.basename(remote_path.rstrip("/")))
            mode = _files.download_mode((await self.stat(name, remote_path)).mode)
            await self._get(name, remote_path, local, progress, mode)
            return
        remote_archive = _files.remote_temp("download")
        result = await self.exec(name, _files.tar_command(remote_path, remote_archive))
        try:
            _files.check_ok(result, f"packing {remote_path}")
            with tempfile.TemporaryDirectory() as scratch:
                archive = os.path.join(scratch, "download.tar")
                await self._get(name, remote_archive, archive, progress)
                await run_sync(_files.unpack, archive, local)
        finally:
            with contextlib.suppress(PodbayError):
                await self.exec(name, _files.remove_command(remote_archive))

    async def _put(
        self,
        name: str,
        path: str,
        source: BinaryIO,
        progress: Progress | None,
        user: str | None = None,
        *,
        mode: int | None = None,
    ) -> None:
        """``source`` into the file ``path``; ``mode``: its permission bits
        (None: a new file's default, an existing file's own)."""
        if await self._native(name):
            await self._upload(name, path, source, progress, user, mode)
            return
        _, total = await run_sync(_files.file_digest, source)
        done = 0
        try:
            for command in _files.write_commands(path, source):
                _files.check_write(await self.exec(name, command, user=user), path)
                done = min(total, done + BASE64_WRITE_CHUNK)
                if progress is not None:
                    progress(done, total)
            if mode is not None:
                result = await self.exec(name, _files.chmod_command(path, mode), user=user)
                _files.check_ok(result, f"chmod {path}")
        except BaseException:
            with shielded(10), contextlib.suppress(PodbayError):
                await self.exec(name, _files.cleanup_command(path))
            raise

    async def _upload(
        self,
        name: str,
        path: str,
        source: BinaryIO,
        progress: Progress | None,
        user: str | None = None,
        mode: int | None = None,
    ) -> None:
        start = source.tell()
        if self._core.takes_trailing_digest(name):
            # One pass: the bytes are hashed as they are sent, the digest follows them.
            size = await run_sync(_files.remaining_size, source)
            length = size + paths.DIGEST_HEX_LENGTH
            digest = paths.DIGEST_TRAILING

            def body() -> ByteStream:
                source.seek(start)
                return _hashed_chunks(source, size, progress)
        else:
            digest, size = await run_sync(_files.file_digest, source)
            length = size

            def body() -> ByteStream:
                source.seek(start)
                return _chunks(source, size, progress)

        headers = {
            paths.DIGEST_HEADER: digest,
            "Content-Length": str(length),
            "Content-Type": "application/octet-stream",
        }
        if mode is not None:
            headers[paths.MODE_HEADER] = f"{mode:04o}"
        response = await self._data(
            name,
            "PUT",
            paths.FILES,
            params={"path": path, **_as_user(user)},
            headers=headers,
            body=body,
        )
        self._core.check(response, 200, 201, 204)

    async def _get(
        self,
        name: str,
        remote: str,
        local: str,
        progress: Progress | None,
        mode: int | None = None,
    ) -> None:
        """``remote`` into the file ``local`` via a temporary sibling, renamed when
        verified; ``mode``: its permission bits (None: the temporary's 0600)."""
        directory = os.path.dirname(os.path.abspath(local))  # noqa: ASYNC240
        fd, temp = tempfile.mkstemp(prefix=".podbay-", suffix=".part", dir=directory)
        try:
            with os.fdopen(fd, "wb") as sink:
                if await self._native(name):
                    await self._download(name, remote, sink.write, progress)
                else:
                    result = await self.exec(name, _files.read_command(remote))
                    data = _files.decode_read(result, remote)
                    sink.write(data)
                    if progress is not None:
                        progress(len(data), len(data))
            if mode is not None:
                os.chmod(temp, mode)
            os.replace(temp, local)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise

    async def _download(
        self,
        name: str,
        path: str,
        sink: Callable[[bytes | memoryview], object],
        progress: Progress | None,
        user: str | None = None,
    ) -> None:
        response = await self._data(
            name,
            "GET",
            paths.FILES,
            params={"path": path, **_as_user(user)},
            headers=_files.READ_HEADERS,
            stream=True,
        )
        if response.status_code != 200:
            raise self._core.read_refusal(response)
        check = _files.DigestCheck(response.headers, path)
        try:
            async for chunk in response.aiter_bytes():
                for content in check.update(chunk):
                    sink(content)
                if progress is not None:
                    progress(check.size, check.total)
        except httpx.TransportError as exc:
            raise unavailable(response.request, exc) from exc
        finally:
            await response.aclose()
        check.verify()

    # -- terminals and ports ----------------------------------------------------------------

    async def pty(
        self,
        name: str,
        command: builtins.list[str],
        *,
        rows: int = 24,
        cols: int = 80,
        term: str = "xterm-256color",
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> AsyncTerminal:
        """Start argv on a terminal (a PTY of ``rows`` x ``cols``, ``TERM=term``) and
        return it, connected over one WebSocket (agents with the ``pty`` feature),
        as ``user`` (an account of the sandbox; default: the platform's default user).

        Everything typed goes to the terminal as is (``b"\\x03"`` is Ctrl-C for
        its foreground program). Closing the terminal before the command exits
        hangs it up: the command and what it started are killed.

        >>> async with await client.pty("thread-42", ["python3", "-q"]) as tty:  # doctest: +SKIP
        ...     await tty.send(b"6*7\\r")
        ...     await tty.recv()
        """
        start = self._core.pty_start(
            command, rows=rows, cols=cols, term=term, cwd=cwd, env=env, user=user
        )
        handle = await self._handle(name)
        ws = await self._ws_open(
            name, handle, lambda h: self._core.ws_url(h.endpoint.rstrip("/") + paths.PTY)
        )
        await ws.send(start)
        return AsyncTerminal(ws, self._core)

    async def _ws_open(
        self, name: str, handle: SandboxHandle, url: Callable[[SandboxHandle], str]
    ) -> WebSocket:
        """A WebSocket to the data plane; a 401/403 before the upgrade re-attaches once."""
        from websockets.exceptions import InvalidHandshake, InvalidStatus

        for attempt in (1, 2):
            try:
                return await ws_connect(
                    url(handle),
                    self._core.ws_headers(handle),
                    TERMINAL_MESSAGE_LIMIT,
                    self._core.config.timeout_seconds,
                )
            except InvalidStatus as exc:
                status = exc.response.status_code
                if attempt == 1 and status in (401, 403):
                    handle = await self._handle(name, stale=handle)
                    continue
                raise refusal_error(status, bytes(exc.response.body or b"")) from None
            except (OSError, TimeoutError, InvalidHandshake) as exc:
                raise SandboxUnavailableError(
                    f"cannot open a WebSocket to sandbox {name!r}: {exc}", exc
                ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def url(self, name: str, port: int, path: str = "/") -> str:
        """The URL of ``path`` on ``port`` inside the sandbox, through the gateway.

        It needs the sandbox's credential: send through :meth:`port_transport`,
        or hand a person :meth:`share_url` instead.
        """
        return self._core.port_url(await self._handle(name), port, path)

    async def listening_ports(self, name: str) -> builtins.list[int]:
        """The TCP ports a server in the sandbox listens on (what :meth:`url` can
        reach), read from the sandbox's ``/proc/net/tcp`` and ``tcp6``."""
        result = await self.exec(name, [*LISTENING_COMMAND])
        return parse_listening(result.stdout)

    def port_transport(self, name: str) -> httpx.AsyncBaseTransport:
        """An httpx transport that adds the sandbox's credential to every request
        (and re-attaches once when it is refused), for URLs from :meth:`url`.

        >>> http = httpx.AsyncClient(transport=client.port_transport("thread-42"))  # doctest: +SKIP
        >>> await http.get(await client.url("thread-42", 8000))  # doctest: +SKIP
        """
        return _AsyncPortTransport(self, name)

    async def share_url(self, name: str, port: int, *, expires_in_seconds: int = 3600) -> str:
        """A signed URL to ``port`` of the sandbox that needs no credential, for a person
        to open; valid for ``expires_in_seconds`` (at most a week), this sandbox only."""
        response = await self._control(self._core.share_request(name, port, expires_in_seconds))
        return self._core.parse_share(response).url

    # -- code interpreter --------------------------------------------------------------------

    def code_interpreter(self, name: str) -> AsyncCodeInterpreter:
        """The sandbox's stateful Python interpreter (one per sandbox, started on first use)."""
        interpreter = self._interpreters.get(name)
        if interpreter is None:
            interpreter = self._interpreters.setdefault(name, AsyncCodeInterpreter(self, name))
        return interpreter

    async def run_code(self, name: str, code: str, *, timeout_ms: int | None = None) -> Execution:
        """Run Python ``code`` in the sandbox's interpreter, whose variables persist
        from cell to cell; the last expression's value is the result.

        The interpreter runs inside the sandbox (a stdlib-only kernel the SDK
        uploads and spawns on first use). ``timeout_ms`` interrupts the cell
        (KeyboardInterrupt) and keeps the interpreter; an exception in the code
        is ``execution.error``, not raised.

        >>> await client.run_code("thread-42", "x = 1")  # doctest: +SKIP
        >>> (await client.run_code("thread-42", "x + 1")).text  # doctest: +SKIP
        '2'
        """
        return await self.code_interpreter(name).run(code, timeout_ms=timeout_ms)

    # -- control plane -----------------------------------------------------------------------

    async def get(self, name: str) -> SandboxRecord:
        """The sandbox's record (no credentials); 404 when there is none."""
        return self._core.parse_record(await self._control(self._core.get_request(name)))

    async def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[SandboxRecord]:
        """Every sandbox of this deployment; with ``labels``, those carrying all of them.

        >>> for row in await client.list():  # doctest: +SKIP
        ...     print(row.name, row.state, row.ceiling_at)
        >>> await client.list(labels={"team": "a"})  # doctest: +SKIP
        """
        return self._core.parse_records(await self._control(self._core.list_request(labels)))

    async def metrics(self, name: str, *, since: datetime | None = None) -> Metrics:
        """The sandbox's resource samples (CPU, memory, disk, network), oldest
        first, over the last minutes (or after ``since``): docs/observability.md.

        >>> latest = (await client.metrics("thread-42")).samples[-1]  # doctest: +SKIP
        >>> latest.cpu_percent, latest.memory_bytes  # doctest: +SKIP
        """
        request = self._core.observe_request(name, "metrics", since)
        return self._core.parse_metrics(await self._control(request))

    async def events(self, name: str, *, since: datetime | None = None) -> EventList:
        """What happened to the sandbox (created, suspended, resumed, ...), oldest first."""
        request = self._core.observe_request(name, "events", since)
        return self._core.parse_events(await self._control(request))

    async def commands(self, name: str, *, since: datetime | None = None) -> CommandList:
        """Each exec and spawn's argv, user, exit code and duration, oldest first
        (``enabled`` false when the deployment's command log is off)."""
        request = self._core.observe_request(name, "commands", since)
        return self._core.parse_commands(await self._control(request))

    async def stop(self, name: str) -> None:
        """Suspend the sandbox's compute early; the next call resumes it."""
        response = await self._control(self._core.stop_request(name))
        self._core.forget(name)
        self._core.check(response, 200, 202, 204)

    async def fork(self, name: str, *new_names: str) -> ForkResult:
        """Copy the sandbox into new running sandboxes, one per name (at most
        16): each has its files as they are now, its class, options and egress
        policy, and is a sandbox of its own (credentials, hostname, network)
        from then on. Processes are not copied yet: each copy starts afresh.
        A running source pauses while its disk is copied (``paused_ms``).
        See docs/fork.md.

        >>> result = await client.fork("thread-42", "try-a", "try-b")  # doctest: +SKIP
        >>> await client.exec("try-a", ["cat", "plan.md"])  # doctest: +SKIP
        """
        if not new_names:
            raise ValueError("fork needs at least one new sandbox name")
        request = self._core.fork_request(name, list(new_names))
        return self._core.parse_fork(await self._control(request))

    async def network(self, name: str) -> NetworkPolicy:
        """The sandbox's egress policy in force (``NetworkPolicy()``: open)."""
        return self._core.parse_network(await self._control(self._core.network_request(name)))

    async def egress(self, name: str) -> EgressAudit:
        """Where the sandbox sent lately: each destination it reached or was
        refused (address, port, protocol, the name podbay's resolver gave it,
        packets, bytes, last seen), busiest first; empty while it does not run.
        See docs/network.md, "Audit".

        >>> for d in (await client.egress("thread-42")).destinations:  # doctest: +SKIP
        ...     print(d.verdict, d.name or d.address, d.port, d.bytes)
        """
        return self._core.parse_egress(await self._control(self._core.egress_request(name)))

    async def set_network(
        self,
        name: str,
        *,
        internet: bool = True,
        allow: builtins.list[str] | None = None,
        deny: builtins.list[str] | None = None,
    ) -> NetworkPolicy:
        """Change the sandbox's egress policy; in force when this returns.

        ``internet=False``: no egress at all. ``allow``/``deny``: CIDRs, domain
        names and ``*.`` wildcards; deny wins, and an allow list refuses what it
        does not name. The platform's own refusals (host, private ranges,
        metadata) stay whatever the policy says. See docs/network.md for what
        each class enforces.

        >>> await client.set_network("thread-42", allow=["203.0.113.0/24"])  # doctest: +SKIP
        """
        policy = NetworkPolicy(internet=internet, allow=allow, deny=deny)
        request = self._core.network_request(name, policy)
        return self._core.parse_network(await self._control(request))

    # -- volumes (docs/volumes.md) ------------------------------------------------------
    async def create_volume(
        self, name: str, *, size_mib: int | None = None, size_bytes: int | None = None
    ) -> Volume:
        """A new persistent volume of the deployment, of a fixed size (a hard
        limit: writes past it fail with ENOSPC), mounted by ``attach(volumes=)``.

        >>> await client.create_volume("datasets", size_mib=1024)  # doctest: +SKIP
        """
        request = self._core.volume_create_request(name, size_bytes, size_mib)
        return self._core.parse_volume(await self._control(request))

    async def list_volumes(self) -> builtins.list[Volume]:
        return self._core.parse_volumes(await self._control(self._core.volumes_request()))

    async def get_volume(self, name: str) -> Volume:
        """The volume: its size, bytes used and the sandboxes that mount it."""
        request = self._core.volume_request("GET", name)
        return self._core.parse_volume(await self._control(request))

    async def delete_volume(self, name: str) -> None:
        """Delete the volume and its files (refused while a sandbox mounts it)."""
        response = await self._control(self._core.volume_request("DELETE", name))
        self._core.check(response, 204)

    async def read_volume_file(self, name: str, path: str) -> bytes:
        """A file of the volume, without a sandbox (symlinks are never followed)."""
        response = await self._control(self._core.volume_file_request("GET", name, path))
        self._core.check(response, 200)
        return response.content

    async def write_volume_file(self, name: str, path: str, content: bytes | str) -> None:
        """Write a file of the volume (its directories made), without a sandbox."""
        data = content.encode() if isinstance(content, str) else content
        response = await self._control(self._core.volume_file_request("PUT", name, path, data))
        self._core.check(response, 204)

    async def remove_volume_path(self, name: str, path: str) -> None:
        """Remove a file, a symlink or a whole directory of the volume."""
        response = await self._control(self._core.volume_file_request("DELETE", name, path))
        self._core.check(response, 204)

    async def list_volume_dir(self, name: str, path: str = "") -> builtins.list[VolumeEntry]:
        request = self._core.volume_entries_request(name, path)
        return self._core.parse_volume_entries(await self._control(request))

    async def delete(self, name: str) -> None:
        """Drop the sandbox and its files."""
        response = await self._control(self._core.delete_request(name))
        self._core.forget(name)
        self._core.check(response, 200, 202, 204)


def _position(source: BinaryIO) -> int | None:
    """Where a seekable source stands (to send it again), else None."""
    try:
        return source.tell() if source.seekable() else None
    except (OSError, ValueError):
        return None


def _as_user(user: str | None) -> dict[str, str]:
    return {"user": user} if user is not None else {}


async def _stdin_chunks(head: bytes, source: BinaryIO) -> ByteStream:
    if head:
        yield head
    read = getattr(source, "read1", source.read)  # a pipe: what is there, not a full chunk
    while chunk := read(STDIN_CHUNK):
        yield chunk


async def _chunks(source: BinaryIO, total: int, progress: Progress | None) -> ByteStream:
    done = 0
    while chunk := source.read(_files.STREAM_CHUNK):
        done += len(chunk)
        yield chunk
        if progress is not None:
            progress(done, total)


async def _hashed_chunks(source: BinaryIO, size: int, progress: Progress | None) -> ByteStream:
    """Exactly ``size`` bytes of ``source``, then their hex SHA-256 (a trailing digest)."""
    digest = _files.StreamDigest(size)
    while digest.left:
        chunk = digest.take(source.read(min(_files.STREAM_CHUNK, digest.left)))
        yield chunk
        if progress is not None:
            progress(digest.size, size)
    yield digest.trailer()


class AsyncTerminal:
    """A command on a terminal in the sandbox (see :meth:`AsyncSandboxClient.pty`)."""

    def __init__(self, ws: WebSocket, core: Core) -> None:
        self._ws = ws
        self._core = core
        #: The command's exit code, once :meth:`recv` has seen it exit.
        self.exit_code: int | None = None

    async def send(self, data: bytes | str) -> None:
        """Type ``data`` (text is sent as UTF-8)."""
        await self._ws.send(data.encode() if isinstance(data, str) else bytes(data))

    async def resize(self, rows: int, cols: int) -> None:
        await self._ws.send(json.dumps({"type": "resize", "rows": rows, "cols": cols}))

    async def recv(self) -> bytes:
        """The terminal's next output; ``b""`` once the command has exited
        (:attr:`exit_code` is then set)."""
        from websockets.exceptions import ConnectionClosed

        if self.exit_code is not None:
            return b""
        try:
            message = await self._ws.recv()
        except ConnectionClosed as exc:
            raise SandboxUnavailableError(
                "the terminal's connection closed before its command exited", exc
            ) from exc
        if isinstance(message, bytes):
            return message
        self.exit_code = self._core.pty_exit(message)
        return b""

    async def wait(self) -> int:
        """Read (and drop) output until the command exits; its exit code."""
        while await self.recv():
            pass
        assert self.exit_code is not None
        return self.exit_code

    async def aclose(self) -> None:
        """Close the terminal (a command still running is killed)."""
        await self._ws.close()

    async def __aenter__(self) -> AsyncTerminal:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _AsyncPortTransport(httpx.AsyncBaseTransport):
    """Adds the sandbox's credential; one re-attach on a credential refusal."""

    def __init__(self, client: AsyncSandboxClient, name: str) -> None:
        self._client = client
        self._name = name

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        handle = await self._client._handle(self._name)
        try:
            request.content  # noqa: B018 - a body that can be sent twice?
            replayable = True
        except httpx.RequestNotRead:
            replayable = False
        for attempt in (1, 2):
            request.headers.update(handle.headers)
            response = await self._client._transport.handle_async_request(request)
            if attempt == 1 and replayable and response.status_code in (401, 403):
                await response.aread()
                if _gateway_refusal(response):
                    await response.aclose()
                    handle = await self._client._handle(self._name, stale=handle)
                    continue
            return response
        raise AssertionError("unreachable")  # pragma: no cover


def _gateway_refusal(response: httpx.Response) -> bool:
    """A refusal of the credential by the gateway (not the sandbox's server's own 401)."""
    try:
        code = json.loads(response.content).get("code")
    except (ValueError, AttributeError):
        return False
    return code in (
        ErrorCode.CREDENTIAL_INVALID,
        ErrorCode.SANDBOX_NOT_RUNNING,
        ErrorCode.CREDENTIAL_WRONG_SANDBOX,
    )


class AsyncCodeInterpreter:
    """One sandbox's Python interpreter as a client sees it (see :meth:`run_code`).

    The kernel listens on ``127.0.0.1:49999`` inside the sandbox, reached through
    the gateway's port relay with the sandbox's credential plus a token the
    kernel wrote to a root-only file. Cells from one client run one at a time.
    """

    def __init__(self, client: AsyncSandboxClient, name: str) -> None:
        self._client = client
        self._name = name
        self._http = httpx.AsyncClient(
            transport=client.port_transport(name),
            timeout=httpx.Timeout(client._core.config.timeout_seconds),
        )
        self._lock = Lock()
        self._token: str | None = None
        self._kernel_id: str | None = None
        self._pid: int | None = None

    async def aclose(self) -> None:
        await self._http.aclose()

    async def run(self, code: str, *, timeout_ms: int | None = None) -> Execution:
        body = _interpreter.run_body(code, timeout_ms)
        # Bounded only when the cell is: a cell that ignores its interrupt is
        # killed with the interpreter after a grace period.
        wait = (
            None if timeout_ms is None else timeout_ms / 1000 + _interpreter.INTERRUPT_GRACE_SECONDS
        )
        async with self._lock:
            restarted = await self._connect() if self._token is None else False
            for attempt in (1, 2):
                try:
                    response = await self._post("/run", body, wait)
                except httpx.TimeoutException:
                    await self._kill()
                    return _interpreter.crashed(
                        "the cell did not stop when interrupted; the interpreter was killed"
                    )
                except (httpx.TransportError, SandboxUnavailableError) as exc:
                    return await self._lost(str(exc))
                except BaseException:
                    # Cancelled or KeyboardInterrupt while waiting: stop the cell too.
                    with shielded(10), contextlib.suppress(Exception):
                        await self.interrupt()
                    raise
                if response.status_code == 200:
                    execution = _interpreter.parse_execution(response.json(), restarted=restarted)
                    self._kernel_id = execution.kernel_id
                    return execution
                gone = (
                    _interpreter.is_port_unreachable(response.status_code, response.content)
                    or response.status_code == 401
                )
                if attempt == 1 and gone:
                    # Nothing ran: no kernel (a resumed sandbox) or another one took over.
                    self._token = None
                    restarted = await self._connect() or restarted
                    continue
                if response.status_code in (502, 503, 504):
                    return await self._lost(f"HTTP {response.status_code}")
                raise _interpreter.InterpreterError(
                    f"the interpreter refused the cell: {response.status_code} {response.text}"
                )
        raise AssertionError("unreachable")  # pragma: no cover

    async def interrupt(self) -> bool:
        """KeyboardInterrupt in the running cell, if any; the interpreter stays."""
        if self._token is None:
            return False
        response = await self._post("/interrupt", b"{}", 10)
        return response.status_code == 200 and bool(response.json().get("interrupted"))

    async def restart(self) -> None:
        """Kill the interpreter; the next cell starts a new one (state lost)."""
        async with self._lock:
            if self._token is None:
                await self._connect()
            await self._kill()

    # -- the kernel's life ----------------------------------------------------------------

    async def _post(self, path: str, body: bytes, wait: float | None) -> httpx.Response:
        url = await self._client.url(self._name, _interpreter.KERNEL_PORT, path)
        return await self._http.post(
            url,
            content=body,
            timeout=wait,
            headers={
                _interpreter.TOKEN_HEADER: self._token or "",
                "Content-Type": "application/json",
            },
        )

    async def _health(self, token: str) -> dict[str, Any] | None:
        url = await self._client.url(self._name, _interpreter.KERNEL_PORT, "/health")
        try:
            response = await self._http.get(url, headers={_interpreter.TOKEN_HEADER: token})
        except httpx.TransportError:
            return None
        if response.status_code != 200:
            return None
        health: dict[str, Any] = response.json()
        return health

    async def _read_token(self) -> str | None:
        try:
            token = await self._client.read_file(self._name, _interpreter.TOKEN_FILE)
        except SandboxRequestError:
            return None
        return token.strip() or None

    async def _connect(self) -> bool:
        """Find the sandbox's kernel or start one; true when an earlier one was lost."""
        token = await self._read_token()
        if token is not None:
            health = await self._health(token)
            if health is not None:
                return self._adopt(token, health)
        await self._start()
        return token is not None or self._kernel_id is not None

    def _adopt(self, token: str, health: dict[str, Any]) -> bool:
        self._token = token
        self._pid = int(health["pid"])
        lost = self._kernel_id is not None and health["kernel_id"] != self._kernel_id
        self._kernel_id = str(health["kernel_id"])
        return lost

    async def _start(self) -> None:
        source = _interpreter.kernel_source()
        path = _interpreter.kernel_path(source)
        await self._client.exec(self._name, ["mkdir", "-p", "-m", "700", _interpreter.KERNEL_DIR])
        await self._client.write_file_bytes(self._name, path, source)
        status = await self._client.spawn(self._name, _interpreter.kernel_command(path))
        deadline = time.monotonic() + _interpreter.START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            token = await self._read_token()
            health = await self._health(token) if token is not None else None
            if token is not None and health is not None:
                self._adopt(token, health)
                return
            await sleep(0.02)
        output = await self._client.poll(self._name, status.process_id)
        raise _interpreter.InterpreterError(
            f"the interpreter did not start in {_interpreter.START_TIMEOUT_SECONDS:g} s "
            f"(state {output.state}, exit code {output.exit_code}): {output.stderr[-2000:]}"
        )

    async def _kill(self) -> None:
        if self._pid is not None:
            await self._client.exec(self._name, ["kill", "-KILL", str(self._pid)])
        self._token = None
        self._pid = None

    async def _lost(self, detail: str) -> Execution:
        """The connection broke mid-cell: a dead kernel is reported, a live one is not."""
        if self._token is not None and await self._health(self._token) is not None:
            raise _interpreter.InterpreterError(
                f"lost the connection to the interpreter ({detail}); the cell may still be "
                "running: interrupt() stops it"
            )
        self._token = None
        self._pid = None
        return _interpreter.crashed(detail)


class AsyncSandbox:
    """One sandbox by name: the client's methods without the ``name`` argument.

    >>> async with AsyncSandboxClient() as client:  # doctest: +SKIP
    ...     async with client.sandbox("thread-42") as sb:
    ...         await sb.write_file("main.py", "print('hi')\\n")
    ...         print((await sb.exec(["python3", "main.py"])).stdout)
    hi
    """

    def __init__(self, client: AsyncSandboxClient, name: str) -> None:
        self.client = client
        self.name = name

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.name!r})"

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    @property
    def code_interpreter(self) -> AsyncCodeInterpreter:
        return self.client.code_interpreter(self.name)

    # Each of these is the client's method with this sandbox's name filled in:
    # same parameters, same types (for a type checker too), same docstring.
    attach = for_the_sandbox(AsyncSandboxClient.attach)
    listening_ports = for_the_sandbox(AsyncSandboxClient.listening_ports)
    exec = for_the_sandbox(AsyncSandboxClient.exec)
    exec_bytes = for_the_sandbox(AsyncSandboxClient.exec_bytes)
    stream = for_the_sandbox(AsyncSandboxClient.stream)
    exec_combined = for_the_sandbox(AsyncSandboxClient.exec_combined)
    run = for_the_sandbox(AsyncSandboxClient.run)
    spawn = for_the_sandbox(AsyncSandboxClient.spawn)
    write_stdin = for_the_sandbox(AsyncSandboxClient.write_stdin)
    close_stdin = for_the_sandbox(AsyncSandboxClient.close_stdin)
    poll = for_the_sandbox(AsyncSandboxClient.poll)
    processes = for_the_sandbox(AsyncSandboxClient.processes)
    signal = for_the_sandbox(AsyncSandboxClient.signal)
    kill = for_the_sandbox(AsyncSandboxClient.kill)
    kill_all = for_the_sandbox(AsyncSandboxClient.kill_all)
    read_file_bytes = for_the_sandbox(AsyncSandboxClient.read_file_bytes)
    read_file = for_the_sandbox(AsyncSandboxClient.read_file)
    write_file_bytes = for_the_sandbox(AsyncSandboxClient.write_file_bytes)
    write_file = for_the_sandbox(AsyncSandboxClient.write_file)
    stat = for_the_sandbox(AsyncSandboxClient.stat)
    exists = for_the_sandbox(AsyncSandboxClient.exists)
    mkdir = for_the_sandbox(AsyncSandboxClient.mkdir)
    chmod = for_the_sandbox(AsyncSandboxClient.chmod)
    remove = for_the_sandbox(AsyncSandboxClient.remove)
    move = for_the_sandbox(AsyncSandboxClient.move)
    list_dir = for_the_sandbox(AsyncSandboxClient.list_dir)
    grep = for_the_sandbox(AsyncSandboxClient.grep)
    upload = for_the_sandbox(AsyncSandboxClient.upload)
    download = for_the_sandbox(AsyncSandboxClient.download)
    run_code = for_the_sandbox(AsyncSandboxClient.run_code)
    get = for_the_sandbox(AsyncSandboxClient.get)
    metrics = for_the_sandbox(AsyncSandboxClient.metrics)
    events = for_the_sandbox(AsyncSandboxClient.events)
    commands = for_the_sandbox(AsyncSandboxClient.commands)
    stop = for_the_sandbox(AsyncSandboxClient.stop)
    fork = for_the_sandbox(AsyncSandboxClient.fork)
    delete = for_the_sandbox(AsyncSandboxClient.delete)
    pty = for_the_sandbox(AsyncSandboxClient.pty)
    url = for_the_sandbox(AsyncSandboxClient.url)
    port_transport = for_the_sandbox(AsyncSandboxClient.port_transport)
    share_url = for_the_sandbox(AsyncSandboxClient.share_url)


__all__ = ["AsyncCodeInterpreter", "AsyncSandbox", "AsyncSandboxClient", "AsyncTerminal"]
