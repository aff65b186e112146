"""The inspect_ai sandbox type ``"podbay"``: each sample of an eval runs in its own podbay sandbox.

    Task(dataset=..., solver=[use_tools(bash()), generate()], sandbox="podbay")  # the change

``pip install 'podbay[inspect-ai]'`` registers it through inspect's extension
entry point, so a task needs no import of ours. The server and token come
from the environment as for :class:`~podbay.SandboxClient`
(``ASTRO_AUTHZ_TOKEN``; the server is the token's issuer). Per task, optionally::

    sandbox=("podbay", PodbaySandboxEnvironmentConfig(sandbox_class="gvisor",
                                                      environment={"LANG": "C.UTF-8"},
                                                      user="user"))

Each sample attaches a sandbox of its own name (``inspect-<task>-<random>``) and
deletes it at clean-up (unless ``--no-sandbox-cleanup``: then
``inspect sandbox cleanup podbay [NAME]`` deletes them). ``exec`` maps input,
cwd, env, user, timeout and the output limit to podbay's exec and inspect's
exceptions; files go both ways as text or bytes, read natively (streamed,
digest-checked) and written by a command running as the sample's user, so the
kernel applies that user's permissions exactly as for any program it runs.
"""

from __future__ import annotations

import errno
import logging
import posixpath
import re
import shlex
import uuid
from typing import Any, Literal, overload

from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    sandboxenv,
)
from inspect_ai.util import SandboxUnavailableError as InspectSandboxUnavailableError
from inspect_ai.util._sandbox.lifecycle import sandbox_lifecycle_state
from pydantic import BaseModel, Field

from podbay.client import AsyncSandboxClient
from podbay.errors import SandboxRequestError, SandboxUnavailableError, shell_exit_code
from podbay.wire import limits
from podbay.wire.codes import ErrorCode

logger = logging.getLogger(__name__)

#: Every sandbox this integration creates starts so (``inspect sandbox cleanup podbay``).
NAME_PREFIX = "inspect-"
#: Writes are a command; they get the time inspect's Docker provider gives them.
WRITE_TIMEOUT_MS = 600_000
#: inspect's ``timeout=None`` means none: the contract's longest deadline, and an
#: HTTP wait just over it (inspect's own time limits still cancel the call).
_CLIENT_TIMEOUT_SECONDS = limits.EXEC_MAX_TIMEOUT_MS / 1000 + 1
#: Launched by absolute path with a fixed PATH (inspect's rule for commands a
#: provider runs itself): creates the parents, then opens the file for writing
#: as the sample's user, so a read-only file or a directory is refused as such.
_WRITE_SCRIPT = 'PATH=/usr/bin:/bin; mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'


class PodbaySandboxEnvironmentConfig(BaseModel, frozen=True):
    """Per-task settings of the ``podbay`` sandbox type (all optional).

    The identity token never goes here (configs are written into eval logs):
    it comes from ``ASTRO_AUTHZ_TOKEN``.
    """

    #: Isolation class (``container``, ``gvisor``, ``vm``); the server's default if unset.
    sandbox_class: str | None = None
    #: Environment variables for every command (a command's own ``env`` wins).
    environment: dict[str, str] = Field(default_factory=dict)
    #: The account commands and file calls run as by default (a command's own
    #: ``user`` wins); unset: the server's default (root unless the operator set one).
    user: str | None = None
    #: The per-sample working directory: relative paths and ``cwd`` resolve
    #: here. Created at sample start, owned by ``user`` when one is set.
    working_dir: str = limits.WORKSPACE
    #: The podbay server; unset: the token's issuer, as for ``SandboxClient``.
    server_url: str | None = None


def _config(config: SandboxEnvironmentConfigType | None) -> PodbaySandboxEnvironmentConfig:
    if config is None:
        return PodbaySandboxEnvironmentConfig()
    if isinstance(config, PodbaySandboxEnvironmentConfig):
        return config
    if isinstance(config, BaseModel):
        return PodbaySandboxEnvironmentConfig.model_validate(config.model_dump())
    raise ValueError(
        f"the podbay sandbox takes a PodbaySandboxEnvironmentConfig, not {config!r} "
        "(it has no config files)"
    )


def _client(config: PodbaySandboxEnvironmentConfig) -> AsyncSandboxClient:
    return AsyncSandboxClient(server_url=config.server_url, timeout_seconds=_CLIENT_TIMEOUT_SECONDS)


def sandbox_name(task_name: str) -> str:
    """A fresh sandbox name for one sample of ``task_name`` (the contract's name rules).

    >>> sandbox_name("my task/v2")[:19]
    'inspect-my-task-v2-'
    """
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", task_name).strip("-.")[:40]
    return f"{NAME_PREFIX}{slug + '-' if slug else ''}{uuid.uuid4().hex[:12]}"


def _human(size: int) -> str:
    """How inspect writes limits (``10 MiB``), for a limit it did not set itself."""
    for unit, scale in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"


class _Live:
    """Sandboxes an eval batch created and has not deleted yet (name -> server URL):
    what its final ``task_cleanup`` deletes. Kept on inspect's per-batch provider
    state, so parallel evals in one process never delete each other's."""

    def __init__(self) -> None:
        self.names: dict[str, str | None] = {}


_UNSCOPED = _Live()  # the provider driven directly, outside any eval


def _live() -> _Live:
    scope = sandbox_lifecycle_state()
    return scope.get(_Live) if scope is not None else _UNSCOPED


class PodbaySandboxEnvironment(SandboxEnvironment):
    """One podbay sandbox (by name) as an inspect ``SandboxEnvironment``."""

    def __init__(
        self,
        client: AsyncSandboxClient,
        name: str,
        config: PodbaySandboxEnvironmentConfig,
        live: _Live,
    ) -> None:
        super().__init__()
        self.client = client
        self.name = name
        self.config = config
        self._live = live
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return PodbaySandboxEnvironmentConfig(**config)

    @classmethod
    def default_concurrency(cls) -> int | None:
        # What one deployment may hold unless the operator raised it.
        return limits.DEFAULT_DEPLOYMENT_SANDBOX_CAP

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        # Fail before any sample starts when there is no token or the config is wrong.
        await _client(_config(config)).aclose()

    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        settings = _config(config)
        client = _client(settings)
        name = sandbox_name(task_name)
        live = _live()
        live.names[name] = settings.server_url
        env = cls(client, name, settings, live)
        try:
            await client.attach(name, settings.sandbox_class)
            if settings.user is not None or settings.working_dir != limits.WORKSPACE:
                await env._prepare_working_dir()
        except BaseException:
            await env._delete()
            raise
        return {"default": env}

    async def _prepare_working_dir(self) -> None:
        script = 'PATH=/usr/bin:/bin; mkdir -p -- "$1" && { [ -z "$2" ] || chown -- "$2" "$1"; }'
        result = await self.client.exec(
            self.name,
            ["/bin/sh", "-c", script, "podbay", self.config.working_dir, self.config.user or ""],
            user="root",
        )
        if result.exit_code != 0:
            raise RuntimeError(
                f"cannot prepare the working directory {self.config.working_dir!r} for user "
                f"{self.config.user!r} in sandbox {self.name!r}: {result.stderr.strip()}"
            )

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for environment in environments.values():
            if isinstance(environment, PodbaySandboxEnvironment):
                await environment._delete()

    async def _delete(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if await _delete(self.client, self.name):
                self._live.names.pop(self.name, None)
        finally:
            await self.client.aclose()

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        # inspect calls this once per config at the batch's end ("shutdown"): what
        # is left is what a sample's own clean-up could not delete, or was told not to.
        live = _live()
        left, live.names = live.names, {}
        if not cleanup:
            return
        for server_url in set(left.values()):
            names = {name for name, url in left.items() if url == server_url}
            await _delete_all(PodbaySandboxEnvironmentConfig(server_url=server_url), names)

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """``inspect sandbox cleanup podbay [NAME]``: that sandbox, or every one
        this integration created in the token's deployment."""
        settings = PodbaySandboxEnvironmentConfig()
        if id is not None:
            await _delete_all(settings, {id})
            return
        async with _client(settings) as client:
            names = {r.name for r in await client.list() if r.name.startswith(NAME_PREFIX)}
        await _delete_all(settings, names)

    # -- commands ----------------------------------------------------------------------

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,  # noqa: ASYNC109 - inspect's signature
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        # timeout_retry covers a container daemon that hangs; podbay's deadline is
        # the command's own (its whole tree is killed), so there is nothing to retry.
        self._check_open()
        cap = min(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE, limits.EXEC_OUTPUT_MAX)
        try:
            result = await self.client.exec(
                self.name,
                cmd,
                cwd=self._path(cwd if cwd is not None else "."),
                env={**self.config.environment, **(env or {})} or None,
                timeout_ms=timeout * 1000 if timeout is not None else None,
                user=user if user is not None else self.config.user,
                stdin=input,
                max_output_bytes=cap,
                keep="tail",
            )
        except SandboxRequestError as exc:
            return _start_failure(exc, cmd, user)
        except SandboxUnavailableError as exc:
            raise InspectSandboxUnavailableError(str(exc)) from exc
        if result.timed_out:
            error = TimeoutError(f"Command timed out after {timeout} seconds")
            # inspect shows the model what the command wrote before the deadline.
            error.truncated_output = result.stdout + result.stderr  # type: ignore[attr-defined]
            raise error
        if result.stdout_dropped or result.stderr_dropped:
            raise OutputLimitExceededError(_human(cap), result.stdout + result.stderr)
        return ExecResult(
            success=result.exit_code == 0,
            returncode=result.exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
        )

    # -- files -------------------------------------------------------------------------

    async def write_file(self, file: str, contents: str | bytes) -> None:
        self._check_open()
        data = contents.encode("utf-8") if isinstance(contents, str) else bytes(contents)
        path = self._path(file)
        try:
            result = await self.client.exec(
                self.name,
                ["/bin/sh", "-c", _WRITE_SCRIPT, "podbay-write", path],
                user=self.config.user,
                stdin=data,
                timeout_ms=WRITE_TIMEOUT_MS,
            )
        except SandboxUnavailableError as exc:
            raise InspectSandboxUnavailableError(str(exc)) from exc
        if result.timed_out:
            raise TimeoutError(f"writing {file} timed out")
        if result.exit_code != 0:
            reason = result.stderr.strip()
            if "Is a directory" in reason:
                raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
            if "Permission denied" in reason or "Read-only file system" in reason:
                raise PermissionError(errno.EACCES, "Permission denied", file)
            # mkdir -p says "File exists" when a parent on the path is a file.
            if "Not a directory" in reason or "File exists" in reason:
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", file)
            raise OSError(errno.EIO, f"cannot write: {reason}", file)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        self._check_open()
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE

        def within_limit(done: int, total: int | None) -> None:
            # Content-Length arrives with the first bytes: a file over the limit
            # stops there instead of being read whole.
            if max(done, total or 0) > limit:
                raise OutputLimitExceededError(
                    SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None
                )

        try:
            data = await self.client.read_file_bytes(
                self.name, self._path(file), progress=within_limit, user=self.config.user
            )
        except SandboxRequestError as exc:
            raise _path_error(exc, file) from exc
        except SandboxUnavailableError as exc:
            raise InspectSandboxUnavailableError(str(exc)) from exc
        # Strict: inspect's contract raises UnicodeDecodeError for text that is not UTF-8.
        return data.decode("utf-8") if text else data

    # -- connecting ----------------------------------------------------------------------

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        if self._closed:
            raise ConnectionError(f"podbay sandbox {self.name!r} was deleted")
        account = user if user is not None else self.config.user
        command = ["podbay", "sandbox", "shell", self.name, "--cwd", self.config.working_dir]
        if account is not None:
            command += ["--user", account]
        return SandboxConnection(type="podbay", command=shlex.join(command), container=self.name)

    def default_polling_interval(self) -> float:
        return 0.2

    # -- helpers -----------------------------------------------------------------------

    def _path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.config.working_dir, path))

    def _check_open(self) -> None:
        # Any call would attach the name again, creating a fresh sandbox.
        if self._closed:
            raise InspectSandboxUnavailableError(f"podbay sandbox {self.name!r} was deleted")


sandboxenv(name="podbay")(PodbaySandboxEnvironment)


def _start_failure(exc: SandboxRequestError, cmd: list[str], user: str | None) -> ExecResult[str]:
    """A command the agent could not start, as inspect expects it: a failed
    result as a shell would give it, or ``PermissionError`` for a file that
    may not be executed."""
    if exc.code == ErrorCode.COMMAND_START_FAILED:
        if "Permission denied" in exc.message:
            raise PermissionError(errno.EACCES, exc.message, cmd[0]) from exc
        # A shell's codes: 127 for a command not found, 126 for one (or a cwd) unusable.
        return ExecResult(False, shell_exit_code(exc) or 126, "", exc.message + "\n")
    if exc.code == ErrorCode.USER_UNKNOWN:
        return ExecResult(False, 126, "", exc.message + "\n")
    if exc.status >= 500 or exc.code in (
        ErrorCode.SANDBOX_NOT_FOUND,
        ErrorCode.SANDBOX_NOT_RUNNING,
        ErrorCode.AGENT_UNREACHABLE,
    ):
        raise InspectSandboxUnavailableError(str(exc)) from exc
    raise exc


def _path_error(exc: SandboxRequestError, file: str) -> Exception:
    """A refused file call as the OSError inspect's contract names."""
    if exc.code == ErrorCode.PATH_NOT_FOUND:
        return FileNotFoundError(errno.ENOENT, "No such file or directory", file)
    if exc.code == ErrorCode.PATH_IS_DIRECTORY:
        return IsADirectoryError(errno.EISDIR, "Is a directory", file)
    if exc.code == ErrorCode.PATH_ACCESS_DENIED:
        return PermissionError(errno.EACCES, "Permission denied", file)
    if exc.code == ErrorCode.PATH_NOT_DIRECTORY:
        return NotADirectoryError(errno.ENOTDIR, "Not a directory", file)
    if exc.code is not None and exc.code.startswith("PATH_"):
        return OSError(errno.EINVAL, exc.message, file)
    return exc


async def _delete_all(config: PodbaySandboxEnvironmentConfig, names: set[str]) -> None:
    async with _client(config) as client:
        for name in sorted(names):
            await _delete(client, name)


async def _delete(client: AsyncSandboxClient, name: str) -> bool:
    """Delete ``name``; whether it is gone. Clean-up reports, it never fails a sample."""
    try:
        await client.delete(name)
    except SandboxRequestError as exc:
        if exc.status == 404:  # never created (a refused attach), or already deleted
            return True
        logger.warning("could not delete podbay sandbox %r: %s", name, exc)
        return False
    except Exception as exc:  # noqa: BLE001 - logged; clean-up must not fail inspect's own
        logger.warning("could not delete podbay sandbox %r: %s", name, exc)
        return False
    return True
