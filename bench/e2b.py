"""E2B's SDKs beside podbay's own, against one ``podbay serve``, medians.

    .venv/bin/python bench/e2b.py [--rounds N] [--creates N] [--json]

One run, interleaved (each round does every operation once through podbay's
SDK, then through E2B's, so both see the same load), on the default class:

* ``create``: a new sandbox until its first command's output
  (``Sandbox.create()`` + ``commands.run("echo hi")`` against ``attach`` +
  ``exec``); the sandbox is killed after the clock stops;
* ``run``: ``commands.run("true")`` against ``exec(["true"])``; ``run_login``:
  against ``exec(["/bin/bash", "-l", "-c", "true"])``, which is what E2B's
  SDK asks envd to run;
* ``write`` / ``read``: 10 MiB through ``files.write`` / ``files.read``
  against ``write_file_bytes`` / ``read_file_bytes``;
* ``run_code``: ``run_code("1+1")`` (``e2b-code-interpreter``) against
  podbay's ``run_code``, both on a warm interpreter.

The ratio column is E2B's median over podbay's; issue 26's target is 1.5.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

# This script's name is the SDK's: its own directory must not shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from e2b_code_interpreter import Sandbox as InterpreterSandbox  # noqa: E402

from podbay import SandboxClient  # noqa: E402
from podbay.testing.platform import PlatformServer  # noqa: E402

e2b = importlib.import_module("e2b")

MIB = 1024 * 1024
PAYLOAD = os.urandom(10 * MIB)
OPERATIONS = ("create", "run", "run_login", "write", "read", "run_code")
#: What each row compares: podbay's SDK's side, then E2B's.
COMPARED = {
    "create": "attach + exec(['echo', 'hi']) | Sandbox.create() + commands.run('echo hi')",
    "run": "exec(['true']) | commands.run('true') (runs /bin/bash -l -c true)",
    "run_login": "exec(['/bin/bash', '-l', '-c', 'true']) | commands.run('true')",
    "write": "write_file_bytes 10 MiB | files.write 10 MiB",
    "read": "read_file_bytes 10 MiB | files.read 10 MiB (bytes)",
    "run_code": "run_code('1+1') | run_code('1+1') (e2b-code-interpreter)",
}


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--creates", type=int, default=8, help="rounds that also create")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    samples: dict[str, dict[str, list[float]]] = {
        op: {"podbay": [], "e2b": []} for op in OPERATIONS
    }
    with PlatformServer.start(Path(tempfile.mkdtemp(prefix="podbay-bench-e2b-"))) as server:
        token = server.create_deployment("bench")
        key = server.cli("deployment", "e2b-key", "bench").stdout.strip().splitlines()[-1]
        opts = {"api_key": key, "api_url": server.base_url, "sandbox_url": server.base_url}
        sandbox = InterpreterSandbox.create(template="base", **opts)
        with SandboxClient(identity_token=token, server_url=server.base_url) as client:
            native = client.sandbox(f"bench-native-{uuid.uuid4().hex[:6]}")

            def podbay_create() -> None:
                name = f"bench-new-{uuid.uuid4().hex[:6]}"
                started = time.perf_counter()
                client.attach(name)
                assert client.exec(name, ["echo", "hi"]).stdout == "hi\n"
                samples["create"]["podbay"].append((time.perf_counter() - started) * 1000)
                client.delete(name)

            def e2b_create() -> None:
                started = time.perf_counter()
                new = e2b.Sandbox.create(**opts)
                assert new.commands.run("echo hi").stdout == "hi\n"
                samples["create"]["e2b"].append((time.perf_counter() - started) * 1000)
                new.kill()

            ops: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
                "run": (
                    lambda: native.exec(["true"]),
                    lambda: sandbox.commands.run("true"),
                ),
                # What commands.run runs: E2B's SDK sends `/bin/bash -l -c CMD`,
                # so the same login shell through podbay's SDK is the like for like.
                "run_login": (
                    lambda: native.exec(["/bin/bash", "-l", "-c", "true"]),
                    lambda: sandbox.commands.run("true"),
                ),
                "write": (
                    lambda: native.write_file_bytes("/tmp/bench.bin", PAYLOAD),
                    lambda: sandbox.files.write("/tmp/bench.bin", PAYLOAD),
                ),
                "read": (
                    lambda: native.read_file_bytes("/tmp/bench.bin"),
                    lambda: sandbox.files.read("/tmp/bench.bin", format="bytes"),
                ),
                "run_code": (
                    lambda: native.run_code("1+1"),
                    lambda: sandbox.run_code("1+1"),
                ),
            }
            try:
                assert native.run_code("1+1").text == "2"
                assert sandbox.run_code("1+1").text == "2"
                for podbay_op, e2b_op in ops.values():  # warm both paths
                    for _ in range(3):
                        podbay_op()
                        e2b_op()
                for round_ in range(args.rounds):
                    if round_ < args.creates:
                        podbay_create()
                        e2b_create()
                    for op, (podbay_op, e2b_op) in ops.items():
                        samples[op]["podbay"].append(timed(podbay_op))
                        samples[op]["e2b"].append(timed(e2b_op))
            finally:
                sandbox.kill()
                client.delete(native.name)
    rows = []
    for op in OPERATIONS:
        podbay_ms = statistics.median(samples[op]["podbay"])
        e2b_ms = statistics.median(samples[op]["e2b"])
        rows.append(
            {
                "operation": op,
                "podbay_p50_ms": round(podbay_ms, 2),
                "e2b_p50_ms": round(e2b_ms, 2),
                "ratio": round(e2b_ms / podbay_ms, 2),
                "n": len(samples[op]["e2b"]),
                "compared": COMPARED[op],
            }
        )
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"{'operation':10} {'podbay p50':>12} {'E2B p50':>12} {'ratio':>6} {'n':>4}")
        for row in rows:
            print(
                f"{row['operation']:10} {row['podbay_p50_ms']:>10} ms {row['e2b_p50_ms']:>9} ms "
                f"{row['ratio']:>6} {row['n']:>4}  {row['compared']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
