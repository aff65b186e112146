"""Attach's options on real sandboxes (container and gvisor): variables in every
command, limits seen inside (and, for gVisor's CPU quota, on the host), bounds
refused with codes, label filters, an own idle timeout, and the CLI's create,
list --label, ports, url and name completion driven as a person would."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from podbay.client import SandboxClient
from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root
MIB = 1024 * 1024
CLASSES = ["container", "gvisor"]
#: The console script a person runs (its name is what click's completion keys on).
PODBAY = str(Path(sys.executable).parent / "podbay")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    env = {
        "PODBAY_RUNTIME_CLASSES": "gvisor,container",
        # The server's own threshold is far off: only a sandbox's own one acts.
        "PODBAY_LIFECYCLE_IDLE_SECONDS": "3600",
        "PODBAY_LIFECYCLE_MIN_IDLE_SECONDS": "1",
        "PODBAY_LIFECYCLE_INTERVAL_SECONDS": "0.25",
    }
    with PlatformServer.start(tmp_path_factory.mktemp("options"), env=env) as s:
        _wait_for_classes(s, {"container", "gvisor"})
        yield s


def _wait_for_classes(server: PlatformServer, classes: set[str]) -> None:
    """Until the server has proven ``classes`` (a class is checked by starting
    its first machine; until then attach naming it is 503 without Retry-After)."""
    deadline = time.monotonic() + 600
    while not classes <= set(server.http.get("/healthz").json()["classes"]["available"]):
        assert time.monotonic() < deadline, server.http.get("/healthz").text
        time.sleep(0.25)


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("options-agent")


@pytest.fixture
def client(server: PlatformServer, token: str) -> Iterator[SandboxClient]:
    with SandboxClient(identity_token=token, server_url=server.base_url) as c:
        yield c


@pytest.fixture
def name(client: SandboxClient) -> Iterator[str]:
    sandbox = f"opt-{uuid.uuid4().hex[:8]}"
    yield sandbox
    with contextlib.suppress(Exception):  # never made
        client.delete(sandbox)


@pytest.mark.parametrize("class_", CLASSES)
def test_env_reaches_exec_spawn_terminal_and_interpreter(
    client: SandboxClient, name: str, class_: str
) -> None:
    client.attach(name, class_, env={"GREETING": "hello there", "SHARED": "sandbox"})
    show = ["sh", "-c", 'echo "$GREETING/$SHARED"']
    assert client.exec(name, show).stdout == "hello there/sandbox\n"
    # A call's own env wins over the sandbox's.
    assert client.exec(name, show, env={"SHARED": "call"}).stdout == "hello there/call\n"
    status = client.spawn(name, show)
    output = client.poll(name, status.process_id)
    while output.state == "running":
        output = client.poll(name, status.process_id, wait_ms=2000)
    assert output.stdout == "hello there/sandbox\n"
    with client.pty(name, show) as tty:
        seen = b""
        while chunk := tty.recv():
            seen += chunk
    assert seen.strip() == b"hello there/sandbox"
    execution = client.run_code(name, "import os; os.environ['GREETING']")
    assert execution.text == "'hello there'"


@pytest.mark.parametrize("class_", CLASSES)
def test_listening_ports_names_a_server_in_the_sandbox(
    client: SandboxClient, name: str, class_: str
) -> None:
    client.attach(name, class_)
    assert 8124 not in client.listening_ports(name)
    client.spawn(name, ["python3", "-m", "http.server", "8124"])
    deadline = time.monotonic() + 30
    while 8124 not in (found := client.listening_ports(name)):
        assert time.monotonic() < deadline, found
        time.sleep(0.2)


def _host_cgroup_quota(server: PlatformServer, name: str) -> tuple[int, int]:
    """The CPU quota and period of the host cgroup of sandbox ``name``'s machine."""
    for record in server.data_dir.rglob("machine.json"):
        spec = json.loads(record.read_text())["spec"]
        if spec["labels"].get("podbay.name") == name:
            machine = spec["machine_id"]
            break
    else:
        raise AssertionError(f"no machine for {name}")
    quotas = list(Path("/sys/fs/cgroup").glob(f"cpu*/podbay/*/{machine}/cpu.cfs_quota_us"))
    if quotas:
        period = quotas[0].with_name("cpu.cfs_period_us").read_text()
        return int(quotas[0].read_text()), int(period)
    (unified,) = Path("/sys/fs/cgroup").glob(f"podbay/*/{machine}/cpu.max")
    quota, period = unified.read_text().split()
    return int(quota), int(period)


@pytest.mark.parametrize("class_", CLASSES)
def test_cpu_and_memory_apply_to_the_machine(
    server: PlatformServer, client: SandboxClient, name: str, class_: str
) -> None:
    handle = client.attach(name, class_, cpus=0.5, memory_mib=384)
    assert (handle.cpus, handle.memory_mib) == (0.5, 384)
    if class_ == "container":
        # runc: the sandbox's own cgroup (v1 on this host, v2 elsewhere).
        script = (
            "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null"
            " || cat /sys/fs/cgroup/memory.max;"
            " cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us"
            " 2>/dev/null || cat /sys/fs/cgroup/cpu.max"
        )
        figures = client.exec(name, ["sh", "-c", script]).stdout.split()
        memory, quota, period = (int(x) for x in figures[:3])
        assert memory == 384 * MIB
        assert quota / period == 0.5
    else:
        # gVisor's kernel sizes its memory by the limit; its CPU quota is the
        # host cgroup's (inside, nproc counts the host's CPUs).
        meminfo = client.exec(name, ["grep", "MemTotal", "/proc/meminfo"]).stdout.split()
        assert int(meminfo[1]) * 1024 == 384 * MIB
        quota, period = _host_cgroup_quota(server, name)
        assert quota / period == 0.5


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"cpus": 0.01}, "SANDBOX_CPUS_BELOW_MIN"),
        ({"cpus": 1000}, "SANDBOX_CPUS_ABOVE_MAX"),
        ({"memory_mib": 8}, "SANDBOX_MEMORY_BELOW_MIN"),
        ({"memory_mib": 10**7}, "SANDBOX_MEMORY_ABOVE_MAX"),
        ({"idle_timeout_seconds": 0}, "SANDBOX_IDLE_TIMEOUT_BELOW_MIN"),
        ({"idle_timeout_seconds": 10**8}, "SANDBOX_IDLE_TIMEOUT_ABOVE_MAX"),
        ({"env": {"BAD NAME": "x"}}, "SANDBOX_ENV_INVALID"),
        ({"labels": {"k": "\u0000"}}, "SANDBOX_LABELS_INVALID"),
    ],
)
def test_out_of_bounds_is_refused_with_a_code(
    server: PlatformServer, token: str, name: str, body: dict[str, Any], code: str
) -> None:
    r = server.attach(token, name, json=body)
    assert (r.status_code, r.json()["code"]) == (400, code)
    assert server.api("GET", f"/api/v1/sandboxes/{name}", token).status_code == 404


def test_labels_filter_the_list(client: SandboxClient) -> None:
    tag = uuid.uuid4().hex[:8]
    names = [f"lab-{tag}-{i}" for i in range(3)]
    try:
        client.attach(names[0], labels={"run": tag, "role": "a"})
        client.attach(names[1], labels={"run": tag, "role": "b"})
        client.attach(names[2])
        assert sorted(r.name for r in client.list(labels={"run": tag})) == names[:2]
        (only,) = client.list(labels={"run": tag, "role": "b"})
        assert (only.name, only.labels) == (names[1], {"run": tag, "role": "b"})
        assert client.get(names[2]).labels is None
    finally:
        for n in names:
            client.delete(n)


def test_own_idle_timeout_suspends_the_sandbox(client: SandboxClient, name: str) -> None:
    """The server's idle threshold is an hour; this sandbox's is a second: the
    lifecycle pass suspends it, and its neighbour stays running."""
    neighbour = f"{name}-n"
    client.attach(name, "container", idle_timeout_seconds=1)
    client.attach(neighbour, "container")
    try:
        deadline = time.monotonic() + 60
        while client.get(name).state != "suspended":
            assert time.monotonic() < deadline, "the sandbox was not suspended"
            time.sleep(0.25)
        assert client.get(neighbour).state == "running"
        assert client.attach(name).start == "resumed"
    finally:
        client.delete(neighbour)


def test_options_survive_a_server_restart(
    server: PlatformServer, client: SandboxClient, name: str
) -> None:
    client.attach(name, "container", env={"KEPT": "yes"}, labels={"k": "v"}, memory_mib=320)
    server.restart()
    _wait_for_classes(server, {"container", "gvisor"})
    record = client.get(name)
    assert (record.labels, record.env, record.memory_mib) == ({"k": "v"}, {"KEPT": "yes"}, 320)
    assert client.exec(name, ["sh", "-c", "echo $KEPT"]).stdout == "yes\n"


# -- the CLI, as a person types it ------------------------------------------------------


def _podbay(server: PlatformServer, token: str, *args: str, **env: str) -> Any:
    return subprocess.run(
        [PODBAY, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "ASTRO_AUTHZ_TOKEN": token, **env},
        timeout=180,
    )


def test_cli_create_list_ports_url(server: PlatformServer, token: str, name: str) -> None:
    done = _podbay(
        server,
        token,
        "sandbox",
        "create",
        name,
        "--class",
        "container",
        "--label",
        "team=cli",
        "--env",
        "GREETING=from-cli",
        "--cpus",
        "0.5",
        "--memory",
        "320",
        "--idle-timeout",
        "600",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [name, "running", "(created)"]
    done = _podbay(server, token, "sandbox", "exec", name, "--", "sh", "-c", "echo $GREETING")
    assert done.stdout == "from-cli\n"
    listed = _podbay(server, token, "sandbox", "list", "--label", "team=cli", "--json")
    rows = json.loads(listed.stdout)
    assert [(r["name"], r["labels"], r["cpus"]) for r in rows] == [(name, {"team": "cli"}, 0.5)]
    shown = _podbay(server, token, "sandbox", "get", name).stdout.splitlines()
    assert "labels: team=cli" in shown, shown
    assert "memory_mib: 320" in shown, shown
    none = _podbay(server, token, "sandbox", "list", "--label", "team=nobody", "--json")
    assert json.loads(none.stdout) == []
    again = _podbay(server, token, "sandbox", "create", name, "--cpus", "1")
    assert again.returncode == 1
    assert "SANDBOX_OPTIONS_CONFLICT" in again.stderr
    too_big = _podbay(server, token, "sandbox", "create", f"{name}-x", "--memory", "999999")
    assert too_big.returncode == 1
    assert "SANDBOX_MEMORY_ABOVE_MAX" in too_big.stderr

    # A server in the sandbox: ports lists it, url reaches it through the gateway.
    spawned = _podbay(
        server,
        token,
        "sandbox",
        "exec",
        name,
        "--",
        "sh",
        "-c",
        "cd /tmp && echo served > index.html && "
        "(python3 -m http.server 8123 >/dev/null 2>&1 &) ; sleep 0.1",
    )
    assert spawned.returncode == 0, spawned.stderr
    deadline = time.monotonic() + 30
    while True:
        ports = _podbay(server, token, "sandbox", "ports", name)
        assert ports.returncode == 0, ports.stderr
        if "8123" in ports.stdout.split():
            break
        assert time.monotonic() < deadline, ports.stdout
        time.sleep(0.2)
    url = _podbay(server, token, "sandbox", "url", name, "8123", "/index.html").stdout.strip()
    assert url.startswith(server.base_url)
    assert url.endswith("/v1/ports/8123/index.html")
    with (
        SandboxClient(identity_token=token, server_url=server.base_url) as client,
        httpx.Client(transport=client.port_transport(name)) as http,
    ):
        assert http.get(url).text == "served\n"
    shared = _podbay(server, token, "sandbox", "url", name, "8123", "--share", "60").stdout.strip()
    assert httpx.get(shared + "index.html").text == "served\n"


def test_cli_completes_sandbox_names(
    server: PlatformServer, token: str, client: SandboxClient, name: str
) -> None:
    client.attach(name, "container")
    # What bash's completion function runs (the script `podbay completion bash` prints).
    script = _podbay(server, token, "completion", "bash")
    assert script.returncode == 0
    assert "_PODBAY_COMPLETE=bash_complete" in script.stdout
    for words, cword in (
        (f"podbay sandbox exec {name[:6]}", "3"),
        (f"podbay sandbox get {name[:-2]}", "3"),
    ):
        done = _podbay(
            server,
            token,
            _PODBAY_COMPLETE="bash_complete",
            COMP_WORDS=words,
            COMP_CWORD=cword,
        )
        assert done.returncode == 0, done.stderr
        assert f"plain,{name}" in done.stdout.splitlines(), done.stdout
    # Without a token there is nothing to list: no names, no error.
    done = subprocess.run(
        [PODBAY],
        capture_output=True,
        text=True,
        env={
            **{k: v for k, v in os.environ.items() if k != "ASTRO_AUTHZ_TOKEN"},
            "_PODBAY_COMPLETE": "bash_complete",
            "COMP_WORDS": "podbay sandbox get opt",
            "COMP_CWORD": "3",
        },
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "")


def test_vm_guest_gets_its_cpus_memory_and_env(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A vm sandbox's options shape its guest: vCPUs, RAM, variables (it boots
    cold: templates are kept for the server's own shape only); its listening
    ports are found as in the other classes."""
    env = {"PODBAY_RUNTIME_CLASSES": "vm,container", "PODBAY_RUNTIME_MEMORY_BYTES": str(512 * MIB)}
    with PlatformServer.start(tmp_path_factory.mktemp("options-vm"), env=env) as s:
        _wait_for_classes(s, {"vm"})
        token = s.create_deployment("options-vm")
        # A cold boot under TCG on a busy host can outlast the client's default
        # request timeout: the attach answers once the guest's agent does.
        with SandboxClient(
            identity_token=token, server_url=s.base_url, timeout_seconds=600
        ) as client:
            handle = client.attach("guest", "vm", cpus=2, memory_mib=320, env={"WHERE": "guest"})
            assert (handle.class_, handle.cpus, handle.memory_mib) == ("vm", 2, 320)
            script = 'nproc; grep MemTotal /proc/meminfo; echo "$WHERE"'
            nproc, _, mem_kib, _, where = client.exec("guest", ["sh", "-c", script]).stdout.split()
            assert int(nproc) == 2
            # The guest's kernel keeps some of its RAM for itself.
            assert 256 * 1024 < int(mem_kib) <= 320 * 1024
            assert where == "guest"
            # The guest's kernel lists its listening sockets as the others do.
            client.spawn("guest", ["python3", "-m", "http.server", "8125"])
            deadline = time.monotonic() + 120
            while 8125 not in (found := client.listening_ports("guest")):
                assert time.monotonic() < deadline, found
                time.sleep(0.5)
            client.delete("guest")


def test_bash_completes_a_sandbox_name_on_tab(
    server: PlatformServer, token: str, client: SandboxClient, name: str, tmp_path: Path
) -> None:
    """In a real bash on a terminal (tmux), after `eval "$(podbay completion
    bash)"`, Tab completes a sandbox's name."""
    from test_platform_interactive import Tmux

    client.attach(name, "container")
    tmux = Tmux(tmp_path)
    bin_dir = str(Path(PODBAY).parent)
    tmux("new-session", "-d", "-s", "shell", "-x", "150", "-y", "30", "bash --norc --noprofile")
    try:
        setup = (
            f"export PATH={bin_dir}:$PATH ASTRO_AUTHZ_TOKEN={token} PS1='$ '; "
            'eval "$(podbay completion bash)"; echo ready'
        )
        tmux("send-keys", "-t", "shell", setup, "Enter")
        tmux.wait_for("\nready")
        tmux("send-keys", "-t", "shell", f"podbay sandbox get {name[:8]}", "Tab")
        tmux.wait_for(f"podbay sandbox get {name} ")
    finally:
        subprocess.run(["tmux", "-S", tmux.socket, "kill-server"], capture_output=True)
