"""``podbay serve``: control plane, gateway and runtime in one process.

Prints where it listens (stdout), then serves until SIGINT/SIGTERM; shutdown
leaves sandboxes running and the next start adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from podbay.cli.options import data_dir_option, json_option
from podbay.cli.output import Output, fail

if TYPE_CHECKING:  # the CLI imports the server's modules only when a command runs
    import uvicorn

    from podbay.settings import Settings


def serve_argv(data_dir: Path, listen: str) -> list[str]:
    """The command line that runs ``podbay serve`` in a process of its own, with
    this interpreter (``podbay dev`` and the test platform start it so)."""
    return [
        sys.executable,
        "-m",
        "podbay.cli.main",
        "serve",
        "--data-dir",
        str(data_dir),
        "--listen",
        listen,
    ]


def parse_listen(value: str | None) -> tuple[str | None, int | None]:
    if not value:
        return None, None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        fail(f"--listen wants HOST:PORT, not {value!r}", 2)
    return host.strip("[]") or "127.0.0.1", int(port)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        fail(f"cannot listen on {host}:{port}: {exc.strerror}")
    sock.listen(2048)
    # Close-on-exec (Python's default, kept on purpose): uvloop's subprocesses
    # ignore close_fds and posix_spawn closes nothing, so an inheritable
    # listening socket went into every QEMU, which then held the port after
    # the server died and took its connections into a backlog nobody accepts.
    return sock


def server_settings(
    listen: str | None,
    *,
    data_dir: Path | None,
    log_level: str | None,
    public_url: str | None = None,
    with_classes: bool,
) -> Settings:
    """What a server command (serve, control, node) runs with: defaults, the
    environment, then its options; exit 2 when they are wrong. ``with_classes``:
    the sandbox class settings are checked too."""
    from podbay.runtime import classes
    from podbay.settings import Settings

    host, port = parse_listen(listen)
    try:
        settings = Settings.load(
            data_dir=data_dir,
            server__host=host,
            server__port=port,
            server__public_url=public_url,
            log_level=log_level,
        )
        if with_classes:
            classes.enabled_classes(settings)
    except ValueError as exc:
        fail(str(exc), 2)
    return settings


def listening_socket(settings: Settings) -> socket.socket:
    """Logging set up and the socket bound (port 0: the one picked is recorded)."""
    from podbay.control.logs import configure_logging

    configure_logging(settings.log_level)
    sock = _bind(settings.server.host, settings.server.port)
    settings.server.port = sock.getsockname()[1]
    return sock


def _server_class() -> type[uvicorn.Server]:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGTERM after its graceful shutdown (exit -15); a
        requested, clean shutdown of podbay exits 0 instead."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {
                sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)
            }
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server


def run_server(app: Any, settings: Settings, sock: socket.socket, *, progress: bool) -> None:
    """Serve ``app`` on ``sock`` until SIGINT/SIGTERM (uvicorn, with the
    listener's guards: head and body timeouts, a connection cap)."""
    import uvicorn

    from podbay.cli.progress import build_progress
    from podbay.control.listener import connection_cap, guarded_protocol, raise_descriptor_limit
    from podbay.gateway.portsocket import MAX_MESSAGE as WS_MAX_MESSAGE
    from podbay.gateway.portsocket import MAX_QUEUE as WS_MAX_QUEUE

    descriptors = raise_descriptor_limit()
    cap = connection_cap(settings.server.max_connections, descriptors)
    protocol = guarded_protocol(
        head_timeout=settings.server.head_timeout_seconds,
        body_timeout=settings.server.body_timeout_seconds,
        max_connections=cap,
    )
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http=protocol,
        lifespan="on",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
        ws="websockets",
        ws_max_size=WS_MAX_MESSAGE,
        # Messages a client's WebSocket holds before the app reads them (then
        # TCP's flow control): at 1 MiB each, 8 bound a connection's buffer.
        ws_max_queue=WS_MAX_QUEUE,
        ws_per_message_deflate=False,
    )
    server = _server_class()(config)
    # On a terminal, the base image and layer builds draw bars instead of lines.
    with build_progress(enabled=progress):
        server.run(sockets=[sock])


def shared_keys(settings: Settings, store: Any) -> Any:
    """The store's signing keys when the store is shared (PostgreSQL: every
    server and the CLI sign with the same ones), else None (the data dir's)."""
    from podbay.control.keys import keys_in_store, open_keys

    if not keys_in_store(settings):
        return None
    try:
        return asyncio.run(open_keys(settings, store))
    # Any store or key failure ends the command with its words.
    except Exception as exc:  # noqa: BLE001
        fail(f"cannot read the signing keys from the store: {exc}")


@click.command()
@data_dir_option("Store, keys and machines (default /var/lib/podbay as root).")
@click.option(
    "--listen",
    default=None,
    metavar="HOST:PORT",
    help="Where to listen (default 127.0.0.1:8700; port 0 picks one).",
)
@click.option(
    "--public-url", default=None, help="Base URL clients use (token iss, sandbox endpoints)."
)
@click.option("--log-level", default=None, help="debug, info, warning, error.")
@json_option("Print the listening address as JSON.")
def command(
    data_dir: Path | None,
    listen: str | None,
    public_url: str | None,
    log_level: str | None,
    as_json: bool,
) -> None:
    """Run the whole platform on this machine."""
    from podbay.serve.build import build_drivers, class_hooks, serve_app
    from podbay.store.opening import open_store

    settings = server_settings(
        listen,
        with_classes=True,
        data_dir=data_dir,
        public_url=public_url,
        log_level=log_level,
    )
    out = Output(as_json=as_json)
    sock = listening_socket(settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        store = open_store(settings)
    except ValueError as exc:
        fail(str(exc), 2)
    keys = shared_keys(settings, store)
    # A host that can run no class still serves the API (503s, /healthz says why).
    drivers, missing = build_drivers(settings, out.info)
    app = serve_app(settings, store, drivers, class_hooks(settings, drivers, missing), keys=keys)
    listening = f"http://{settings.server.host}:{settings.server.port}"
    out.value(
        {
            "listen": listening,
            "public_url": settings.server.base_url(),
            "data_dir": str(settings.data_dir),
        },
        f"podbay: listening on {listening} (public URL {settings.server.base_url()},"
        f" data in {settings.data_dir})",
    )
    try:
        run_server(app, settings, sock, progress=not as_json)
    finally:
        asyncio.run(store.close())
