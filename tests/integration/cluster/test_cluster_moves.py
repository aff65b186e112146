"""Stopped sandboxes move between nodes: carry-over at the age ceiling off a
drained node, and ``podbay node drain`` (with and without ``--evict``).
Files and installed software travel (SHA-256 over them before and after);
a move that fails mid-transfer leaves the sandbox on its node, intact.
A sandbox of class gVisor moves as runc's do.

The package's cluster (conftest.py: 2 control replicas behind haproxy, 3
nodes running runc by default and gVisor), with a lifecycle pass every half
second and an age ceiling an hour away; the tests run in file order, the
last kills a node. Where a sandbox lands is pinned by marking the other
nodes drained in the store for the attach (placement reads that flag); a
sandbox reaches its ceiling when the test moves its row's ``ceiling_at``
(set at start to start + max age) to now, rather than after waiting out a
short ceiling: the lifecycle pass acts on that column alone. What the
store records is read with SQL. None of this is public API; it is what the
control plane and an operator's ``podbay node`` commands read and write.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from podbay.testing.local_cluster import LocalCluster, process_io

pytestmark = pytest.mark.root

MIB = 1 << 20
#: What must travel: a workspace file of random data (its size in MiB
#: formatted in), a program installed outside the workspace, a file of the
#: base image deleted (an overlay whiteout).
MAKE = (
    "head -c {mib}M /dev/urandom > /workspace/big && "
    "printf '#!/bin/sh\\necho installed-tool-ok\\n' > /usr/local/bin/tool && "
    "chmod 755 /usr/local/bin/tool && rm /etc/issue && sync"
)
#: ``uname -r`` in a gVisor sandbox: gVisor's own kernel, not the host's.
GVISOR_KERNEL = "4.4.0\n"
FINGERPRINT = (
    "sha256sum /workspace/big /usr/local/bin/tool && stat -c '%a %n' /usr/local/bin/tool && "
    "tool && if test -e /etc/issue; then echo issue-back; else echo issue-gone; fi"
)


@pytest.fixture(scope="module")
def token(cluster: LocalCluster) -> str:
    # Drains report every sandbox of a node: the tests count on theirs alone.
    assert sql(cluster, "SELECT name FROM sandboxes") == [], "an earlier module left sandboxes"
    return cluster.create_deployment("move-agent")


def sql(cluster: LocalCluster, text: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(cluster.store_url, autocommit=True) as conn:
        cur = conn.execute(text, params)
        return cur.fetchall() if cur.description else []


def row(cluster: LocalCluster, name: str) -> dict[str, Any]:
    ((node, state, machine),) = sql(
        cluster, "SELECT node, state, machine_id FROM sandboxes WHERE name=%s", name
    )
    return {"node": node, "state": state, "machine": machine}


def node_name(server: Any) -> str:
    return str(server.env["PODBAY_NODE_NAME"])


def holds(cluster: LocalCluster, node: str, machine: str) -> bool:
    """The node's runc or gVisor driver has a record of ``machine``."""
    (server,) = [n for n in cluster.nodes if node_name(n) == node]
    data = Path(server.data_dir)
    return any(
        (machines / machine / "machine.json").exists()
        for machines in (data / "machines", data / "gvisor" / "machines")
    )


def node_state(cluster: LocalCluster, node: str) -> str:
    listing = json.loads(cluster.cli("node", "list", "--json").stdout)
    return str(next(n["state"] for n in listing if n["name"] == node))


def attach_on(
    cluster: LocalCluster,
    token: str,
    node: str,
    *names: str,
    classes: dict[str, str] | None = None,
    options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Attach each of ``names`` new on ``node`` (of its class in ``classes``,
    else the default; with attach's ``options``): the other nodes are marked
    drained meanwhile."""
    others = [node_name(n) for n in cluster.nodes if node_name(n) != node]
    sql(cluster, "UPDATE nodes SET drained=1 WHERE name = ANY(%s)", others)
    handles = []
    try:
        time.sleep(1.2)  # replicas re-read the nodes at most once a second
        for name in names:
            asked = (classes or {}).get(name)
            body = {**({"class": asked} if asked else {}), **(options or {})}
            r = cluster.attach(token, name, **({"json": body} if body else {}))
            assert r.status_code == 200, r.text
            handles.append(r.json())
    finally:
        sql(cluster, "UPDATE nodes SET drained=0 WHERE name = ANY(%s)", others)
        time.sleep(1.2)
    for name in names:
        assert row(cluster, name)["node"] == node
    return handles


def reach_ceiling(cluster: LocalCluster, name: str) -> None:
    """``name``'s age ceiling is now: the next lifecycle pass (half a second
    away) stops it as at a real ceiling. A write like a transition's: the
    version moves, so no write based on the row as it was can undo it."""
    changed = sql(
        cluster,
        "UPDATE sandboxes SET ceiling_at=%s, version=version+1"
        " WHERE name=%s AND state IN ('running', 'suspended') RETURNING name",
        time.time(),
        name,
    )
    assert changed == [(name,)], changed


def api(cluster: LocalCluster, token: str, method: str, path: str) -> httpx.Response:
    return httpx.request(
        method,
        f"{cluster.url}/api/v1/sandboxes/{path}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


def run(handle: dict[str, Any], script: str) -> str:
    r = httpx.post(
        handle["endpoint"] + "/v1/exec",
        headers=handle["headers"],
        json={"command": ["/bin/sh", "-c", script]},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["exit_code"] == 0, doc
    return str(doc["stdout"])


def fill(handle: dict[str, Any], mib: int) -> str:
    run(handle, MAKE.format(mib=mib))
    print_ = run(handle, FINGERPRINT)
    assert "installed-tool-ok" in print_
    assert "issue-gone" in print_
    return print_


def wait_for(what: str, check: Any, timeout: float = 120.0, every: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(every)


def drain(cluster: LocalCluster, node: str, *more: str) -> tuple[int, dict[str, Any]]:
    out = cluster.cli("node", "drain", node, "--json", *more, check=False, timeout=600)
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, json.loads(out.stdout)


def test_carry_over_at_the_ceiling_moves_off_a_drained_node(
    cluster: LocalCluster, token: str
) -> None:
    source = node_name(cluster.nodes[0])
    # Its own variables and memory travel with it (the target's build of its
    # environment gets the sandbox's variables over it).
    options = {"env": {"MOVED": "with-it"}, "memory_mib": 320}
    (h,) = attach_on(cluster, token, source, "ceiling", options=options)
    # The size is the point here: the control plane must carry none of it.
    before = fill(h, 100)
    machine = row(cluster, "ceiling")["machine"]
    controls = [c.pid() for c in cluster.controls]
    io_before = [process_io(pid) for pid in controls]
    code, report = drain(cluster, source)
    try:
        assert code == 0
        # A running sandbox is not interrupted by a drain.
        assert [k["name"] for k in report["kept"]] == ["ceiling"]
        assert run(h, "echo still-here") == "still-here\n"
        # At the ceiling the lifecycle stops it and, its node being drained, moves it.
        # Replicas re-read the nodes at most once a second: a pass within that
        # second of the drain still sees the node open and stops it in place.
        time.sleep(1.2)
        reach_ceiling(cluster, "ceiling")
        wait_for("moved at the ceiling", lambda: row(cluster, "ceiling")["node"] != source)
        moved = row(cluster, "ceiling")
        # A replica drove the move; the 100 MiB went node to node, not through it.
        for pid, before_io in zip(controls, io_before, strict=True):
            after = process_io(pid)
            carried = sum(after[k] - before_io[k] for k in ("rchar", "wchar"))
            assert carried < 8 * MIB, (pid, carried)
        assert moved["state"] == "stopped"
        assert moved["machine"] == machine
        assert holds(cluster, moved["node"], machine)
        # The source's copy goes right after the row names the target.
        wait_for("the old copy destroyed", lambda: not holds(cluster, source, machine), 30)
        again = cluster.attach(token, "ceiling").json()
        assert again["start"] == "carried_over"
        assert cluster.node_for(again["endpoint"]).env["PODBAY_NODE_NAME"] == moved["node"]
        assert run(again, FINGERPRINT) == before
        assert run(again, "echo $MOVED") == "with-it\n"
        assert run(again, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes") == f"{320 * MIB}\n"
        assert again["env"] == {"MOVED": "with-it"}
        assert again["memory_mib"] == 320
        # Its events tell the story (docs/observability.md).
        events = api(cluster, token, "GET", "ceiling/events").json()["events"]
        kinds = [e["kind"] for e in events]
        assert kinds[-3:] == ["stopped", "moved", "carried_over"], kinds
        assert f"from node {source} to {moved['node']}" in events[-2]["reason"]
    finally:
        cluster.cli("node", "undrain", source)
    assert api(cluster, token, "DELETE", "ceiling").status_code in (200, 204)


def test_drain_moves_stopped_sandboxes_and_evict_moves_the_rest(
    cluster: LocalCluster, token: str
) -> None:
    source = node_name(cluster.nodes[1])
    # gVisor proves itself on each node in the background after the default class.
    wait_for(
        "gVisor proven on every node",
        lambda: all(
            "gvisor" in json.loads(report)["classes"]
            for (report,) in sql(cluster, "SELECT report FROM nodes")
        ),
    )
    h, running, suspended, gvisor = attach_on(
        cluster,
        token,
        source,
        "stopped-one",
        "running-one",
        "suspended-one",
        "gvisor-one",
        classes={"gvisor-one": "gvisor"},
    )
    # Small: what a drain moves is checked here, not how much (the ceiling test's 100 MiB).
    before = fill(h, 8)
    # The ceiling stops it; its node is neither drained nor full: it stays there.
    reach_ceiling(cluster, "stopped-one")
    wait_for("stopped at the ceiling", lambda: row(cluster, "stopped-one")["state"] == "stopped")
    assert row(cluster, "stopped-one")["node"] == source
    run(running, "echo kept > /workspace/mark")
    run(suspended, "echo kept > /workspace/mark")
    assert run(gvisor, "uname -r") == GVISOR_KERNEL
    gvisor_before = fill(gvisor, 4)
    r = api(cluster, token, "POST", "suspended-one/stop")
    assert r.status_code in (200, 204), r.text
    assert row(cluster, "suspended-one")["state"] == "suspended"

    code, report = drain(cluster, source)
    try:
        assert code == 0, report
        assert [m["name"] for m in report["moved"]] == ["stopped-one"]
        (moved,) = report["moved"]
        assert moved["bytes"] > 8 * MIB
        assert len(moved["sha256"]) == 64
        kept = ["gvisor-one", "running-one", "suspended-one"]
        assert sorted(k["name"] for k in report["kept"]) == kept
        target = row(cluster, "stopped-one")["node"]
        assert target == moved["to"] != source
        again = cluster.attach(token, "stopped-one").json()
        assert again["start"] == "carried_over"
        assert cluster.node_for(again["endpoint"]).env["PODBAY_NODE_NAME"] == target
        assert run(again, FINGERPRINT) == before

        code, report = drain(cluster, source, "--evict")
        assert code == 0, report
        # Their ceiling is an hour away: the eviction moved them, not the lifecycle.
        assert sorted(m["name"] for m in report["moved"]) == kept
        assert report["failed"] == report["kept"] == []
        assert sql(cluster, "SELECT name FROM sandboxes WHERE node=%s", source) == []
        for name in ("running-one", "suspended-one"):
            again = cluster.attach(token, name).json()
            assert again["start"] == "carried_over"
            assert cluster.node_for(again["endpoint"]).env["PODBAY_NODE_NAME"] != source
            assert run(again, "cat /workspace/mark") == "kept\n"
        # The gVisor sandbox's disk moved as runc's do, and it runs under gVisor there.
        again = cluster.attach(token, "gvisor-one").json()
        assert (again["start"], again["runtime_class"]) == ("carried_over", "gvisor")
        assert cluster.node_for(again["endpoint"]).env["PODBAY_NODE_NAME"] != source
        assert run(again, f"uname -r && {FINGERPRINT}") == GVISOR_KERNEL + gvisor_before
        # Nothing of them is left on the drained node: it can be forgotten.
        for name in ("stopped-one", *kept):
            assert not holds(cluster, source, row(cluster, name)["machine"])
    finally:
        cluster.cli("node", "undrain", source)


def test_a_move_cut_off_midway_leaves_the_sandbox_on_its_node(
    cluster: LocalCluster, token: str
) -> None:
    """The receiving node is killed (-9) while the disk streams to it; then an
    attach moves the sandbox off its drained node before starting it."""
    source, target = (node_name(n) for n in cluster.nodes[1:3])
    (h,) = attach_on(cluster, token, source, "cut")
    # Random, so the transfer lasts (a second or more) while the test finds it;
    # hashed as it is written.
    script = "head -c 100M /dev/urandom | tee /workspace/big | sha256sum && sync"
    before = run(h, script).split()[0]
    machine = row(cluster, "cut")["machine"]
    (receiver,) = [n for n in cluster.nodes if node_name(n) == target]
    # The only place it can go: the first node is drained meanwhile.
    first = node_name(cluster.nodes[0])
    sql(cluster, "UPDATE nodes SET drained=1 WHERE name=%s", first)
    proc = subprocess.Popen(
        [sys.executable, "-m", "podbay.cli.main", "node", "drain", source, "--evict", "--json"],
        env=cluster.operator_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    incoming = Path(receiver.data_dir) / "machines"
    try:
        wait_for(
            "the transfer to start",
            lambda: (
                any(p.name.startswith(f".incoming-{machine}") for p in incoming.iterdir())
                if incoming.exists()
                else False
            ),
            timeout=120,
            every=0.005,
        )
        receiver.kill9()
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 1, out + err
        report = json.loads(out)
        assert [f["name"] for f in report["failed"]] == ["cut"]
        assert row(cluster, "cut") == {"node": source, "state": "stopped", "machine": machine}
        assert holds(cluster, source, machine)
        # Its node is still drained: the next attach moves it first (to the first
        # node, once the killed one is reported lost), then starts it there.
        sql(cluster, "UPDATE nodes SET drained=0 WHERE name=%s", first)
        wait_for("the killed node reported lost", lambda: node_state(cluster, target) == "lost")
        again = cluster.attach(token, "cut").json()
        assert again["start"] == "carried_over"
        assert cluster.node_for(again["endpoint"]).env["PODBAY_NODE_NAME"] == first
        assert run(again, "sha256sum /workspace/big").split()[0] == before
        assert row(cluster, "cut")["node"] == first
        wait_for("the old copy destroyed", lambda: not holds(cluster, source, machine), 30)
    finally:
        if proc.poll() is None:
            proc.kill()
        sql(cluster, "UPDATE nodes SET drained=0 WHERE name=%s", first)
        cluster.cli("node", "undrain", source)
