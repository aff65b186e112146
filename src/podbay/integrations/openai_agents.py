"""A sandbox client for the OpenAI Agents SDK's sandbox agents, on podbay sandboxes.

    from agents import Runner, RunConfig
    from agents.sandbox import SandboxAgent, SandboxRunConfig
    from podbay.integrations.openai_agents import PodbaySandboxClient, PodbaySandboxClientOptions

    result = await Runner.run(agent, "...", run_config=RunConfig(sandbox=SandboxRunConfig(
        client=PodbaySandboxClient(),                                  # the one-line change
        options=PodbaySandboxClientOptions(name="thread-42"))))

The SDK's ``BaseSandboxClient`` / ``BaseSandboxSession`` interfaces: create
(attach by name: a new sandbox, or the existing one), resume from a saved
session state (the same sandbox by name while it exists, else a fresh one
hydrated from the state's snapshot), delete, exec (argv, timeout, the SDK's
``sudo -u`` user prefix as podbay's ``user``), files both ways through the
native files API, and workspace save/restore as a tar archive of the
manifest's root. ``pip install 'podbay[openai-agents]'``.
"""

from __future__ import annotations

import io
import shlex
import uuid
from pathlib import Path
from typing import Literal

from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceWriteTypeError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User

from podbay.client import AsyncSandboxClient
from podbay.errors import PodbayError, SandboxRequestError, SandboxUnavailableError

#: Room above a command's own timeout for the request that carries it.
_REQUEST_MARGIN_SECONDS = 60.0


class PodbaySandboxClientOptions(BaseSandboxClientOptions):
    """How :meth:`PodbaySandboxClient.create` makes a session.

    ``name``: the podbay sandbox (default: a fresh ``agents-<random>``); an
    existing sandbox of that name is attached as it is. ``sandbox_class``:
    ``gvisor``, ``container``, ``vm`` or the platform's default.
    ``delete_on_exit``: remove the sandbox when the session shuts down (the
    runner does that at the end of a run it started the session for); with
    ``False`` it stays (suspended when idle) and a later run with the same
    ``name`` continues in it.
    """

    type: Literal["podbay"] = "podbay"
    name: str | None = None
    sandbox_class: str | None = None
    delete_on_exit: bool = True


class PodbaySandboxSessionState(SandboxSessionState):
    """What a saved run needs to find its sandbox again."""

    type: Literal["podbay"] = "podbay"
    sandbox_name: str
    sandbox_class: str | None = None
    delete_on_exit: bool = True


class PodbaySandboxSession(BaseSandboxSession):
    """One podbay sandbox as an SDK sandbox session."""

    state: PodbaySandboxSessionState

    def __init__(self, *, state: PodbaySandboxSessionState, client: AsyncSandboxClient) -> None:
        self.state = state
        self._client = client

    @property
    def sandbox_name(self) -> str:
        return self.state.sandbox_name

    async def _prepare_backend_workspace(self) -> None:
        await self._client.attach(self.sandbox_name, self.state.sandbox_class)
        root = self._workspace_root_path().as_posix()
        await self._client.mkdir(self.sandbox_name, root, parents=True)

    async def _exec_internal(
        self,
        *command: str | Path,
        timeout: float | None = None,  # noqa: ASYNC109 - the SDK's signature; the platform enforces it
    ) -> ExecResult:
        argv = [str(part) for part in command]
        user: str | None = None
        # SandboxSession.exec spells a user as a `sudo -u NAME --` prefix; podbay
        # runs the command as that account itself (sudo is inert in sandboxes).
        if len(argv) >= 4 and argv[0] == "sudo" and argv[1] == "-u" and argv[3] == "--":
            user, argv = argv[2], argv[4:]
        env = await self.state.manifest.environment.resolve()
        try:
            result = await self._client.exec_bytes(
                self.sandbox_name,
                argv,
                cwd=self.state.manifest.root if self.state.workspace_root_ready else None,
                env=env or None,
                timeout_ms=None if timeout is None else max(1, int(timeout * 1000)),
                user=user,
            )
        except SandboxUnavailableError as exc:
            raise ExecTransportError(command=command, cause=exc) from exc
        except SandboxRequestError as exc:
            raise ExecTransportError(command=command, cause=exc, message=str(exc)) from exc
        if result.timed_out:
            raise ExecTimeoutError(command=command, timeout_s=timeout)
        return ExecResult(stdout=result.stdout, stderr=result.stderr, exit_code=result.exit_code)

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        target = await self._validate_path_access(path)
        try:
            data = await self._client.read_file_bytes(
                self.sandbox_name, target.as_posix(), user=_user_name(user)
            )
        except SandboxRequestError as exc:
            if exc.code == "PATH_NOT_FOUND":
                raise WorkspaceReadNotFoundError(path=path, cause=exc) from exc
            raise WorkspaceArchiveReadError(path=path, cause=exc) from exc
        except PodbayError as exc:
            raise WorkspaceArchiveReadError(path=path, cause=exc) from exc
        return io.BytesIO(data)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if not isinstance(payload, bytes | bytearray):
            raise WorkspaceWriteTypeError(path=path, actual_type=type(payload).__name__)
        target = await self._validate_path_access(path, for_write=True)
        try:
            await self._client.write_file_bytes(
                self.sandbox_name, target.as_posix(), bytes(payload), user=_user_name(user)
            )
        except PodbayError as exc:
            raise WorkspaceArchiveWriteError(path=target, cause=exc) from exc

    async def running(self) -> bool:
        if not self.state.workspace_root_ready:
            return False
        try:
            record = await self._client.get(self.sandbox_name)
        except PodbayError:
            return False
        # A suspended sandbox resumes on its next command: it needs no start().
        return record.state in ("running", "suspended")

    async def persist_workspace(self) -> io.IOBase:
        """The workspace root as a tar archive (made in the sandbox, then downloaded)."""
        root = self._workspace_root_path()
        archive = f"/tmp/podbay-workspace-{uuid.uuid4().hex}.tar"
        excludes = [
            f"--exclude=./{rel.as_posix()}" for rel in self._persist_workspace_skip_relpaths()
        ]
        try:
            await self._checked(["tar", *excludes, "-C", root.as_posix(), "-cf", archive, "."])
            data = await self._client.read_file_bytes(self.sandbox_name, archive)
        except PodbayError as exc:
            raise WorkspaceArchiveReadError(path=root, cause=exc) from exc
        finally:
            await self._client.exec(self.sandbox_name, ["rm", "-f", archive])
        return io.BytesIO(data)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Unpack a tar archive from :meth:`persist_workspace` into the workspace root."""
        root = self._workspace_root_path()
        raw = data.read()
        if isinstance(raw, str):
            raw = raw.encode("utf-8")
        if not isinstance(raw, bytes | bytearray):
            raise WorkspaceWriteTypeError(path=root, actual_type=type(raw).__name__)
        archive = f"/tmp/podbay-workspace-{uuid.uuid4().hex}.tar"
        try:
            await self._client.write_file_bytes(self.sandbox_name, archive, bytes(raw))
            await self._checked(["mkdir", "-p", root.as_posix()])
            # No absolute names, no `..`, no links out: GNU tar refuses them by default.
            await self._checked(["tar", "-C", root.as_posix(), "-xf", archive])
        except PodbayError as exc:
            raise WorkspaceArchiveWriteError(path=root, cause=exc) from exc
        finally:
            await self._client.exec(self.sandbox_name, ["rm", "-f", archive])

    async def _checked(self, argv: list[str]) -> None:
        result = await self._client.exec(self.sandbox_name, argv)
        if result.exit_code != 0:
            detail = (result.stderr or result.stdout).strip()[-500:]
            raise SandboxRequestError(500, f"{shlex.join(argv)} failed: {detail}", None)

    async def _shutdown_backend(self) -> None:
        if self.state.delete_on_exit:
            await self._client.delete(self.sandbox_name)


class PodbaySandboxClient(BaseSandboxClient[PodbaySandboxClientOptions]):
    """Creates and resumes :class:`PodbaySandboxSession` objects.

    ``client`` defaults to ``AsyncSandboxClient()`` (``ASTRO_AUTHZ_TOKEN`` from
    the environment) with room for ``exec_timeout_seconds`` per command.
    """

    backend_id = "podbay"
    supports_default_options = True

    def __init__(
        self,
        *,
        client: AsyncSandboxClient | None = None,
        exec_timeout_seconds: float = 600.0,
        instrumentation: Instrumentation | None = None,
        dependencies: Dependencies | None = None,
    ) -> None:
        self.client = (
            client
            if client is not None
            else AsyncSandboxClient(timeout_seconds=exec_timeout_seconds + _REQUEST_MARGIN_SECONDS)
        )
        self._instrumentation = (
            instrumentation if instrumentation is not None else Instrumentation()
        )
        self._dependencies = dependencies

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: PodbaySandboxClientOptions | None = None,
    ) -> SandboxSession:
        options = options if options is not None else PodbaySandboxClientOptions()
        manifest = self._validate_manifest_for_create(
            manifest if manifest is not None else Manifest()
        )
        session_id = uuid.uuid4()
        state = PodbaySandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            sandbox_name=options.name or f"agents-{session_id.hex[:12]}",
            sandbox_class=options.sandbox_class,
            delete_on_exit=options.delete_on_exit,
        )
        inner = PodbaySandboxSession(state=state, client=self.client)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, PodbaySandboxSessionState):
            raise TypeError("PodbaySandboxClient.resume expects a PodbaySandboxSessionState")
        state.assert_path_grants_rebound()
        try:
            await self.client.get(state.sandbox_name)
            alive = True
        except SandboxRequestError as exc:
            if exc.status != 404:
                raise
            alive = False
        if not alive:
            # A fresh sandbox of the same name: the workspace comes from the snapshot.
            state.workspace_root_ready = False
        inner = PodbaySandboxSession(state=state, client=self.client)
        inner._set_start_state_preserved(alive, system=alive)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """The runner's clean-up call: the sandbox went (or stayed) at shutdown,
        as its ``delete_on_exit`` said; :meth:`delete_sandbox` removes one by name."""
        if not isinstance(session._inner, PodbaySandboxSession):
            raise TypeError("PodbaySandboxClient.delete expects a PodbaySandboxSession")
        return session

    async def delete_sandbox(self, name: str) -> None:
        """Remove the sandbox ``name`` and its files."""
        await self.client.delete(name)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, PodbaySandboxSessionState)


def _user_name(user: str | User | None) -> str | None:
    return user.name if isinstance(user, User) else user
