"""What a fork costs (docs/fork.md), in real sandboxes under ``podbay serve``.

    .venv/bin/python bench/fork.py [--classes container,gvisor] [-n 5] [--mib 100]
    (root: real runtimes)

Per class, a source sandbox holding ``--mib`` MiB of fresh files (random
bytes, synced), then ``-n`` rounds of:

* ``paused_ms``: how long the running source was held still while its disk
  was copied (the fork's own answer), for one copy and for ``--copies``;
* ``fork_ms``: the fork call, answered once every copy runs and is routed;
* ``first_command_ms``: fork call + the first command in the copy
  (``true``), what a caller waits for before using it.

Medians over the rounds; each round's copies are deleted before the next.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from podbay.client import SandboxClient
from podbay.testing.platform import PlatformServer


def median(samples: list[float]) -> float:
    return round(statistics.median(samples), 1)


def measure(client: SandboxClient, class_: str, rounds: int, mib: int, copies: int) -> dict:
    source = f"bench-{class_}-{uuid.uuid4().hex[:6]}"
    client.attach(source, class_, memory_mib=1024)
    done = client.exec(
        source,
        ["sh", "-c", f"head -c {mib}M /dev/urandom > /root/data && sync"],
        timeout_ms=600_000,
    )
    assert done.exit_code == 0, done.stderr
    one_paused, one_fork, first, many_paused, many_fork = [], [], [], [], []
    for _ in range(rounds):
        name = f"{source}-c-{uuid.uuid4().hex[:4]}"
        started = time.perf_counter()
        result = client.fork(source, name)
        one_fork.append((time.perf_counter() - started) * 1000)
        assert client.exec(name, ["true"]).exit_code == 0
        first.append((time.perf_counter() - started) * 1000)
        one_paused.append(result.paused_ms)
        client.delete(name)
        if copies < 2:
            continue
        names = [f"{source}-m{i}-{uuid.uuid4().hex[:4]}" for i in range(copies)]
        started = time.perf_counter()
        result = client.fork(source, *names)
        many_fork.append((time.perf_counter() - started) * 1000)
        many_paused.append(result.paused_ms)
        for name in names:
            client.delete(name)
    client.delete(source)
    found: dict = {
        "class": class_,
        "mib": mib,
        "rounds": rounds,
        "one_copy": {
            "paused_ms": median(one_paused),
            "fork_ms": median(one_fork),
            "first_command_ms": median(first),
        },
    }
    if many_fork:
        found[f"{copies}_copies"] = {"paused_ms": median(many_paused), "fork_ms": median(many_fork)}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", default="container,gvisor")
    parser.add_argument("-n", type=int, default=5)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--copies", type=int, default=4, help="below 2: one copy only")
    args = parser.parse_args()
    classes = args.classes.split(",")
    env = {"PODBAY_RUNTIME_CLASSES": ",".join(classes), "PODBAY_CAPS_PER_DEPLOYMENT": "40"}
    with tempfile.TemporaryDirectory() as tmp, PlatformServer.start(Path(tmp), env=env) as server:
        deadline = time.monotonic() + 900
        while not set(classes) <= set(server.http.get("/healthz").json()["classes"]["available"]):
            if time.monotonic() > deadline:
                raise SystemExit(server.http.get("/healthz").text)
            time.sleep(0.25)
        token = server.create_deployment("bench-fork")
        with SandboxClient(identity_token=token, server_url=server.base_url) as client:
            for class_ in classes:
                print(json.dumps(measure(client, class_, args.n, args.mib, args.copies)))


if __name__ == "__main__":
    main()
