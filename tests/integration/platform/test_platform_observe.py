"""Per-sandbox metrics and events through the HTTP API, on real sandboxes of
every class (docs/observability.md): a memory hog's figure rises and falls
in the first sample after each change, a CPU hog shows, each lifecycle
transition leaves its event, and another deployment's token sees none of it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root

MIB = 1 << 20
HOG_MIB = 200
#: Allocates and touches HOG_MIB, says so, holds it until /tmp/release exists.
HOG = f"""
import os, sys, time
held = bytearray({HOG_MIB} * 1024 * 1024)
for i in range(0, len(held), 4096):
    held[i] = 1
print("held", flush=True)
while not os.path.exists("/tmp/release"):
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("observe"),
        env={
            "PODBAY_RUNTIME_CLASSES": "gvisor,container,vm",
            "PODBAY_RUNTIME_MEMORY_BYTES": str(768 * MIB),
            "PODBAY_LIFECYCLE_INTERVAL_SECONDS": "0.25",
        },
    ) as s:
        yield s


@pytest.fixture(scope="module")
def short_lived(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    """Its ceiling stops a sandbox soon, so carrying over can be seen."""
    with PlatformServer.start(
        tmp_path_factory.mktemp("observe-ceiling"),
        env={
            "PODBAY_LIFECYCLE_MAX_AGE_SECONDS": "8",
            "PODBAY_LIFECYCLE_INTERVAL_SECONDS": "0.25",
        },
    ) as s:
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("observed")


def wait_for_class(server: PlatformServer, name: str) -> None:
    deadline = time.monotonic() + 900
    while name not in server.http.get("/healthz").json()["classes"]["available"]:
        assert time.monotonic() < deadline, f"{name} never became available"
        time.sleep(0.5)


def now() -> datetime:
    return datetime.now(UTC)


def at(sample: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(sample["at"].replace("Z", "+00:00"))


def samples(server: PlatformServer, token: str, name: str) -> list[dict[str, Any]]:
    r = server.api("GET", f"/api/v1/sandboxes/{name}/metrics", token)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["interval_seconds"] == 2
    found: list[dict[str, Any]] = doc["samples"]
    return found


def first_after(
    server: PlatformServer, token: str, name: str, moment: datetime, keep_busy: Any = None
) -> dict[str, Any]:
    """The first sample taken after ``moment`` (waiting for the next period)."""
    deadline = time.monotonic() + 60
    while True:
        later = [s for s in samples(server, token, name) if at(s) > moment]
        if later:
            return later[0]
        assert time.monotonic() < deadline, "no sample came"
        if keep_busy is not None:
            keep_busy()
        time.sleep(0.2)


def spawn(server: PlatformServer, handle: dict[str, Any], *argv: str) -> str:
    r = server.data(handle, "POST", "/v1/processes", json={"command": list(argv)})
    assert r.status_code == 200, r.text
    return str(r.json()["process_id"])


def wait_output(
    server: PlatformServer, handle: dict[str, Any], pid: str, want: str
) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        polled: dict[str, Any] = server.data(
            handle, "GET", f"/v1/processes/{pid}", params={"wait_ms": 1000}
        ).json()
        if want in polled.get("stdout", "") or (want == "" and polled["state"] == "exited"):
            return polled
        assert polled.get("state") == "running", polled
        assert time.monotonic() < deadline, polled
        time.sleep(0.05)


@pytest.mark.parametrize(
    "class_",
    [
        "gvisor",
        "container",
        # Under TCG the vm class is proven in the background: minutes on a busy host.
        pytest.param("vm", marks=pytest.mark.timeout(1200)),
    ],
)
def test_a_memory_hog_rises_and_falls_within_one_sample_period(server, token, class_):
    if class_ == "vm":
        wait_for_class(server, "vm")
    name = f"hog-{class_}"
    r = server.attach(token, name, json={"class": class_})
    assert r.status_code == 200, r.text
    handle = r.json()
    before = first_after(server, token, name, now())
    assert before["memory_limit_bytes"] == 768 * MIB
    assert 0 < before["memory_bytes"] < before["memory_limit_bytes"]
    assert before["disk_bytes"] > 0

    pid = spawn(server, handle, "python3", "-c", HOG)
    wait_output(server, handle, pid, "held")
    held = first_after(server, token, name, now())
    assert held["memory_bytes"] >= before["memory_bytes"] + (HOG_MIB - 30) * MIB, (before, held)

    assert server.exec(handle, "touch", "/tmp/release").json()["exit_code"] == 0
    wait_output(server, handle, pid, "")
    freed = first_after(server, token, name, now())
    assert freed["memory_bytes"] <= held["memory_bytes"] - (HOG_MIB - 30) * MIB, (held, freed)
    server.api("DELETE", f"/api/v1/sandboxes/{name}", token)


@pytest.mark.parametrize("class_", ["gvisor", "container"])
def test_a_cpu_hog_shows_as_cpu(server, token, class_):
    name = f"busy-{class_}"
    h = server.attach(token, name, json={"class": class_}).json()
    quiet = first_after(server, token, name, now())
    pid = spawn(server, h, "sh", "-c", "while :; do :; done")
    started = now()
    first_after(server, token, name, started)  # this period may have begun before
    busy = first_after(server, token, name, now())
    # A busy loop's share of a core: the whole core on an idle host, less on a
    # shared one (the cgroup counts what it got); far above the quiet figure.
    assert busy["cpu_percent"] > max(5.0, 5 * quiet["cpu_percent"]), (quiet, busy)
    server.data(h, "DELETE", f"/v1/processes/{pid}")
    server.api("DELETE", f"/api/v1/sandboxes/{name}", token)


def kinds(server: PlatformServer, token: str, name: str) -> list[str]:
    r = server.api("GET", f"/api/v1/sandboxes/{name}/events", token)
    assert r.status_code == 200, r.text
    return [e["kind"] for e in r.json()["events"]]


def test_each_lifecycle_transition_leaves_its_event(short_lived):
    server = short_lived
    token = server.create_deployment("lived")
    h = server.attach(token, "life").json()
    assert kinds(server, token, "life") == ["created", "ready"]
    assert server.api("POST", "/api/v1/sandboxes/life/stop", token).status_code == 204
    assert kinds(server, token, "life")[-1] == "suspended"
    h = server.attach(token, "life").json()
    assert h["start"] == "resumed"
    assert kinds(server, token, "life")[-1] == "resumed"
    # Past its ceiling (8 s) the sandbox is stopped, then carried over on attach.
    deadline = time.monotonic() + 60
    while "stopped" not in kinds(server, token, "life"):
        assert time.monotonic() < deadline
        server.exec(h, "true")  # busy: the idle timer never suspends it first
        time.sleep(0.2)
    assert server.attach(token, "life").json()["start"] == "carried_over"
    assert server.api("DELETE", "/api/v1/sandboxes/life", token).status_code == 204
    r = server.api("GET", "/api/v1/sandboxes/life/events", token)
    events = r.json()["events"]
    assert [e["kind"] for e in events] == [
        "created",
        "ready",
        "suspended",
        "resumed",
        "stopped",
        "carried_over",
        "removed",
    ]
    assert all(e["reason"] for e in events), events
    since = events[3]["at"]
    r = server.api("GET", "/api/v1/sandboxes/life/events", token, params={"since": since})
    assert [e["kind"] for e in r.json()["events"]] == ["stopped", "carried_over", "removed"]


def test_another_deployments_token_reads_nothing(server, token):
    server.attach(token, "mine")
    first_after(server, token, "mine", now())
    other = server.create_deployment("stranger")
    for what in ("metrics", "events"):
        r = server.api("GET", f"/api/v1/sandboxes/mine/{what}", other)
        assert (r.status_code, r.json()["code"]) == (404, "SANDBOX_NOT_FOUND"), what
        r = server.api("GET", f"/api/v1/sandboxes/never/{what}", token)
        assert (r.status_code, r.json()["code"]) == (404, "SANDBOX_NOT_FOUND"), what
    r = server.api("GET", "/api/v1/sandboxes/mine/metrics", token, params={"since": "yesterday"})
    assert (r.status_code, r.json()["code"]) == (400, "REQUEST_INVALID")
    server.api("DELETE", "/api/v1/sandboxes/mine", token)


def commands(server: PlatformServer, token: str, name: str) -> dict[str, Any]:
    r = server.api("GET", f"/api/v1/sandboxes/{name}/commands", token)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def test_the_command_log_records_argv_user_exit_and_duration_never_output(server, token):
    h = server.attach(token, "logged").json()
    r = server.exec(h, "sh", "-c", "cat /etc/hostname; sleep 0.3; exit 3")
    assert r.json()["exit_code"] == 3
    output = r.json()["stdout"].strip()
    assert server.exec(h, "id", "-u", user="nobody").json()["stdout"].strip() != "0"
    pid = spawn(server, h, "sh", "-c", "exit 5")
    wait_output(server, h, pid, "")
    doc = commands(server, token, "logged")
    assert doc["enabled"] is True
    logged = doc["commands"]
    assert [(c["kind"], c["argv"], c["user"], c["exit_code"]) for c in logged] == [
        ("exec", ["sh", "-c", "cat /etc/hostname; sleep 0.3; exit 3"], "root", 3),
        ("exec", ["id", "-u"], "nobody", 0),
        ("spawn", ["sh", "-c", "exit 5"], "root", 5),
    ]
    assert logged[0]["duration_ms"] >= 300
    assert output
    assert output not in str(logged)
    since = logged[1]["at"]
    r = server.api("GET", "/api/v1/sandboxes/logged/commands", token, params={"since": since})
    assert [c["kind"] for c in r.json()["commands"]] == ["spawn"]
    # A suspended sandbox's agent is frozen: its log is still read (as last seen).
    assert server.api("POST", "/api/v1/sandboxes/logged/stop", token).status_code == 204
    assert commands(server, token, "logged")["commands"] == logged
    server.api("DELETE", "/api/v1/sandboxes/logged", token)


def test_the_command_log_is_off_when_the_deployment_says_so(server):
    quiet = server.create_deployment(
        "quiet", spec="name: quiet\nsandbox:\n  toolchain: never\n  command_log: false\n"
    )
    h = server.attach(quiet, "hush").json()
    assert server.exec(h, "true").json()["exit_code"] == 0
    assert commands(server, quiet, "hush") == {"commands": [], "enabled": False}
    server.api("DELETE", "/api/v1/sandboxes/hush", quiet)


def test_both_sdks_read_metrics_events_and_commands(server, token):
    import asyncio

    from podbay import AsyncSandboxClient, SandboxClient

    with SandboxClient(identity_token=token, server_url=server.url) as client:
        sb = client.sandbox("sdk")
        sb.exec(["true"])
        first_after(server, token, "sdk", now())
        sample = sb.metrics().samples[-1]
        assert sample.memory_bytes > 0
        assert sample.memory_limit_bytes == 768 * MIB
        assert [e.kind for e in sb.events().events] == ["created", "ready"]
        (entry,) = sb.commands().commands
        assert (entry.argv, entry.exit_code) == (["true"], 0)
        assert client.metrics("sdk", since=sample.at).samples == []

    async def read() -> tuple[int, list[str]]:
        async with AsyncSandboxClient(identity_token=token, server_url=server.url) as aclient:
            metrics = await aclient.metrics("sdk")
            events = await aclient.events("sdk")
            return len(metrics.samples), [e.kind for e in events.events]

    count, kinds_seen = asyncio.run(read())
    assert count >= 1
    assert kinds_seen == ["created", "ready"]
    server.api("DELETE", "/api/v1/sandboxes/sdk", token)


def test_the_cli_shows_top_and_logs_with_hostile_text_escaped(server, token):
    import json
    import os

    from podbay.testing.platform import run_cli

    h = server.attach(token, "cli").json()
    server.exec(h, "echo", "\x1b[31mred")  # an escape sequence in an argv
    first_after(server, token, "cli", now())
    env = {**os.environ, "ASTRO_AUTHZ_TOKEN": token, "PODBAY_SERVER_URL": server.url}
    table = run_cli(["sandbox", "top", "cli", "--once"], env).stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "STATE", "CPU%"]
    assert table[1].split()[:2] == ["cli", "running"]
    doc = json.loads(run_cli(["sandbox", "top", "--json"], env).stdout)
    assert doc["cli"]["memory_limit_bytes"] == 768 * MIB
    text = run_cli(["sandbox", "logs", "cli"], env).stdout
    assert "\x1b" not in text
    assert "\\x1b[31mred" in text
    lines = text.splitlines()
    assert "event    created" in lines[0]
    assert "event    ready" in lines[1]
    assert "exec     root  exit 0" in lines[2], lines
    server.api("DELETE", "/api/v1/sandboxes/cli", token)


def test_e2b_sdks_get_metrics_reads_the_samples(server):
    e2b = pytest.importorskip("e2b")
    from podbay.testing.platform import SANDBOX_SPEC

    out = server.cli(
        "deployment", "create", "e2b-m", "--spec", "-", "--e2b-key", input=SANDBOX_SPEC
    )
    key = out.stdout.strip().splitlines()[-1]
    opts = {"api_key": key, "api_url": server.base_url, "sandbox_url": server.base_url}
    sandbox = e2b.Sandbox.create(**opts)
    try:
        started = now()
        deadline = time.monotonic() + 60
        while not (metrics := sandbox.get_metrics()):
            assert time.monotonic() < deadline, "no metrics came"
            time.sleep(0.5)
        m = metrics[-1]
        assert m.mem_total == 768 * MIB
        assert 0 < m.mem_used < m.mem_total
        assert m.disk_used > 0
        assert m.cpu_count >= 1
        assert 0 <= m.cpu_used_pct <= 100
        assert sandbox.get_metrics(start=started.replace(year=2030)) == []
    finally:
        sandbox.kill()


def test_an_oom_kill_leaves_an_event(server, token):
    h = server.attach(token, "oom", json={"class": "container", "memory_mib": 256}).json()
    first_after(server, token, "oom", now())  # the node's first reading: its baseline
    r = server.exec(h, "python3", "-c", "x = bytearray(600 << 20)")
    assert r.json()["exit_code"] == 137, r.json()
    assert r.json().get("oom_killed") is True, r.json()
    deadline = time.monotonic() + 60
    while "oom_killed" not in kinds(server, token, "oom"):
        assert time.monotonic() < deadline, kinds(server, token, "oom")
        time.sleep(0.2)
    events = server.api("GET", "/api/v1/sandboxes/oom/events", token).json()["events"]
    (killed,) = [e for e in events if e["kind"] == "oom_killed"]
    assert "out-of-memory killer ended a process" in killed["reason"]
    server.api("DELETE", "/api/v1/sandboxes/oom", token)


def test_logs_follow_prints_new_commands_as_they_come(server, token):
    import os
    import subprocess
    import sys

    h = server.attach(token, "follow").json()
    env = {**os.environ, "ASTRO_AUTHZ_TOKEN": token, "PODBAY_SERVER_URL": server.url}
    follower = subprocess.Popen(
        [sys.executable, "-m", "podbay.cli.main", "sandbox", "logs", "follow", "-f"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        assert "event    created" in follower.stdout.readline()
        assert "event    ready" in follower.stdout.readline()
        server.exec(h, "echo", "later")
        assert follower.stdout.readline().rstrip().endswith("echo later")
    finally:
        follower.terminate()
        follower.wait(10)
        follower.stdout.close()
    server.api("DELETE", "/api/v1/sandboxes/follow", token)
