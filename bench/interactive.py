"""Interactive figures: output-to-client latency (long-poll vs the 500 ms tick),
stdin throughput; one run, medians.

    .venv/bin/python bench/interactive.py                         # a real `podbay serve`
    .venv/bin/python bench/interactive.py --server URL --token T  # an already running server

Latency: a process in the sandbox prints ``time.time()`` every 137 ms (an
interval that is not a multiple of the tick); the client notes when each
line reached it. The sandbox shares the host's clock, so the difference is
the line's trip from the process's write to the caller's hands. Rows: the
SDK's ``run()`` (long-poll, ``poll(wait_ms=…)``), ``stream()`` (NDJSON
exec), and the reference client's way (poll, sleep 500 ms, poll again).

stdin: ``exec(["wc", "-c"], stdin=<file>)`` of ``--stdin-mib`` MiB from a
local file; MB/s = bytes / wall time of the call (it includes the command's
start and end).

Terminal echo: ``cat`` on a PTY; one byte typed at a time, the time until
the terminal's echo of it is back (client → gateway → agent → pty and back).

Ports: ``GET /`` of ``python3 -m http.server`` on the sandbox's loopback,
through ``/v1/ports`` with ``port_transport`` (one request after another),
against the same request from inside the sandbox (``http.client``, a new
connection each, as the relay makes); "added" is the difference of medians.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from podbay import SandboxClient
from podbay.testing.target import bench_arguments, bench_target

MIB = 1024 * 1024
TICK_S = 0.5
TICKER = (
    "import sys, time\n"
    "for _ in range({n}):\n"
    "    time.sleep(0.137)\n"
    "    sys.stdout.write(f'{{time.time():.6f}}\\n'); sys.stdout.flush()\n"
)


def _lags(text: str, received: float, lags: list[float]) -> None:
    for line in text.splitlines():
        if line.strip():
            lags.append((received - float(line)) * 1000)


def via_run(client: SandboxClient, name: str, n: int) -> list[float]:
    lags: list[float] = []
    client.run(
        name,
        ["python3", "-c", TICKER.format(n=n)],
        on_output=lambda chunk: _lags(chunk.stdout, time.time(), lags),
    )
    return lags


def via_stream(client: SandboxClient, name: str, n: int) -> list[float]:
    lags: list[float] = []
    for event in client.stream(name, ["python3", "-c", TICKER.format(n=n)]):
        if event.stdout:
            _lags(event.stdout, time.time(), lags)
    return lags


def via_tick(client: SandboxClient, name: str, n: int) -> list[float]:
    """The reference client's run: poll, sleep 500 ms, poll (no wait_ms)."""
    lags: list[float] = []
    proc = client.spawn(name, ["python3", "-c", TICKER.format(n=n)])
    out_from = 0
    while True:
        chunk = client.poll(name, proc.process_id, stdout_from=out_from)
        _lags(chunk.stdout, time.time(), lags)
        out_from = chunk.stdout_next
        if chunk.state == "exited":
            break
        time.sleep(TICK_S)
    client.kill(name, proc.process_id)
    return lags


def stdin_mb_s(client: SandboxClient, name: str, source: Path, rounds: int) -> list[float]:
    size = source.stat().st_size
    rates = []
    for _ in range(rounds):
        with source.open("rb") as f:
            started = time.perf_counter()
            result = client.exec(name, ["wc", "-c"], stdin=f)
            elapsed = time.perf_counter() - started
        assert int(result.stdout) == size, result
        rates.append(size / elapsed / 1e6)
    return rates


def pty_echo_ms(client: SandboxClient, name: str, n: int) -> list[float]:
    times = []
    with client.pty(name, ["cat"]) as tty:
        for i in range(n):
            key = b"abcdefghij"[i % 10 : i % 10 + 1]
            started = time.perf_counter()
            tty.send(key)
            seen = b""
            while key not in seen:
                seen += tty.recv()
            times.append((time.perf_counter() - started) * 1000)
    return times


INSIDE = (
    "import http.client, statistics, time\n"
    "t = []\n"
    "for _ in range({n}):\n"
    "    s = time.perf_counter()\n"
    "    c = http.client.HTTPConnection('127.0.0.1', {port}); c.request('GET', '/')\n"
    "    c.getresponse().read(); c.close()\n"
    "    t.append((time.perf_counter() - s) * 1000)\n"
    "print(' '.join(f'{{x:.4f}}' for x in t))\n"
)


def port_ms(client: SandboxClient, name: str, n: int) -> tuple[list[float], list[float]]:
    import httpx

    port = 8765
    proc = client.spawn(name, ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"])
    try:
        url = client.url(name, port)
        with httpx.Client(transport=client.port_transport(name)) as http:
            for _ in range(100):  # until it listens
                if http.get(url).status_code == 200:
                    break
                time.sleep(0.1)
            through = []
            for _ in range(n):
                started = time.perf_counter()
                http.get(url).raise_for_status()
                through.append((time.perf_counter() - started) * 1000)
        inside = client.exec(name, ["python3", "-c", INSIDE.format(n=n, port=port)])
        return through, [float(x) for x in inside.stdout.split()]
    finally:
        client.kill(name, proc.process_id)


def row(label: str, unit: str, values: list[float]) -> dict[str, Any]:
    values = sorted(values)
    p90 = values[int(len(values) * 0.9)] if values else float("nan")
    print(
        f"{label:<52} p50 {statistics.median(values):9.2f} {unit}   "
        f"p90 {p90:9.2f}   n={len(values)}"
    )
    return {
        "label": label,
        "unit": unit,
        "p50": statistics.median(values),
        "p90": p90,
        "n": len(values),
    }


def main() -> int:
    parser = bench_arguments(__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=60, help="output lines per latency row")
    parser.add_argument("--stdin-mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    local = "podbay serve (real container sandbox, gateway, loopback)"
    name = f"bench-interactive-{os.getpid()}"
    rows = []
    with bench_target(args.server, args.token, local) as target:
        print(f"target: {target.description}")
        with (
            SandboxClient(identity_token=target.token, server_url=target.url) as client,
            tempfile.TemporaryDirectory() as scratch,
        ):
            client.attach(name)
            latency: list[tuple[str, Callable[[SandboxClient, str, int], list[float]]]] = [
                ("output to client: run() (long-poll)", via_run),
                ("output to client: stream() (NDJSON exec)", via_stream),
                ("output to client: poll + 500 ms tick (reference)", via_tick),
            ]
            for label, measure in latency:
                rows.append(row(label, "ms", measure(client, name, args.lines)))
            source = Path(scratch) / "stdin.bin"
            with source.open("wb") as f:
                block = os.urandom(MIB)
                for _ in range(args.stdin_mib):
                    f.write(block)
            rows.append(
                row(
                    f"stdin: exec(wc -c) of {args.stdin_mib} MiB",
                    "MB/s",
                    stdin_mb_s(client, name, source, args.rounds),
                )
            )
            rows.append(
                row("terminal: keystroke echo round trip", "ms", pty_echo_ms(client, name, 200))
            )
            through, inside = port_ms(client, name, 200)
            rows.append(row("ports: GET / through /v1/ports", "ms", through))
            rows.append(row("ports: GET / from inside the sandbox", "ms", inside))
            added = statistics.median(through) - statistics.median(inside)
            print(f"{'ports: added by the relay (difference of medians)':<52} {added:9.2f} ms")
            rows.append({"label": "ports: added", "unit": "ms", "p50": added})
            client.delete(name)
        if args.json:
            print(json.dumps({"target": target.description, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
