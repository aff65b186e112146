"""``podbay control``: the control plane alone (one replica of many), for a
cluster of ``podbay node`` hosts. State in PostgreSQL (``PODBAY_STORE_URL``),
signing keys in the store too; nothing kept in the data directory.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from podbay.cli.output import Output, fail


@click.command()
@click.option("--listen", default=None, metavar="HOST:PORT", help="Where to listen.")
@click.option(
    "--data-dir", type=click.Path(path_type=Path), default=None, help="Unused by control."
)
@click.option(
    "--public-url", default=None, help="Base URL clients use (token iss; the load balancer)."
)
@click.option("--log-level", default=None, help="debug, info, warning, error.")
@click.option("--json", "as_json", is_flag=True, help="Print the listening address as JSON.")
def command(
    listen: str | None,
    data_dir: Path | None,
    public_url: str | None,
    log_level: str | None,
    as_json: bool,
) -> None:
    """Run the control plane only (a replica behind a load balancer)."""
    from podbay.cli.commands.serve import listening_socket, run_server, server_settings
    from podbay.control.keys import StoreKeyRing
    from podbay.serve.build import control_app
    from podbay.store.opening import POSTGRES_SCHEMES, open_store
    from podbay.store.postgres import PostgresStore

    settings = server_settings(
        listen,
        with_classes=False,
        data_dir=data_dir,
        public_url=public_url,
        log_level=log_level,
    )
    if not settings.store.url.strip().startswith(POSTGRES_SCHEMES):
        fail(
            "podbay control keeps its state in PostgreSQL, shared by every replica: "
            "set PODBAY_STORE_URL=postgresql://... (SQLite is for podbay serve alone)",
            2,
        )
    if not settings.cluster.enrollment_token:
        fail("set PODBAY_CLUSTER_ENROLLMENT_TOKEN: nodes enroll with it", 2)
    sock = listening_socket(settings)
    try:
        store = open_store(settings)
    except ValueError as exc:
        fail(str(exc), 2)
    assert isinstance(store, PostgresStore)
    try:
        keys = asyncio.run(StoreKeyRing.open(store))
    # Any store or key failure ends the command with its words.
    except Exception as exc:  # noqa: BLE001
        fail(f"cannot read the signing keys from the store: {exc}")
    app = control_app(settings, store, keys)
    listening = f"http://{settings.server.host}:{settings.server.port}"
    Output(as_json=as_json).value(
        {"listen": listening, "public_url": settings.server.base_url()},
        f"podbay control: listening on {listening} (public URL {settings.server.base_url()})",
    )
    try:
        run_server(app, settings, sock, progress=False)
    finally:
        asyncio.run(store.close())
