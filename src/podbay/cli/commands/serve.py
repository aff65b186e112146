"""``podbay serve``: control plane, gateway and runtime in one process.

Prints where it listens (stdout), then serves until SIGINT/SIGTERM; shutdown
leaves sandboxes running and the next start adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

from podbay.cli.output import Output, fail

if TYPE_CHECKING:  # the CLI imports the server's modules only when a command runs
    import uvicorn

    from podbay.control.services.deployments import SectionValidator
    from podbay.control.services.environment import EnvironmentService
    from podbay.runtime.base import Driver
    from podbay.settings import Settings


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
    sock.set_inheritable(True)
    return sock


def _server_class() -> type[uvicorn.Server]:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGTERM after its graceful shutdown (exit -15); a
        requested, clean shutdown of podbay exits 0 instead."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {sig: signal.signal(sig, self.handle_exit)
                        for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server


def environment_service(settings: Settings, driver: Driver | None) -> EnvironmentService:
    """Declared environments: layers built once, cached in ``<data_dir>/layers``."""
    from podbay.control.services.environment import PlainEnvironment

    if driver is None:
        return PlainEnvironment()
    from podbay.environment.build import Environments, LayerBuilder, LayerCache
    from podbay.environment.service import DeclaredEnvironment
    from podbay.runtime.base import Limits

    rt = settings.runtime
    limits = Limits(memory_bytes=rt.memory_bytes, cpus=rt.cpus, pids=rt.pids,
                    disk_bytes=rt.disk_bytes)
    cache = LayerCache(settings.data_dir / "layers")
    return DeclaredEnvironment(Environments(LayerBuilder(driver, cache, limits)))


def section_validator() -> SectionValidator:
    """Checks a deployment's ``sandbox`` section (raises naming every bad field)."""
    from podbay.environment.spec import parse_section

    return parse_section


@click.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="Store, keys and machines (default /var/lib/podbay as root).")
@click.option("--listen", default=None, metavar="HOST:PORT",
              help="Where to listen (default 127.0.0.1:8700; port 0 picks one).")
@click.option("--public-url", default=None,
              help="Base URL clients use (token iss, sandbox endpoints).")
@click.option("--log-level", default=None, help="debug, info, warning, error.")
@click.option("--json", "as_json", is_flag=True, help="Print the listening address as JSON.")
def command(data_dir: Path | None, listen: str | None, public_url: str | None,
            log_level: str | None, as_json: bool) -> None:
    """Run the whole platform on this machine."""
    import uvicorn

    _Server = _server_class()

    from podbay.control.app import create_app
    from podbay.control.listener import connection_cap, guarded_protocol, raise_descriptor_limit
    from podbay.control.logs import configure_logging
    from podbay.runtime import registry
    from podbay.settings import Settings
    from podbay.store.sqlite import SqliteStore

    host, port = parse_listen(listen)
    try:
        settings = Settings.load(data_dir=data_dir, server__host=host, server__port=port,
                                 server__public_url=public_url, log_level=log_level)
    except ValueError as exc:
        fail(str(exc), 2)
    out = Output(as_json=as_json)
    configure_logging(settings.log_level)
    sock = _bind(settings.server.host, settings.server.port)
    settings.server.port = sock.getsockname()[1]
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = SqliteStore.open(settings.data_dir / "podbay.db")
    try:
        driver = registry.build(settings)
    except Exception as exc:  # a host without the runtime still serves the API (503s)
        out.info(f"podbay: no sandbox runtime: {exc}")
        driver = None
    drivers = {driver.name: driver} if driver is not None else {}
    app = create_app(settings, store, drivers, validate_section=section_validator(),
                     environment=environment_service(settings, driver))
    listening = f"http://{settings.server.host}:{settings.server.port}"
    out.value({"listen": listening, "public_url": settings.server.base_url(),
               "data_dir": str(settings.data_dir)},
              f"podbay: listening on {listening} (public URL {settings.server.base_url()},"
              f" data in {settings.data_dir})")
    descriptors = raise_descriptor_limit()
    cap = connection_cap(settings.server.max_connections, descriptors)
    protocol = guarded_protocol(head_timeout=settings.server.head_timeout_seconds,
                                body_timeout=settings.server.body_timeout_seconds,
                                max_connections=cap)
    config = uvicorn.Config(app, loop="uvloop", http=protocol, lifespan="on",
                            log_config=None, access_log=False, timeout_graceful_shutdown=5,
                            ws="none")
    server = _Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        asyncio.run(store.close())
