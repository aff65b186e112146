"""``podbay node``: run one sandbox host of a cluster; ``podbay node list |
drain NAME | forget NAME``: the operator's view of the enrolled nodes (on the
shared store, ``PODBAY_STORE_URL``, like ``podbay deployment``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from podbay.cli.output import Output, fail
from podbay.cli.stores import run_on_store

T = TypeVar("T")


@click.group(invoke_without_command=True)
@click.option("--listen", default=None, metavar="HOST:PORT", help="Where to listen.")
@click.option(
    "--data-dir", type=click.Path(path_type=Path), default=None, help="Images, disks, run state."
)
@click.option("--log-level", default=None, help="debug, info, warning, error.")
@click.option("--json", "as_json", is_flag=True, help="Print the listening address as JSON.")
@click.pass_context
def command(
    ctx: click.Context,
    listen: str | None,
    data_dir: Path | None,
    log_level: str | None,
    as_json: bool,
) -> None:
    """Run a sandbox host that enrolls with the control plane (PODBAY_NODE_CONTROL_URL)."""
    ctx.ensure_object(dict)
    ctx.obj["as_json"] = as_json
    if ctx.invoked_subcommand is not None:
        return
    from podbay.cli.commands.serve import listening_socket, run_server, server_settings
    from podbay.serve.build import build_drivers, class_hooks, node_app

    settings = server_settings(listen, with_classes=True, data_dir=data_dir, log_level=log_level)
    if not settings.node.control_url:
        fail("set PODBAY_NODE_CONTROL_URL: the control plane's URL", 2)
    out = Output(as_json=as_json)
    sock = listening_socket(settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    drivers, missing = build_drivers(settings, out.info)
    app = node_app(settings, drivers, class_hooks(settings, drivers, missing))
    listening = f"http://{settings.server.host}:{settings.server.port}"
    out.value(
        {"listen": listening, "name": app.name, "advertise_url": app.url},
        f"podbay node {app.name}: listening on {listening} (advertised as {app.url})",
    )
    run_server(app, settings, sock, progress=not as_json)


data_dir_option = click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Only for settings; the nodes are in the store (PODBAY_STORE_URL).",
)


def _settings(data_dir: Path | None) -> Any:
    from podbay.settings import Settings

    return Settings.load(data_dir=data_dir)


def _on_store(data_dir: Path | None, work: Callable[[Any], Awaitable[T]]) -> T:
    from podbay.store.opening import POSTGRES_SCHEMES

    settings = _settings(data_dir)
    if not settings.store.url.strip().startswith(POSTGRES_SCHEMES):
        fail("set PODBAY_STORE_URL to the control plane's PostgreSQL database", 2)
    return run_on_store(settings, work)


@command.command("list")
@click.option("--json", "list_json", is_flag=True, help="Print JSON.")
@data_dir_option
@click.pass_context
def list_(ctx: click.Context, list_json: bool, data_dir: Path | None) -> None:
    """Every enrolled node: state (ready, draining, lost), classes, load."""
    lost_after = _settings(data_dir).cluster.node_lost_seconds
    records = _on_store(data_dir, lambda store: store.list_nodes())
    now = datetime.now(UTC)
    rows = [
        {
            "name": r.name,
            "url": r.url,
            "state": r.state(now, lost_after),
            "classes": r.report.get("classes", []),
            "running": r.report.get("running", 0),
            "capacity": r.report.get("capacity", 0),
            "heartbeat_at": r.heartbeat_at.isoformat(),
        }
        for r in records
    ]
    Output(as_json=list_json or ctx.obj["as_json"]).table(
        [
            (
                r["name"],
                r["state"],
                ",".join(r["classes"]),
                f"{r['running']}/{r['capacity']}",
                r["url"],
            )
            for r in rows
        ],
        ["NAME", "STATE", "CLASSES", "RUNNING", "URL"],
        data=rows,
    )


@command.command()
@click.argument("name")
@click.option(
    "--evict",
    is_flag=True,
    help="Stop its running and suspended sandboxes too (files kept) and move them.",
)
@click.option("--json", "drain_json", is_flag=True, help="Print JSON.")
@data_dir_option
@click.pass_context
def drain(
    ctx: click.Context, name: str, evict: bool, drain_json: bool, data_dir: Path | None
) -> None:
    """No new sandboxes go to NAME, and its stopped sandboxes' disks move to
    other nodes. Running and suspended ones stay (--evict: stopped and moved
    too). If NAME is lost, its sandboxes are given up (their next attach starts
    a new one elsewhere). Exits 1 if a sandbox it was to move stayed."""
    from podbay.control.drain import drain as drain_node

    settings = _settings(data_dir)
    done = _on_store(data_dir, lambda store: drain_node(store, settings, name, evict=evict))
    if not done.found:
        fail(f"no node named {name!r}")
    out = Output(as_json=drain_json or ctx.obj["as_json"])
    if done.lost:
        out.value(
            {"node": name, "lost": True, "given_up": done.given_up},
            f"drained {name}; it is lost: {done.given_up} sandbox record(s) given up",
        )
        return
    lines = [
        f"drained {name}: {len(done.moved)} moved, {len(done.kept)} kept, {len(done.failed)} failed"
    ]
    for m in done.moved:
        lines.append(
            f"  moved  {m['name']} to {m['to']}: {m['bytes']} bytes in {m['seconds']:.2f} s,"
            f" sha256 {m['sha256'][:16]}... checked at both ends"
        )
    for k in done.kept:
        lines.append(f"  kept   {k['name']} ({k['state']}): {k['why']}")
    for f in done.failed:
        lines.append(f"  FAILED {f['name']} ({f['state']}): {f['why']}")
    out.value(
        {
            "node": name,
            "lost": False,
            "moved": done.moved,
            "kept": done.kept,
            "failed": done.failed,
        },
        "\n".join(lines),
    )
    if done.failed:
        raise SystemExit(1)


@command.command()
@click.argument("name")
@data_dir_option
def undrain(name: str, data_dir: Path | None) -> None:
    """NAME takes new sandboxes again."""

    async def work(store: Any) -> bool:
        return bool(await store.drain_node(name, drained=False))

    if not _on_store(data_dir, work):
        fail(f"no node named {name!r}")
    Output().info(f"{name} takes new sandboxes again")


@command.command()
@click.argument("name")
@data_dir_option
def forget(name: str, data_dir: Path | None) -> None:
    """Remove NAME and the records of its sandboxes (their next attach starts anew)."""
    if not _on_store(data_dir, lambda store: store.forget_node(name)):
        fail(f"no node named {name!r}")
    Output().info(f"forgot {name}")
