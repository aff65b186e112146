"""The sans-I/O core both clients share: configuration, requests, answers, errors.

Nothing here sends a byte. :class:`Core` builds ``httpx.Request`` objects,
turns ``httpx.Response`` objects into results or exceptions, and keeps the
per-name handle cache; the sync and async clients add only sending and
sleeping. That keeps the two faces identical by construction, and lets every
rule of the contract (the exec deadline, the 202 loop, which refusals mean
"re-attach") be tested without a network.

>>> core = Core(Config(identity_token="t", server_url="http://cp"))
>>> core.exec_body(["ls"], timeout_ms=None)["timeout_ms"]  # one second under 30 s
29000
"""

from __future__ import annotations

import email.utils
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Concatenate, Literal, ParamSpec, Protocol, TypeVar
from urllib.parse import urlencode

import httpx

from podbay import __version__
from podbay.errors import SandboxRequestError, SandboxUnavailableError, refusal_error
from podbay.wire import codec, paths
from podbay.wire.codes import ErrorCode
from podbay.wire.control import (
    AttachRequest,
    EgressAudit,
    ForkRequest,
    ForkResult,
    NetworkPolicy,
    Preparing,
    SandboxHandle,
    SandboxList,
    SandboxRecord,
    ShareRequest,
    ShareUrl,
    Volume,
    VolumeCreate,
    VolumeEntry,
    VolumeEntryList,
    VolumeList,
)
from podbay.wire.data import (
    AgentInfo,
    ExecRequest,
    ExecResult,
    KeepPart,
    OutputEncoding,
    ProcessList,
    ProcessOutput,
    ProcessStatus,
    PtyRequest,
    SpawnRequest,
)
from podbay.wire.limits import DEFAULT_RETRY_AFTER_SECONDS, DEFAULT_SANDBOX_CLASS
from podbay.wire.observe import CommandList, EventList, Metrics

from ._config import DEFAULT_TIMEOUT_SECONDS as DEFAULT_TIMEOUT_SECONDS
from ._config import TOKEN_ENV as TOKEN_ENV
from ._config import exec_timeout_ms
from ._config import token_issuer as token_issuer
from ._options import AttachOptions

T = TypeVar("T")

DEFAULT_PREPARE_TIMEOUT_SECONDS = 900.0
#: How long attach rides over a server restarting (connection refused, then
#: 503 with ``Retry-After``) before giving up, once this client has been
#: answered by the server at least once.
RESTART_WAIT_SECONDS = 30.0
#: The same wait for a server this client has never reached: a refused first
#: contact is far more often a server that is not there (wrong URL, not started)
#: than one restarting, and the caller deserves "unavailable" quickly.
FIRST_CONTACT_WAIT_SECONDS = 3.0
#: A cached handle with less than this left before ``expires_at`` is renewed first.
HANDLE_REFRESH_MARGIN = timedelta(seconds=60)
#: What a fork's answer may take per copy beyond the request timeout: the
#: server's longest start (a vm guest under TCG, 120 s) and its copy.
FORK_START_SECONDS = 150.0
#: ``"auto"`` uses the native files API where ``/v1/info`` advertises it;
#: ``"native"`` insists on it; ``"base64"`` forces the reference's exec path.
FilesMode = Literal["auto", "native", "base64"]
FILES_MODES: tuple[str, ...] = ("auto", "native", "base64")


ClientT = TypeVar("ClientT")
ClientT_co = TypeVar("ClientT_co", covariant=True)
P = ParamSpec("P")
R = TypeVar("R")


class OneSandbox(Protocol[ClientT_co]):
    """A view of one sandbox: a client and the sandbox's name (``Sandbox``)."""

    @property
    def client(self) -> ClientT_co: ...

    @property
    def name(self) -> str: ...


def for_the_sandbox(
    method: Callable[Concatenate[ClientT, str, P], R],
) -> Callable[Concatenate[OneSandbox[ClientT], P], R]:
    """``method`` of a client as a method of a one-sandbox view: the view's
    client and name come first, the caller's arguments after, unchanged (the
    same parameters and return type for a type checker, one home for each)."""

    def forward(self: OneSandbox[ClientT], /, *args: P.args, **kwargs: P.kwargs) -> R:
        return method(self.client, self.name, *args, **kwargs)

    forward.__name__ = method.__name__
    forward.__qualname__ = method.__qualname__
    forward.__doc__ = method.__doc__
    return forward


@dataclass(frozen=True)
class Config:
    """What a client was built with. See :func:`resolve_config` for defaults."""

    identity_token: str
    server_url: str
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    prepare_timeout_seconds: float = DEFAULT_PREPARE_TIMEOUT_SECONDS
    files: FilesMode = "auto"

    def __post_init__(self) -> None:
        if self.timeout_seconds <= 1:
            raise ValueError("timeout_seconds must be above 1 (exec's deadline is 1 s under it)")
        if self.prepare_timeout_seconds < 0:
            raise ValueError("prepare_timeout_seconds must not be negative")
        if self.files not in FILES_MODES:
            raise ValueError(f"files must be one of {', '.join(FILES_MODES)}")
        if not self.server_url.startswith(("http://", "https://")):
            raise ValueError(f"server_url must start with http:// or https://: {self.server_url}")


def resolve_config(
    identity_token: str | None = None,
    server_url: str | None = None,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    prepare_timeout_seconds: float = DEFAULT_PREPARE_TIMEOUT_SECONDS,
    files: FilesMode = "auto",
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Fill the reference's defaults: the token from ``ASTRO_AUTHZ_TOKEN``,
    the server URL from the token's ``iss``."""
    env = os.environ if environ is None else environ
    token = identity_token or env.get(TOKEN_ENV)
    if not token:
        raise ValueError(f"no identity token: pass identity_token= or set {TOKEN_ENV}")
    url = server_url or token_issuer(token)
    return Config(
        identity_token=token,
        server_url=url.rstrip("/"),
        timeout_seconds=float(timeout_seconds),
        prepare_timeout_seconds=float(prepare_timeout_seconds),
        files=files,
    )


@dataclass
class _Entry:
    handle: SandboxHandle
    features: frozenset[str] | None = None  # None: /v1/info not asked yet


@dataclass
class Core:
    """Configuration plus the handle cache; builds requests and reads answers."""

    config: Config
    _handles: dict[str, _Entry] = field(default_factory=dict)
    #: Set once the control plane has answered this client (any status).
    server_answered: bool = False

    def restart_wait_seconds(self) -> float:
        """How long a refused attach may wait for the server to come (back)."""
        return RESTART_WAIT_SECONDS if self.server_answered else FIRST_CONTACT_WAIT_SECONDS

    # -- requests -------------------------------------------------------------

    @property
    def user_agent(self) -> str:
        return f"podbay-python/{__version__}"

    def _control(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        content: bytes | None = None,
    ) -> httpx.Request:
        headers = {
            "Authorization": f"Bearer {self.config.identity_token}",
            "User-Agent": self.user_agent,
        }
        return httpx.Request(
            method,
            self.config.server_url + path,
            headers=headers,
            json=json,
            params=params,
            content=content,
        )

    def attach_request(
        self, name: str, class_: str | None = None, options: AttachOptions | None = None
    ) -> httpx.Request:
        o = options or AttachOptions()
        body = codec.encode(
            AttachRequest(
                class_=class_ or DEFAULT_SANDBOX_CLASS,
                labels=None if o.labels is None else dict(o.labels),
                env=None if o.env is None else dict(o.env),
                cpus=o.cpus,
                memory_mib=o.memory_mib,
                idle_timeout_seconds=o.idle_timeout_seconds,
                network=o.network,
                volumes=None if o.volumes is None else dict(o.volumes),
            )
        )
        request = self._control("PUT", paths.sandbox_path(name), json=body)
        # This client waits through 202s itself (Retry-After, prepare_timeout_seconds):
        # the server need not hold the request for it (RFC 7240).
        request.headers[paths.PREFER_HEADER] = paths.PREFER_ASYNC
        return request

    def get_request(self, name: str) -> httpx.Request:
        return self._control("GET", paths.sandbox_path(name))

    def list_request(self, labels: Mapping[str, str] | None = None) -> httpx.Request:
        # ``?label=k=v`` once per label: the server lists sandboxes with all of them.
        query = urlencode([("label", f"{k}={v}") for k, v in (labels or {}).items()])
        return self._control("GET", paths.SANDBOXES + (f"?{query}" if query else ""))

    def stop_request(self, name: str) -> httpx.Request:
        return self._control("POST", paths.sandbox_stop_path(name))

    def delete_request(self, name: str) -> httpx.Request:
        return self._control("DELETE", paths.sandbox_path(name))

    def observe_request(self, name: str, what: str, since: datetime | None) -> httpx.Request:
        """``metrics``, ``events`` or ``commands`` of the sandbox (after ``since``)."""
        query = "" if since is None else "?" + urlencode({"since": codec.format_time(since)})
        return self._control("GET", f"{paths.sandbox_path(name)}/{what}{query}")

    def network_request(self, name: str, policy: NetworkPolicy | None = None) -> httpx.Request:
        """``GET`` the sandbox's egress policy, or ``PUT`` ``policy``."""
        if policy is None:
            return self._control("GET", paths.sandbox_network_path(name))
        return self._control("PUT", paths.sandbox_network_path(name), json=codec.encode(policy))

    def fork_request(self, name: str, new_names: list[str]) -> httpx.Request:
        """``POST`` a fork of the sandbox into ``new_names``. It is answered once
        every copy runs, and the copies start one after another, each within
        the server's start timeout (a vm guest under TCG: 120 s), so the
        answer is waited for that long per copy beyond the request timeout."""
        one = len(new_names) == 1
        body = ForkRequest(name=new_names[0]) if one else ForkRequest(names=new_names)
        request = self._control("POST", paths.sandbox_fork_path(name), json=codec.encode(body))
        timeout = self.config.timeout_seconds
        wait = timeout + FORK_START_SECONDS * len(new_names)
        request.extensions["timeout"] = httpx.Timeout(timeout, read=wait).as_dict()
        return request

    # -- volumes (docs/volumes.md) --------------------------------------------------
    def volume_create_request(
        self, name: str, size_bytes: int | None, size_mib: int | None
    ) -> httpx.Request:
        body = VolumeCreate(name=name, size_bytes=size_bytes, size_mib=size_mib)
        return self._control("POST", paths.VOLUMES, json=codec.encode(body))

    def volumes_request(self) -> httpx.Request:
        return self._control("GET", paths.VOLUMES)

    def volume_request(self, method: str, name: str) -> httpx.Request:
        """``GET`` or ``DELETE`` one volume."""
        return self._control(method, paths.volume_path(name))

    def volume_file_request(
        self, method: str, name: str, path: str, content: bytes | None = None
    ) -> httpx.Request:
        """``GET``, ``PUT`` (``content``) or ``DELETE`` a path of a volume."""
        return self._control(
            method, paths.volume_files_path(name), params={"path": path}, content=content
        )

    def volume_entries_request(self, name: str, path: str) -> httpx.Request:
        return self._control("GET", paths.volume_entries_path(name), params={"path": path})

    def parse_volume(self, response: httpx.Response) -> Volume:
        return self.expect(response, Volume, 200, 201)

    def parse_volumes(self, response: httpx.Response) -> list[Volume]:
        return self.expect(response, VolumeList, 200).volumes

    def parse_volume_entries(self, response: httpx.Response) -> list[VolumeEntry]:
        return self.expect(response, VolumeEntryList, 200).entries

    def egress_request(self, name: str) -> httpx.Request:
        """``GET`` the sandbox's egress audit."""
        return self._control("GET", paths.sandbox_egress_path(name))

    # Its parameters are the face's _data's on purpose: _data (each face, I/O)
    # re-attaches and retries, this builds the one request it sends.
    def data_request(
        self,
        handle: SandboxHandle,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str | int] | None = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Request:
        """A data-plane request: the handle's endpoint plus its opaque headers."""
        merged = {"User-Agent": self.user_agent, **handle.headers, **(headers or {})}
        url = handle.endpoint.rstrip("/") + path
        return httpx.Request(method, url, headers=merged, json=json, params=params, content=content)

    # -- terminals and ports ------------------------------------------------------------

    def share_request(self, name: str, port: int, expires_in_seconds: int) -> httpx.Request:
        body = codec.encode(ShareRequest(expires_in_seconds=expires_in_seconds))
        return self._control("POST", paths.port_share_path(name, port), json=body)

    def parse_share(self, response: httpx.Response) -> ShareUrl:
        return self.expect(response, ShareUrl, 200)

    @staticmethod
    def port_url(handle: SandboxHandle, port: int, path: str = "/") -> str:
        """The URL of ``path`` on ``port`` inside the sandbox, through the gateway."""
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError("port must be an integer from 1 to 65535")
        return f"{handle.endpoint.rstrip('/')}{paths.PORTS}/{port}/{path.lstrip('/')}"

    @staticmethod
    def ws_url(url: str) -> str:
        """``url`` with its scheme turned into the WebSocket one."""
        if url.startswith("https://"):
            return "wss://" + url[len("https://") :]
        return "ws://" + url.split("://", 1)[1]

    def ws_headers(self, handle: SandboxHandle) -> dict[str, str]:
        return {"User-Agent": self.user_agent, **handle.headers}

    @staticmethod
    def pty_start(
        command: list[str],
        *,
        rows: int,
        cols: int,
        term: str,
        cwd: str | None,
        env: Mapping[str, str] | None,
        user: str | None = None,
    ) -> str:
        """The first message of a terminal: what to start."""
        _check_argv(command)
        request = PtyRequest(
            command=list(command),
            cwd=cwd,
            env=dict(env) if env else None,
            rows=rows,
            cols=cols,
            term=term,
            user=user,
        )
        return codec.dumps(request).decode()

    @staticmethod
    def pty_exit(text: str) -> int:
        """A terminal's text message: its exit code, or the refusal it carries raised."""
        try:
            message = json.loads(text)
        except ValueError:
            message = None
        if (
            isinstance(message, dict)
            and message.get("type") == "exit"
            and isinstance(message.get("exit_code"), int)
        ):
            return int(message["exit_code"])
        raise refusal_error(400, text.encode())

    def exec_timeout_ms(self, requested: int | None) -> int:
        """The deadline exec sends: never later than one second under the request timeout."""
        return exec_timeout_ms(self.config.timeout_seconds, requested)

    def exec_body(
        self,
        command: list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_ms: int | None = None,
        user: str | None = None,
        output_encoding: OutputEncoding | None = None,
        max_output_bytes: int | None = None,
        keep: KeepPart | None = None,
    ) -> dict[str, Any]:
        """The exec request; the options beyond the reference only when given.

        Alike spawn_body below on purpose: each builds its own wire request,
        field by field, so the type checker checks every field."""
        _check_argv(command)
        body: dict[str, Any] = codec.encode(
            ExecRequest(
                command=list(command),
                cwd=cwd,
                env=dict(env) if env is not None else None,
                timeout_ms=self.exec_timeout_ms(timeout_ms),
                user=user,
                output_encoding=output_encoding,
                max_output_bytes=max_output_bytes,
                keep=keep,
            )
        )
        return body

    def spawn_body(
        self,
        command: list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        user: str | None = None,
    ) -> dict[str, Any]:
        """The spawn request (alike exec_body above on purpose, see there)."""
        _check_argv(command)
        body: dict[str, Any] = codec.encode(
            SpawnRequest(
                command=list(command),
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=True if stdin else None,
                user=user,
            )
        )
        return body

    def require(self, name: str, feature: str, what: str) -> None:
        """Refuse (501 ``FEATURE_UNSUPPORTED``) when the sandbox's agent lacks ``feature``."""
        features = self.features(name)
        if features is None or feature not in features:
            raise SandboxRequestError(
                501,
                f"this sandbox's agent does not offer {what} (feature {feature!r})",
                "FEATURE_UNSUPPORTED",
            )

    # -- handle cache ----------------------------------------------------------

    def cached(self, name: str, now: datetime | None = None) -> SandboxHandle | None:
        """The cached handle, unless it is missing or within a minute of expiring."""
        entry = self._handles.get(name)
        if entry is None:
            return None
        now = now or datetime.now(UTC)
        if entry.handle.expires_at - now < HANDLE_REFRESH_MARGIN:
            return None
        return entry.handle

    def store(self, name: str, handle: SandboxHandle) -> None:
        old = self._handles.get(name)
        features = old.features if old and old.handle.endpoint == handle.endpoint else None
        self._handles[name] = _Entry(handle, features)

    def forget(self, name: str) -> None:
        self._handles.pop(name, None)

    def features(self, name: str) -> frozenset[str] | None:
        entry = self._handles.get(name)
        return entry.features if entry else None

    def store_features(self, name: str, features: frozenset[str]) -> None:
        entry = self._handles.get(name)
        if entry is not None:
            entry.features = features

    def takes_trailing_digest(self, name: str) -> bool:
        """Whether the agent takes a write's digest after its content (one pass)."""
        features = self.features(name)
        return features is not None and paths.FEATURE_TRAILING_DIGEST in features

    def wants_native_files(self, features: frozenset[str] | None) -> bool:
        mode = self.config.files
        if mode == "base64":
            return False
        supported = features is not None and paths.FEATURE_FILES in features
        if mode == "native" and not supported:
            raise SandboxRequestError(
                501,
                "this sandbox's agent does not offer native files (files='native')",
                "FILES_UNSUPPORTED",
            )
        return supported

    # -- answers ---------------------------------------------------------------

    @staticmethod
    def is_credential_refusal(response: httpx.Response) -> bool:
        """401/403 from the data plane: answered before anything ran, so re-attach and repeat."""
        return response.status_code in (401, 403)

    @staticmethod
    def is_restart_refusal(response: httpx.Response) -> bool:
        """A 503 of a server restart (``response`` must be read): re-attach
        (riding over the restart) and repeat. ``SERVER_SHUTTING_DOWN``: the
        server stopped while the call ran; ``SANDBOXES_UNAVAILABLE`` with
        ``Retry-After``: a restarted server's gateway is still taking back its
        sandboxes (it held the call a while first)."""
        if response.status_code != 503:
            return False
        try:
            code = response.json().get("code")
        except (ValueError, AttributeError):
            return False
        return bool(
            code == ErrorCode.SERVER_SHUTTING_DOWN
            or (code == ErrorCode.SANDBOXES_UNAVAILABLE and "Retry-After" in response.headers)
        )

    @staticmethod
    def is_restarting(response: httpx.Response) -> bool:
        """A 503 with ``Retry-After``: the server is starting (just restarted) or
        still checking the class asked for; temporary, as it says."""
        return response.status_code == 503 and "Retry-After" in response.headers

    @staticmethod
    def never_connected(exc: SandboxUnavailableError) -> bool:
        """The connection was refused: nothing was sent (a server restarting)."""
        return isinstance(exc.cause, httpx.ConnectError)

    @staticmethod
    def retry_after(response: httpx.Response) -> float:
        """Seconds a 202 asks us to wait (delta seconds or an HTTP date); default 5."""
        raw = response.headers.get("Retry-After")
        if raw:
            try:
                return max(0.0, float(raw))
            except ValueError:
                try:
                    when = email.utils.parsedate_to_datetime(raw)
                    return max(0.0, (when - datetime.now(UTC)).total_seconds())
                except (TypeError, ValueError):
                    pass
        return float(DEFAULT_RETRY_AFTER_SECONDS)

    @staticmethod
    def refusal(response: httpx.Response) -> SandboxRequestError:
        """The exception for a non-2xx answer (``response`` must be read)."""
        return refusal_error(response.status_code, response.content, response.reason_phrase)

    def read_refusal(self, response: httpx.Response) -> SandboxRequestError:
        """A refused native read. The reference promises 404 for any path that cannot be
        read, so path refusals (a directory, denied, invalid) travel as 404 with their code."""
        error = self.refusal(response)
        if error.code and error.code.startswith("PATH_") and error.status != 404:
            return SandboxRequestError(404, error.message, error.code)
        return error

    def expect(self, response: httpx.Response, model: type[T], *status: int) -> T:
        self.check(response, *status)
        return decode(response, model)

    def check(self, response: httpx.Response, *status: int) -> None:
        if response.status_code not in (status or (200,)):
            raise self.refusal(response)

    # One-line decoders, one per answer, alike in shape on purpose: each names
    # the model and the statuses of its answer where both faces find it.
    def parse_handle(self, response: httpx.Response) -> SandboxHandle:
        return self.expect(response, SandboxHandle, 200, 201)

    def parse_record(self, response: httpx.Response) -> SandboxRecord:
        return self.expect(response, SandboxRecord, 200)

    def parse_metrics(self, response: httpx.Response) -> Metrics:
        return self.expect(response, Metrics, 200)

    def parse_events(self, response: httpx.Response) -> EventList:
        return self.expect(response, EventList, 200)

    def parse_commands(self, response: httpx.Response) -> CommandList:
        return self.expect(response, CommandList, 200)

    @staticmethod
    def parse_preparing(name: str, response: httpx.Response) -> Preparing:
        """A 202's body; a server that sends none (or another) still means "preparing"."""
        try:
            return codec.loads(Preparing, response.content, strict=False)
        except codec.WireError:
            return Preparing(name=name)

    def parse_network(self, response: httpx.Response) -> NetworkPolicy:
        return self.expect(response, NetworkPolicy, 200)

    def parse_fork(self, response: httpx.Response) -> ForkResult:
        """The fork's answer; each new sandbox's handle is kept for its calls."""
        result = self.expect(response, ForkResult, 200)
        for handle in result.sandboxes:
            self.store(handle.name, handle)
        return result

    def parse_egress(self, response: httpx.Response) -> EgressAudit:
        return self.expect(response, EgressAudit, 200)

    def parse_records(self, response: httpx.Response) -> list[SandboxRecord]:
        return self.expect(response, SandboxList, 200).sandboxes

    def parse_exec(self, response: httpx.Response) -> ExecResult:
        return self.expect(response, ExecResult, 200)

    def parse_status(self, response: httpx.Response) -> ProcessStatus:
        return self.expect(response, ProcessStatus, 200, 201)

    def parse_output(self, response: httpx.Response) -> ProcessOutput:
        return self.expect(response, ProcessOutput, 200)

    def parse_processes(self, response: httpx.Response) -> list[ProcessStatus]:
        return self.expect(response, ProcessList, 200).processes

    def parse_features(self, response: httpx.Response) -> frozenset[str]:
        """``/v1/info``'s features; an agent without ``/v1/info`` (404/405) has none."""
        if response.status_code in (404, 405):
            return frozenset()
        return frozenset(self.expect(response, AgentInfo, 200).features)


def decode(response: httpx.Response, model: type[T]) -> T:
    """Decode leniently (an old SDK must survive a newer server)."""
    try:
        return codec.loads(model, response.content, strict=False)
    except codec.WireError as exc:
        raise SandboxRequestError(
            response.status_code,
            f"unexpected answer from {response.request.method} {response.request.url}: {exc}",
            "RESPONSE_INVALID",
        ) from None


def unavailable(request: httpx.Request, exc: Exception) -> SandboxUnavailableError:
    """The one translation of an httpx transport failure; never retried."""
    kind = type(exc).__name__
    detail = str(exc) or kind
    return SandboxUnavailableError(
        f"{request.method} {request.url.copy_with(query=None)} failed: {kind}: {detail}", exc
    )


def _check_argv(command: Any) -> None:
    if isinstance(command, str | bytes) or not command:
        raise TypeError(
            "command is argv (a non-empty list of strings), not a shell line;"
            ' use ["/bin/sh", "-c", line] or exec_combined()'
        )
    if not all(isinstance(a, str) for a in command):
        raise TypeError("every argv element must be a str")
