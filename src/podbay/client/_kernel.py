"""The code interpreter's kernel: a stateful Python interpreter INSIDE the sandbox.

This file is not imported by the SDK: its source is uploaded into the sandbox
and started there (``python3 kernel.py PORT TOKEN_FILE``) by
:meth:`~podbay.SandboxClient.run_code`. It uses only the standard library
(any Python 3.8+ the sandbox has will do) and serves HTTP on
``127.0.0.1:PORT``, which the SDK reaches through the gateway's port relay
(``/v1/ports/PORT/...``): nothing of it runs on the host.

Protocol (JSON bodies; every request carries ``X-Podbay-Interpreter-Token``,
the random token the kernel wrote to ``TOKEN_FILE``, mode 0600, so another
user's process in the sandbox cannot run code as the kernel's user):

- ``GET /health`` -> ``{"protocol", "kernel_id", "pid", "execution_count"}``
- ``POST /run`` ``{"code", "timeout_ms", "env"}`` -> ``{"stdout", "stderr", "results",
  "error", "execution_count", "kernel_id", "timed_out"}``; one cell at a time
  (a second waits), run in the main thread so SIGINT can interrupt it;
  ``env`` (optional) is set in ``os.environ`` for this cell only. With
  ``"stream": true`` the answer is chunked JSON lines instead: ``{"stream":
  "stdout"|"stderr", "text"}`` as the cell writes, then ``{"done": <the
  answer above>}``.
- ``POST /interrupt`` -> ``{"interrupted": bool}``: KeyboardInterrupt in the
  running cell; the interpreter and its state stay.

A result is ``{"main": bool, "formats": {mime: data}}``: ``text/plain`` (the
repr), and where the object offers them ``image/png`` (base64),
``image/svg+xml``, ``text/html``, ``text/markdown``, ``application/json``; a
matplotlib figure (returned, or left open by the cell) becomes a PNG.
"""

from __future__ import annotations

import ast
import base64
import builtins
import io
import json
import linecache
import os
import queue
import secrets
import signal
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

PROTOCOL = 1
MAX_BODY = 16 * 1024 * 1024
#: Characters kept per stream and cell; the rest is counted and dropped.
OUTPUT_CAP = 1024 * 1024
TOKEN_HEADER = "X-Podbay-Interpreter-Token"

REPR_METHODS = (
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
)


class Capture(io.TextIOBase):
    """A cell's stdout or stderr, capped at :data:`OUTPUT_CAP` characters."""

    def __init__(self, name: str = "", events: queue.Queue[Any] | None = None) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.dropped = 0
        #: Where a streamed cell's writes also go, as ``(name, text)``.
        self.name = name
        self.events = events

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not " + type(text).__name__)
        room = OUTPUT_CAP - self.size
        if len(text) > room:
            self.dropped += len(text) - max(room, 0)
            text = text[: max(room, 0)]
        self.parts.append(text)
        self.size += len(text)
        if self.events is not None and text:
            self.events.put((self.name, text))
        return len(text)

    def text(self) -> str:
        out = "".join(self.parts)
        if self.dropped:
            out += f"\n[... {self.dropped} characters dropped]\n"
        return out


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _is_figure(obj: object) -> bool:
    module = sys.modules.get("matplotlib.figure")
    return module is not None and isinstance(obj, module.Figure)


def formats(obj: object) -> dict[str, Any]:
    """Every representation ``obj`` offers, by MIME type."""
    data: dict[str, Any] = {}
    try:
        data["text/plain"] = repr(obj)
    except Exception as exc:  # noqa: BLE001 - a broken __repr__ must not lose the cell
        data["text/plain"] = f"<repr failed: {type(exc).__name__}: {exc}>"
    if _is_figure(obj):
        data["image/png"] = _png(obj)
    if isinstance(obj, type):
        return data
    for method, mime in REPR_METHODS:
        func = getattr(obj, method, None)
        if not callable(func):
            continue
        try:
            value = func()
        # User code: an optional representation that fails is left out, the text one stays.
        except Exception:  # noqa: BLE001, S112
            continue
        if isinstance(value, tuple):  # (data, metadata)
            value = value[0]
        if value is None:
            continue
        if mime in ("image/png", "image/jpeg"):
            if isinstance(value, bytes):
                value = base64.b64encode(value).decode("ascii")
            elif not isinstance(value, str):
                continue
        elif mime == "application/json":
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                continue
        elif not isinstance(value, str):
            continue
        data[mime] = value
    return data


def open_figures(skip: object) -> list[dict[str, Any]]:
    """PNGs of the figures a cell left open (then closed), as Jupyter's inline backend."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return []
    shown = []
    for number in pyplot.get_fignums():
        figure = pyplot.figure(number)
        if figure is not skip:
            shown.append(
                {"main": False, "formats": {"text/plain": repr(figure), "image/png": _png(figure)}}
            )
    pyplot.close("all")
    return shown


class Kernel:
    def __init__(self) -> None:
        self.kernel_id = secrets.token_hex(8)
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self.count = 0
        self.jobs: queue.Queue[dict[str, Any]] = queue.Queue()
        self.one_at_a_time = threading.Lock()
        self.state = threading.Lock()
        self.running = False
        self.timed_out = False
        self.main = threading.get_ident()  # built in the main thread

    # -- the main thread ------------------------------------------------------------
    def on_sigint(self, signum: int, frame: FrameType | None) -> None:
        # Only a running cell is interrupted; between cells the signal is moot.
        if self.running:
            raise KeyboardInterrupt

    def loop(self) -> None:
        signal.signal(signal.SIGINT, self.on_sigint)
        while True:
            job = self.jobs.get()
            try:
                job["result"] = self.execute(
                    job["code"], job["timeout_ms"], job.get("env"), job.get("events")
                )
            except KeyboardInterrupt:  # landed after the cell ended: it is done anyway
                job["result"] = job.get("result") or self.interrupted_late()
            job["done"].set()
            if job.get("events") is not None:
                job["events"].put(None)

    def interrupted_late(self) -> dict[str, Any]:
        return {
            "stdout": "",
            "stderr": "",
            "results": [],
            "error": {"name": "KeyboardInterrupt", "value": "", "traceback": "KeyboardInterrupt\n"},
            "execution_count": self.count,
            "kernel_id": self.kernel_id,
            "timed_out": self.timed_out,
        }

    def execute(
        self,
        code: str,
        timeout_ms: int | None,
        env: dict[str, str] | None = None,
        events: queue.Queue[Any] | None = None,
    ) -> dict[str, Any]:
        self.count += 1
        saved_env = {key: os.environ.get(key) for key in env or {}}
        os.environ.update(env or {})
        filename = f"<cell-{self.count}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        stdout, stderr = Capture("stdout", events), Capture("stderr", events)
        saved = sys.stdout, sys.stderr
        value: Any = None
        error: dict[str, str] | None = None
        timer: threading.Timer | None = None
        self.timed_out = False
        if timeout_ms:
            timer = threading.Timer(timeout_ms / 1000.0, self.interrupt, kwargs={"timeout": True})
            timer.daemon = True
        sys.stdout, sys.stderr = stdout, stderr
        try:
            with self.state:
                self.running = True
            if timer is not None:
                timer.start()
            tree = ast.parse(code, filename, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body[-1].value)
                tree.body.pop()
            exec(compile(tree, filename, "exec"), self.namespace)  # noqa: S102 - the product
            if last is not None:
                value = eval(compile(last, filename, "eval"), self.namespace)  # noqa: S307
        # User code: SystemExit and KeyboardInterrupt included, all reported as the cell's error.
        except BaseException as exc:  # noqa: BLE001
            error = self.describe(exc)
        finally:
            with self.state:
                self.running = False
            if timer is not None:
                timer.cancel()
            sys.stdout, sys.stderr = saved
            for key, old in saved_env.items():
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old
        results = []
        if value is not None:
            self.namespace["_"] = value
            results.append({"main": True, "formats": formats(value)})
        try:
            results.extend(open_figures(value))
        except Exception as exc:  # noqa: BLE001 - user code's figure: reported as the cell's error
            if error is None:
                error = self.describe(exc)
        return {
            "stdout": stdout.text(),
            "stderr": stderr.text(),
            "results": results,
            "error": error,
            "execution_count": self.count,
            "kernel_id": self.kernel_id,
            "timed_out": self.timed_out,
        }

    @staticmethod
    def describe(exc: BaseException) -> dict[str, str]:
        tb = exc.__traceback__
        # The first frame is this kernel's exec/eval call: the cell's start after it.
        if tb is not None and tb.tb_next is not None and not isinstance(exc, SyntaxError):
            tb = tb.tb_next
        elif isinstance(exc, SyntaxError):
            tb = None
        lines = traceback.format_exception(type(exc), exc, tb)
        return {"name": type(exc).__name__, "value": str(exc), "traceback": "".join(lines)}

    # -- the HTTP threads -------------------------------------------------------------
    def interrupt(self, timeout: bool = False) -> bool:
        with self.state:
            if not self.running:
                return False
            if timeout:
                self.timed_out = True
            signal.pthread_kill(self.main, signal.SIGINT)
            return True

    def run(
        self, code: str, timeout_ms: int | None, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        with self.one_at_a_time:
            job: dict[str, Any] = {
                "code": code,
                "timeout_ms": timeout_ms,
                "env": env,
                "done": threading.Event(),
            }
            self.jobs.put(job)
            job["done"].wait()
            result: dict[str, Any] = job["result"]
            return result

    def run_streamed(
        self, code: str, timeout_ms: int | None, env: dict[str, str] | None, emit: Any
    ) -> None:
        """Like :meth:`run`, calling ``emit`` with each write of the cell (writes
        that arrived together are joined) and then with the answer."""
        with self.one_at_a_time:
            events: queue.Queue[Any] = queue.Queue()
            job: dict[str, Any] = {
                "code": code,
                "timeout_ms": timeout_ms,
                "env": env,
                "done": threading.Event(),
                "events": events,
            }
            self.jobs.put(job)
            finished = False
            while not finished:
                batch = [events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                for name in ("stdout", "stderr"):
                    text = "".join(item[1] for item in batch if item and item[0] == name)
                    if text:
                        emit({"stream": name, "text": text})
                finished = None in batch
            job["done"].wait()
            emit({"done": job["result"]})

    def health(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "kernel_id": self.kernel_id,
            "pid": os.getpid(),
            "execution_count": self.count,
        }


def make_handler(kernel: Kernel, token: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def stream(self, produce: Any) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            produce()
            self.wfile.write(b"0\r\n\r\n")

        def chunk(self, item: dict[str, Any]) -> None:
            data = json.dumps(item).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def allowed(self) -> bool:
            given = self.headers.get(TOKEN_HEADER, "")
            if secrets.compare_digest(given.encode(), token.encode()):
                return True
            self.answer(
                401,
                {
                    "code": "INTERPRETER_TOKEN_INVALID",
                    "message": "wrong or missing interpreter token",
                },
            )
            return False

        def body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                raise ValueError("body too large")
            payload = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(payload, dict):
                raise ValueError("body must be an object")
            return payload

        def do_GET(self) -> None:
            if not self.allowed():
                return
            if self.path == "/health":
                self.answer(200, kernel.health())
            else:
                self.answer(404, {"code": "NOT_FOUND", "message": self.path})

        def do_POST(self) -> None:
            if not self.allowed():
                return
            try:
                payload = self.body()
            except ValueError as exc:
                self.close_connection = True
                self.answer(400, {"code": "REQUEST_INVALID", "message": str(exc)})
                return
            if self.path == "/run":
                code, timeout_ms = payload.get("code"), payload.get("timeout_ms")
                env = payload.get("env")
                env_ok = env is None or (
                    isinstance(env, dict)
                    and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
                )
                if (
                    not isinstance(code, str)
                    or not env_ok
                    or not (timeout_ms is None or (isinstance(timeout_ms, int) and timeout_ms > 0))
                ):
                    self.answer(
                        400,
                        {
                            "code": "REQUEST_INVALID",
                            "message": "code must be a string, timeout_ms > 0, env strings",
                        },
                    )
                    return
                if payload.get("stream") is True:
                    self.stream(lambda: kernel.run_streamed(code, timeout_ms, env, self.chunk))
                else:
                    self.answer(200, kernel.run(code, timeout_ms, env))
            elif self.path == "/interrupt":
                self.answer(200, {"interrupted": kernel.interrupt()})
            else:
                self.answer(404, {"code": "NOT_FOUND", "message": self.path})

    return Handler


def main(argv: list[str]) -> None:
    port, token_file = int(argv[1]), argv[2]
    os.environ.setdefault("MPLBACKEND", "Agg")  # figures render to PNG, never to a display
    kernel = Kernel()
    token = secrets.token_hex(24)
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(kernel, token))
    server.daemon_threads = True
    # The token is published only once the port is ours: a kernel that lost the
    # race for the port exits without overwriting the winner's token.
    os.makedirs(os.path.dirname(token_file), mode=0o700, exist_ok=True)
    temp = f"{token_file}.{os.getpid()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token)
    os.replace(temp, token_file)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kernel.loop()


if __name__ == "__main__":
    main(sys.argv)
