"""``podbay volume ...``: the deployment's persistent volumes (docs/volumes.md).

    podbay volume create datasets --size 1024      # MiB
    podbay volume ls
    podbay volume get datasets
    podbay volume rm datasets
    podbay volume cat datasets notes/a.txt
    podbay volume put datasets notes/a.txt < a.txt

Like ``podbay sandbox``, it acts for the deployment of ``--token`` or
``ASTRO_AUTHZ_TOKEN``, prints one JSON document with ``--json``, and exits 1
with one line when the server refuses (``podbay: 409 VOLUME_IN_USE: ...``).
Mount a volume with ``podbay sandbox attach NAME --volume /data=datasets``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from .sandbox_group import Connection, _options, _session

if TYPE_CHECKING:
    from podbay.wire.control import Volume


@click.group()
def command() -> None:
    """Persistent volumes: create, ls, get, rm, cat, put."""


def _row(v: Volume) -> list[Any]:
    return [
        v.name,
        f"{v.size_bytes >> 20} MiB",
        f"{v.used_bytes >> 20} MiB",
        ",".join(v.mounted_by) or "-",
        v.created_at.strftime("%Y-%m-%d %H:%M:%S"),
    ]


HEADERS = ["NAME", "SIZE", "USED", "MOUNTED BY", "CREATED"]


@command.command()
@click.argument("name")
@click.option("--size", "size_mib", type=int, required=True, metavar="MIB", help="Size in MiB.")
@_options
def create(name: str, size_mib: int, conn: Connection) -> None:
    """Create volume NAME of --size MiB (a hard limit)."""
    with _session(conn) as (client, out):
        volume = client.create_volume(name, size_mib=size_mib)
        out.table([_row(volume)], HEADERS, data=volume)


@command.command(name="ls")
@_options
def list_volumes(conn: Connection) -> None:
    """List the deployment's volumes."""
    with _session(conn) as (client, out):
        volumes = client.list_volumes()
        out.table([_row(v) for v in volumes], HEADERS, data=volumes)


@command.command()
@click.argument("name")
@_options
def get(name: str, conn: Connection) -> None:
    """Show volume NAME."""
    with _session(conn) as (client, out):
        volume = client.get_volume(name)
        out.table([_row(volume)], HEADERS, data=volume)


@command.command(name="rm")
@click.argument("names", nargs=-1, required=True)
@_options
def remove(names: tuple[str, ...], conn: Connection) -> None:
    """Delete volumes NAMES and their files (refused while a sandbox mounts one)."""
    with _session(conn) as (client, out):
        for name in names:
            client.delete_volume(name)
            out.line(f"deleted {name}")


@command.command()
@click.argument("name")
@click.argument("path")
@_options
def cat(name: str, path: str, conn: Connection) -> None:
    """Print file PATH of volume NAME (no sandbox needed)."""
    with _session(conn) as (client, out):
        data = client.read_volume_file(name, path)
        out.raw(data)


@command.command()
@click.argument("name")
@click.argument("path")
@_options
def put(name: str, path: str, conn: Connection) -> None:
    """Write stdin to file PATH of volume NAME (no sandbox needed)."""
    with _session(conn) as (client, out):
        client.write_volume_file(name, path, sys.stdin.buffer.read())
        out.line(f"wrote {path}")
