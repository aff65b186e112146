"""``podbay sandbox top [NAME]`` and ``podbay sandbox logs NAME [-f]``: a
sandbox's resource use, live, and its events and command log
(docs/observability.md).

    podbay sandbox top                 # every sandbox, refreshed every 2 s
    podbay sandbox top thread-42 --once
    podbay sandbox logs thread-42 -f   # events and commands, then new ones

What a sandbox ran is attacker-controlled text: every control character of an
argv or a reason is shown escaped, so no escape sequence reaches the terminal.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from podbay.wire.codec import format_time

from .sandbox_group import Connection, _options, _session, command

if TYPE_CHECKING:
    from podbay.client import SandboxClient
    from podbay.wire.observe import CommandEntry, MetricSample, SandboxEvent

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: Between refreshes of ``top`` and polls of ``logs -f``.
REFRESH_SECONDS = 2.0
FOLLOW_SECONDS = 1.0


def printable(text: str) -> str:
    r"""``text`` with control characters escaped (``\x1b`` shown, never sent).

    >>> printable("a\x1b[31mb\n")
    'a\\x1b[31mb\\x0a'
    """
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def size(n: int) -> str:
    """Bytes for people: ``1.5G``, ``200M``, ``12K``.

    >>> size(0), size(1536), size(200 << 20), size(3 << 30)
    ('0', '1.5K', '200M', '3.0G')
    """
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n)


def _top_row(name: str, state: str, sample: MetricSample | None) -> list[str]:
    if sample is None:
        return [printable(name), state, "-", "-", "-", "-", "-", "-"]
    share = sample.memory_bytes / sample.memory_limit_bytes if sample.memory_limit_bytes else 0
    return [
        printable(name),
        state,
        f"{sample.cpu_percent:.1f}",
        size(sample.memory_bytes),
        f"{share * 100:.0f}",
        size(sample.disk_bytes),
        size(sample.net_rx_bytes),
        size(sample.net_tx_bytes),
    ]


TOP_HEADERS = ["NAME", "STATE", "CPU%", "MEM", "MEM%", "DISK", "NET RX", "NET TX"]


@command.command()
@click.argument("name", required=False)
@click.option("--once", is_flag=True, help="Print one table and exit (--json implies it).")
@_options
def top(name: str | None, once: bool, conn: Connection) -> None:
    """Resource use of sandbox NAME (or every sandbox), refreshed live."""
    with _session(conn) as (client, out):
        while True:
            records = [client.get(name)] if name else client.list()
            latest: dict[str, Any] = {}
            rows = []
            for record in records:
                samples = client.metrics(record.name).samples
                latest[record.name] = samples[-1] if samples else None
                rows.append(_top_row(record.name, record.state, latest[record.name]))
            if conn.as_json or once:
                out.table(rows, TOP_HEADERS, data=latest)
                return
            if sys.stdout.isatty():
                out.raw("\x1b[H\x1b[2J")  # home and clear: a refreshing screen
            out.table(rows, TOP_HEADERS)
            out.line("")
            time.sleep(REFRESH_SECONDS)


def _event_line(event: SandboxEvent) -> tuple[datetime, str]:
    return event.at, f"{format_time(event.at)}  event    {event.kind}  {printable(event.reason)}"


def _command_line(entry: CommandEntry) -> tuple[datetime, str]:
    code = "running" if entry.exit_code is None else f"exit {entry.exit_code}"
    took = "" if entry.duration_ms is None else f"  {entry.duration_ms} ms"
    argv = printable(shlex.join(entry.argv))
    line = (
        f"{format_time(entry.at)}  {entry.kind:<7}  {printable(entry.user)}  {code}{took}  {argv}"
    )
    return entry.at, line


def _read(
    client: SandboxClient, name: str, since: datetime | None
) -> tuple[list[SandboxEvent], list[CommandEntry], bool]:
    events = client.events(name, since=since).events
    commands = client.commands(name, since=since)
    return events, commands.commands, commands.enabled


@command.command()
@click.argument("name")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events and commands.")
@_options
def logs(name: str, follow: bool, conn: Connection) -> None:
    """Events and command log of sandbox NAME, oldest first."""
    with _session(conn) as (client, out):
        events, commands, enabled = _read(client, name, None)
        if conn.as_json:
            out.value({"events": events, "commands": commands, "command_log": enabled})
            return
        if not enabled:
            out.info("(the command log is off for this deployment)")
        since: datetime | None = None
        while True:
            lines = sorted([*map(_event_line, events), *map(_command_line, commands)])
            for at, line in lines:
                out.line(line)
                since = at if since is None or at > since else since
            if not follow:
                return
            time.sleep(FOLLOW_SECONDS)
            events, commands, _ = _read(client, name, since)
