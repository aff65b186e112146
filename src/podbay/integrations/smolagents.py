"""A smolagents remote Python executor that runs the agent's code in a podbay sandbox.

    from podbay.integrations.smolagents import PodbayExecutor

    agent = CodeAgent(tools=[], model=model,
                      executor=PodbayExecutor([], sandbox="thread-42"))   # the one-line change

Built on :meth:`~podbay.SandboxClient.run_code`: one stateful interpreter per
sandbox, so variables and tool definitions persist between the agent's steps,
as with smolagents' E2B executor. ``pip install 'podbay[smolagents]'``.
"""

from __future__ import annotations

import base64
from io import BytesIO
from typing import Any

from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.utils import AgentError

from podbay.client import SandboxClient

#: Checks which top-level modules the sandbox lacks (only those are installed).
_MISSING = "import importlib.util as _u\n[_m for _m in {modules!r} if _u.find_spec(_m) is None]"


class PodbayExecutor(RemotePythonExecutor):
    """smolagents' ``RemotePythonExecutor`` over a podbay sandbox (by name).

    ``client`` defaults to ``SandboxClient()`` (``ASTRO_AUTHZ_TOKEN``), closed by
    :meth:`cleanup`; a client passed in stays the caller's. ``timeout_ms``
    bounds each step (the cell is interrupted; the interpreter stays).
    """

    def __init__(
        self,
        additional_imports: list[str],
        logger: AgentLogger | None = None,
        *,
        sandbox: str,
        client: SandboxClient | None = None,
        allow_pickle: bool = False,
        timeout_ms: int | None = None,
    ) -> None:
        super().__init__(
            additional_imports, logger or AgentLogger(level=LogLevel.INFO), allow_pickle
        )
        self._owns_client = client is None
        self.client = client if client is not None else SandboxClient()
        self.sandbox = self.client.sandbox(sandbox)
        self.timeout_ms = timeout_ms
        self.installed_packages = self.install_packages(additional_imports)
        self.logger.log(f"podbay sandbox {sandbox!r} is running", level=LogLevel.INFO)

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """pip-installs the imports the sandbox lacks (declaring them in the
        deployment's environment is faster: built once, cached)."""
        modules = sorted(
            {
                name.split(".")[0]
                for name in additional_imports
                if name and name != "*" and not name.endswith("*")
            }
        )
        if not modules:
            return additional_imports
        missing = self.sandbox.run_code(_MISSING.format(modules=modules)).text
        wanted = [m for m in modules if missing is not None and repr(m) in missing]
        if wanted:
            # The sandbox is disposable and its Python is the image's own (PEP 668 marks it).
            result = self.sandbox.exec(
                ["python3", "-m", "pip", "install", "--quiet", "--break-system-packages", *wanted]
            )
            if result.exit_code != 0:
                self.logger.log(
                    f"pip install {' '.join(wanted)} failed: {result.stderr[-2000:]}",
                    level=LogLevel.INFO,
                )
        return additional_imports

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        execution = self.sandbox.run_code(code, timeout_ms=self.timeout_ms)
        logs = execution.stdout + execution.stderr
        error = execution.error
        if error is not None:
            if error.name == RemotePythonExecutor.FINAL_ANSWER_EXCEPTION:
                answer = self._deserialize_final_answer(error.value, self.allow_pickle)
                return CodeOutput(output=answer, logs=logs, is_final_answer=True)
            raise AgentError(
                f"{logs}\nExecuting code yielded an error:\n{error.name}\n"
                f"{error.value}\n{error.traceback}",
                self.logger,
            )
        main = execution.result
        if main is None:
            return CodeOutput(output=None, logs=logs, is_final_answer=False)
        return CodeOutput(output=_value(main.formats), logs=logs, is_final_answer=False)

    def cleanup(self) -> None:
        if self._owns_client:
            self.client.close()

    def delete(self) -> None:
        """Drop the sandbox and its files, then clean up."""
        self.sandbox.delete()
        self.cleanup()


def _value(formats: dict[str, Any]) -> Any:
    """The richest representation, as smolagents' E2B executor picks it."""
    for mime in ("image/jpeg", "image/png"):
        data = formats.get(mime)
        if isinstance(data, str):
            import PIL.Image

            return PIL.Image.open(BytesIO(base64.b64decode(data)))
    for mime in (
        "application/json",
        "text/html",
        "text/markdown",
        "text/latex",
        "image/svg+xml",
        "text/plain",
    ):
        if mime in formats:
            return formats[mime]
    return None
