"""A LangChain deepagents sandbox backend over a podbay sandbox.

    from deepagents import create_deep_agent
    from podbay.integrations.deepagents import PodbaySandbox

    agent = create_deep_agent(model=model,
                              backend=PodbaySandbox("thread-42"))   # the one-line change

deepagents' ``BaseSandbox`` derives ls/read/write/edit/grep/glob from three
primitives, implemented here on the podbay SDK: ``execute`` (one exec, stderr
folded into stdout as a terminal shows it), ``upload_files`` and
``download_files`` (the native files API, checked by SHA-256; parent
directories are created). The async variants run these in a worker thread, as
``BaseSandbox`` does by default. ``pip install 'podbay[deepagents]'``.
"""

from __future__ import annotations

from typing import Final

from deepagents.backends.protocol import (
    ExecuteResponse,
    FileDownloadResponse,
    FileOperationError,
    FileUploadResponse,
)
from deepagents.backends.sandbox import BaseSandbox

from podbay.client import Sandbox, SandboxClient
from podbay.errors import PodbayError, SandboxRequestError

#: Seconds a command may run when the caller names no timeout (deepagents'
#: local shell backend uses the same default).
DEFAULT_EXECUTE_TIMEOUT: Final = 120
#: Output kept per command before it is cut (and ``truncated`` set); the
#: platform's exec allows up to 16 MiB.
DEFAULT_MAX_OUTPUT_BYTES: Final = 4 * 1024 * 1024

#: The platform's file refusals in deepagents' words (anything else is passed
#: on as the platform's own message).
_FILE_ERRORS: Final[dict[str, FileOperationError]] = {
    "PATH_NOT_FOUND": "file_not_found",
    "PATH_IS_DIRECTORY": "is_directory",
    "PATH_ACCESS_DENIED": "permission_denied",
    "PATH_NOT_DIRECTORY": "invalid_path",
    "PATH_INVALID": "invalid_path",
}


class PodbaySandbox(BaseSandbox):
    """deepagents' ``SandboxBackendProtocol`` for the podbay sandbox ``name``.

    ``client`` defaults to ``SandboxClient()`` (``ASTRO_AUTHZ_TOKEN`` from the
    environment), closed by :meth:`close`; a client passed in stays the
    caller's. The sandbox is attached (created or resumed) on first use.

    A command runs at most ``timeout`` seconds (``default_timeout`` when
    ``None``, and as long as the client's request timeout allows when ``0``);
    the platform kills it with its whole process tree after that. Commands
    are also bounded by the client's ``timeout_seconds``, so the client made
    here allows ``default_timeout`` plus a minute.

    ``delete(path)`` is deepagents' file deletion; the sandbox itself is
    removed with :meth:`delete_sandbox`.
    """

    def __init__(
        self,
        name: str,
        *,
        client: SandboxClient | None = None,
        default_timeout: int = DEFAULT_EXECUTE_TIMEOUT,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        if default_timeout <= 0:
            raise ValueError(f"default_timeout must be positive, got {default_timeout}")
        self._owns_client = client is None
        self.client = (
            client if client is not None else SandboxClient(timeout_seconds=default_timeout + 60)
        )
        self.sandbox: Sandbox = self.client.sandbox(name)
        self._name = name
        self.default_timeout = default_timeout
        self.max_output_bytes = max_output_bytes

    @property
    def id(self) -> str:
        return self._name

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        if not command:
            return ExecuteResponse(output="Error: the command is empty.", exit_code=1)
        seconds = self.default_timeout if timeout is None else timeout
        if seconds < 0:
            raise ValueError(f"timeout must not be negative, got {seconds}")
        # 0 asks for no timeout: the longest the client's request allows.
        timeout_ms = None if seconds == 0 else seconds * 1000
        result = self.sandbox.exec(
            ["/bin/sh", "-c", f"exec 2>&1\n{command}"],
            timeout_ms=timeout_ms,
            max_output_bytes=self.max_output_bytes,
            keep="head_tail",
        )
        output = result.stdout
        if result.timed_out:
            took = result.duration_ms / 1000
            output += f"\nError: the command timed out after {took:.0f} seconds and was killed."
            return ExecuteResponse(output=output, exit_code=124, truncated=result.truncated)
        return ExecuteResponse(
            output=output, exit_code=result.exit_code, truncated=result.truncated
        )

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        responses = []
        for path, content in files:
            if not path.startswith("/"):
                # deepagents' paths are absolute; a relative one would land
                # wherever the sandbox's working directory happens to be.
                responses.append(FileUploadResponse(path=path, error="invalid_path"))
                continue
            try:
                self.sandbox.write_file_bytes(path, content)
            except PodbayError as exc:
                responses.append(FileUploadResponse(path=path, error=_file_error(exc)))
            else:
                responses.append(FileUploadResponse(path=path, error=None))
        return responses

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        responses = []
        for path in paths:
            if not path.startswith("/"):
                responses.append(FileDownloadResponse(path=path, error="invalid_path"))
                continue
            try:
                content = self.sandbox.read_file_bytes(path)
            except PodbayError as exc:
                responses.append(FileDownloadResponse(path=path, error=_file_error(exc)))
            else:
                responses.append(FileDownloadResponse(path=path, content=content, error=None))
        return responses

    def delete_sandbox(self) -> None:
        """Remove the sandbox and its files (the next use creates a fresh one)."""
        self.sandbox.delete()

    def close(self) -> None:
        """Close the client if this backend made it."""
        if self._owns_client:
            self.client.close()


def _file_error(exc: PodbayError) -> FileOperationError | str:
    """deepagents' code for a refusal it names; otherwise the platform's own message
    (the protocol wants per-file results, so an unreachable platform is one too)."""
    code = exc.code if isinstance(exc, SandboxRequestError) else None
    return _FILE_ERRORS.get(code or "", str(exc))
