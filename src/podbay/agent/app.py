"""The agent's routes: parse the request, call a service, serialize.

Request bodies are decoded with the contract's codec, strictly (an unknown
field is refused: a silently ignored option is a bug). Every refusal is
``{"error": sentence, "code": CODE}`` with the code's status.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from podbay.errors import ApiError
from podbay.wire import paths
from podbay.wire.codec import WireError, dumps, loads
from podbay.wire.codes import ErrorCode, error_body
from podbay.wire.data import (
    AgentInfo,
    ChmodRequest,
    ExecRequest,
    MakeDirRequest,
    MoveRequest,
    ProcessList,
    PtyRequest,
    SignalRequest,
    SpawnRequest,
)
from podbay.wire.limits import MAX_JSON_BODY, POLL_WAIT_MAX_MS

from . import VERSION
from .commands import CommandLog
from .exec import Exec, ReadBody
from .exec import run as run_exec
from .exec import stream as stream_exec
from .files import Files, FileStream, parse_digest, parse_mode
from .http import ProtocolError, Request, Response
from .processes import ProcessTable
from .pty import start as start_pty
from .reaper import Reaper
from .stats import read_stats
from .tree import kill_all_but_self
from .tunnel import open_tunnel
from .users import acting_as, resolve

FEATURES = [
    paths.FEATURE_FILES,
    paths.FEATURE_TRAILING_DIGEST,
    paths.FEATURE_PTY,
    paths.FEATURE_PORTS,
    paths.FEATURE_FILES_OPS,
    paths.FEATURE_STDIN,
    paths.FEATURE_EXEC_OUTPUT,
    paths.FEATURE_LIVE_OUTPUT,
    paths.FEATURE_USERS,
]
_DEFAULT_USER = paths.DEFAULT_USER_HEADER.lower()
_REQUEST_ID = paths.REQUEST_ID_HEADER.lower()

T = TypeVar("T")
Route = Callable[[Request], Response]


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(status, dumps(obj))


def refusal_response(code: ErrorCode, message: str) -> Response:
    return Response(code.status, dumps(error_body(code, message)))


def protocol_refusal(status: int, message: str) -> Response:
    """How the HTTP layer's own faults are answered: in the contract's shape."""
    code = {500: ErrorCode.INTERNAL, 413: ErrorCode.REQUEST_TOO_LARGE}.get(
        status, ErrorCode.REQUEST_INVALID
    )
    return refusal_response(code, message)


def _body(req: Request, model: type[T]) -> T:
    return loads(model, req.body.read_all(MAX_JSON_BODY), strict=True)


def _offset(req: Request, name: str) -> int:
    raw = req.query.get(name, "0") or "0"
    if not raw.isdigit() or len(raw) > 18:
        raise ApiError(ErrorCode.REQUEST_INVALID, f"{name} must be a byte offset (0 or more)")
    return int(raw)


def _encoding(req: Request) -> str:
    raw = req.query.get("encoding", "utf-8") or "utf-8"
    if raw not in ("utf-8", "base64"):
        raise ApiError(ErrorCode.REQUEST_INVALID, "encoding must be utf-8 or base64")
    return raw


def _wait_ms(req: Request) -> int:
    raw = req.query.get("wait_ms", "0") or "0"
    if not raw.isdigit() or len(raw) > 9:
        raise ApiError(ErrorCode.REQUEST_INVALID, "wait_ms must be milliseconds (0 or more)")
    return min(int(raw), POLL_WAIT_MAX_MS)


def _exec_head(req: Request) -> tuple[ExecRequest, ReadBody]:
    """A stdin-mode exec body: its first line is the request, the rest stdin."""
    buf = bytearray()
    while (end := buf.find(b"\n")) < 0:
        data = req.body.read()
        if not data:
            raise ApiError(
                ErrorCode.REQUEST_INVALID, "the body must start with one line of exec request JSON"
            )
        buf += data
        if len(buf) > MAX_JSON_BODY:
            raise ProtocolError(413, f"exec request line larger than {MAX_JSON_BODY} bytes")
    body = loads(ExecRequest, bytes(buf[:end]), strict=True)
    rest = memoryview(bytes(buf[end + 1 :]))

    def read(view: memoryview) -> int:
        nonlocal rest
        if rest:
            n = min(len(rest), len(view))
            view[:n] = rest[:n]
            rest = rest[n:]
            return n
        return req.body.readinto(view)

    return body, read


def _flag(req: Request, name: str) -> bool:
    raw = req.query.get(name, "false").lower()
    if raw in ("true", "1", "yes"):
        return True
    if raw in ("false", "0", "no", ""):
        return False
    raise ApiError(ErrorCode.REQUEST_INVALID, f"{name} must be true or false")


def _expect_upgrade(req: Request, token: str) -> None:
    if req.headers.get("upgrade", "").lower() != token:
        raise ApiError(ErrorCode.REQUEST_INVALID, f"{req.path} needs 'Upgrade: {token}'")


class App:
    """Routes data-plane calls to the exec, process and file services."""

    def __init__(self, reaper: Reaper, workspace: str, declared_env: Mapping[str, str]) -> None:
        self.reaper = reaper
        self.workspace = workspace
        self.declared_env = dict(declared_env)
        self.processes = ProcessTable(reaper, workspace, self.declared_env)
        self.files = Files(workspace)
        self.commands = CommandLog()
        #: Whether a request relayed by the gateway (which names its request id)
        #: came in: the sandbox is in use, not waiting in a warm pool.
        self.relayed = False
        #: Parks the server for a checkpoint (:mod:`.park`); None: it cannot.
        self.park: Callable[[], bool] | None = None
        #: Why the sandbox cannot be checkpointed now (:class:`.park.TcpWatch`).
        self.park_refusal: Callable[[], str | None] | None = None
        self.routes: dict[str, dict[str, Route]] = {
            paths.INFO: {"GET": self.info},
            paths.EXEC: {"POST": self.exec},
            paths.PROCESSES: {
                "GET": self.list_processes,
                "POST": self.spawn,
                "DELETE": self.kill_everything,
            },
            paths.FILES: {
                "GET": self.read_file,
                "PUT": self.write_file,
                "DELETE": self.delete_file,
            },
            paths.FILES_STAT: {"GET": self.stat_file},
            paths.FILES_LIST: {"GET": self.list_dir},
            paths.FILES_MKDIR: {"POST": self.mkdir},
            paths.FILES_CHMOD: {"POST": self.chmod},
            paths.FILES_MOVE: {"POST": self.move},
        }
        #: The gateway's own leg of terminals and ports (HTTP/1.1 upgrades) and
        #: the host's guest figures (``vm`` metrics): not client routes, so not
        #: in the data plane's OpenAPI document.
        self.upgrades: dict[str, dict[str, Route]] = {
            paths.PTY: {"POST": self.pty},
            paths.TUNNEL: {"GET": self.tunnel},
            paths.STATS: {"GET": self.stats},
            paths.COMMANDS: {"GET": self.command_log},
            paths.PARK: {"POST": self.park_for_checkpoint},
        }

    def __call__(self, req: Request) -> Response:
        if not self.relayed and _REQUEST_ID in req.headers:
            self.relayed = True
        try:
            return self._dispatch(req)
        except ApiError as exc:
            return refusal_response(exc.code, exc.message)
        except WireError as exc:
            return refusal_response(ErrorCode.REQUEST_INVALID, f"invalid request body: {exc}")

    def _dispatch(self, req: Request) -> Response:
        methods = self.routes.get(req.path) or self.upgrades.get(req.path)
        process_id = None
        if methods is None and req.path.startswith(paths.PROCESSES + "/"):
            rest = req.path[len(paths.PROCESSES) + 1 :]
            raw_id, _, tail = rest.partition("/")
            from urllib.parse import unquote  # not at start-up: see http.parse_query

            process_id = unquote(raw_id)
            if process_id and tail == "signal":
                methods = {"POST": self.signal}
            elif process_id and tail == "stdin":
                methods = {"POST": self.write_stdin}
            elif process_id and "/" not in rest:
                methods = {"GET": self.poll, "DELETE": self.kill}
        if methods is None:
            raise ApiError(ErrorCode.ROUTE_NOT_FOUND, f"no route {req.path}")
        handler = methods.get(req.method)
        if handler is None:
            allowed = ", ".join(sorted(methods))
            resp = refusal_response(
                ErrorCode.METHOD_NOT_ALLOWED,
                f"{req.method} is not allowed on {req.path}; use {allowed}",
            )
            resp.headers.append(("Allow", allowed))
            return resp
        req.params = {"process_id": process_id} if process_id else {}
        return handler(req)

    def park_for_checkpoint(self, req: Request) -> Response:
        """The host's call before a checkpoint (:mod:`.park`). Refused when the
        gateway relayed it (a client's: it would leave its sandbox unreachable
        until a restore) or when the agent serves on a socket it cannot bind
        again. The answer may be cut by the park itself."""
        if _REQUEST_ID in req.headers or self.park is None:
            raise ApiError(ErrorCode.ROUTE_NOT_FOUND, f"no route {req.path}")
        refusal = self.park_refusal() if self.park_refusal is not None else None
        if refusal is not None:
            raise ApiError(ErrorCode.SANDBOX_BUSY, f"cannot checkpoint now: {refusal}")
        if not self.park():
            raise ApiError(ErrorCode.ROUTE_NOT_FOUND, f"no route {req.path}")
        return json_response({"parking": True}, status=202)

    # -- info and exec -------------------------------------------------------
    def info(self, req: Request) -> Response:
        return json_response(AgentInfo(version=VERSION, features=list(FEATURES)))

    def exec(self, req: Request) -> Response:
        content_type = req.headers.get("content-type", "").partition(";")[0].strip().lower()
        stdin: ReadBody | None = None
        if content_type == paths.EXEC_STDIN_CONTENT_TYPE:
            body, stdin = _exec_head(req)
        else:
            body = _body(req, ExecRequest)
        started = Exec(
            self.reaper,
            self.workspace,
            self.declared_env,
            body,
            stdin=stdin,
            default_user=req.headers.get(_DEFAULT_USER),
            peer=req.peer,
        )
        self.commands.add("exec", body.command, started.user, started.child, started.started)
        if paths.EXEC_STREAM_CONTENT_TYPE in req.headers.get("accept", ""):
            lines = stream_exec(started)
            if stdin is not None:
                # Nothing is answered before the body is read whole (the first line
                # comes after it): the answer's head goes out with that line, not
                # while the feeder still reads the body. Sent earlier, it lost body
                # bytes or the body's end now and then, under gVisor and runc alike
                # (how is not traced): `cat` got no input or the answer never ended
                # (test_a_piped_shell_has_no_terminal, test_platform_stdin_stream.py).
                lines = itertools.chain([next(lines)], lines)
            return Response(200, lines, content_type=paths.EXEC_STREAM_CONTENT_TYPE)
        return json_response(run_exec(started))

    def stats(self, req: Request) -> Response:
        return json_response(read_stats())

    def command_log(self, req: Request) -> Response:
        return json_response(self.commands.listing())

    # -- terminals and ports ------------------------------------------------
    def pty(self, req: Request) -> Response:
        _expect_upgrade(req, paths.UPGRADE_PTY)
        return start_pty(
            self.reaper,
            self.workspace,
            self.declared_env,
            _body(req, PtyRequest),
            req.headers.get(_DEFAULT_USER),
        )

    def tunnel(self, req: Request) -> Response:
        _expect_upgrade(req, paths.UPGRADE_TUNNEL)
        return open_tunnel(req)

    # -- processes -----------------------------------------------------------
    def spawn(self, req: Request) -> Response:
        body = _body(req, SpawnRequest)
        status = self.processes.spawn(body, req.headers.get(_DEFAULT_USER))
        proc = self.processes.get(status.process_id)
        if proc.child is not None:
            self.commands.add("spawn", body.command, proc.user, proc.child, proc.started_mono)
        return json_response(status)

    def write_stdin(self, req: Request) -> Response:
        proc = self.processes.get(req.params["process_id"])
        proc.write_stdin(req.body.read, _flag(req, "close"))
        return Response(204, content_type=None)

    def list_processes(self, req: Request) -> Response:
        return json_response(ProcessList(processes=self.processes.list()))

    def poll(self, req: Request) -> Response:
        proc = self.processes.get(req.params["process_id"])
        return json_response(
            proc.output(
                _offset(req, "stdout_from"),
                _offset(req, "stderr_from"),
                wait_ms=_wait_ms(req),
                encoding=_encoding(req),
            )
        )

    def signal(self, req: Request) -> Response:
        body = _body(req, SignalRequest)
        self.processes.signal(req.params["process_id"], body.signal)
        return Response(204, content_type=None)

    def kill_everything(self, req: Request) -> Response:
        """Every process in the sandbox but the agent, tracked or not, gets SIGKILL
        (tracked ones then report exit 137 until forgotten)."""
        kill_all_but_self()
        return Response(204, content_type=None)

    def kill(self, req: Request) -> Response:
        self.processes.forget(req.params["process_id"])
        return Response(204, content_type=None)

    # -- files ---------------------------------------------------------------
    def _as(self, req: Request) -> AbstractContextManager[None]:
        """The block runs with the file permissions of the request's ``user``."""
        return acting_as(resolve(req.query.get("user"), req.headers.get(_DEFAULT_USER)))

    def read_file(self, req: Request) -> Response:
        # A reader that takes the digest after the bytes asks so as a writer sends it.
        trailing = req.headers.get(paths.DIGEST_HEADER.lower()) == paths.DIGEST_TRAILING
        with self._as(req):
            stream = self.files.open_read(req.query.get("path"), trailing=trailing)
        body: bytes | FileStream = stream.data if stream.data is not None else stream
        return Response(
            200,
            body,
            headers=[(paths.DIGEST_HEADER, stream.digest)],
            length=stream.body_length,
            content_type="application/octet-stream",
        )

    def write_file(self, req: Request) -> Response:
        digest = parse_digest(req.headers.get(paths.DIGEST_HEADER.lower()))
        mode = parse_mode(req.headers.get(paths.MODE_HEADER.lower()))
        with self._as(req):
            info = self.files.write(
                req.query.get("path"), req.body.readinto, digest, mode, req.body.length
            )
        return json_response(info)

    def delete_file(self, req: Request) -> Response:
        with self._as(req):
            self.files.delete(req.query.get("path"), _flag(req, "recursive"))
        return Response(204, content_type=None)

    def stat_file(self, req: Request) -> Response:
        with self._as(req):
            return json_response(self.files.stat(req.query.get("path"), _flag(req, "owner")))

    def list_dir(self, req: Request) -> Response:
        with self._as(req):
            return json_response(self.files.list(req.query.get("path")))

    def mkdir(self, req: Request) -> Response:
        body = _body(req, MakeDirRequest)
        with self._as(req):
            return json_response(self.files.mkdir(body))

    def chmod(self, req: Request) -> Response:
        body = _body(req, ChmodRequest)
        with self._as(req):
            return json_response(self.files.chmod(body))

    def move(self, req: Request) -> Response:
        body = _body(req, MoveRequest)
        with self._as(req):
            return json_response(self.files.move(body))
