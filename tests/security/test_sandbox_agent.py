"""Code in a sandbox cannot take over or take down its agent (PID 1).

The attacks (:data:`podbay.runtime.probes.AGENT_ATTACKS`, also run by
``podbay doctor``): ptrace the agent, steal its listening socket with
``pidfd_getfd(1, 3)`` (and then answer the gateway itself), open its memory or
descriptors through ``/proc/1``, stop it with SIGSTOP, read its environment,
or make it the OOM killer's first choice through ``/proc/1/oom_score_adj``.

Under runc each is refused by the host kernel: the agent is non-dumpable and
its memory belongs to the host's user namespace (docs/runtime.md, "The agent
inside"). Under gVisor the agent runs as a uid that commands, each in a user
namespace without it, cannot reach (podbay.agent.guard): before, sandbox
code could stop the agent and open its pipes there. Three outcomes are
gVisor's own and harmless (probes.OWN_KERNEL_HARMLESS).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from podbay.runtime import probes
from podbay.settings import Settings
from podbay.testing.fixtures import OCI_RUNTIMES, DriverSession, Machines, session_for, settings_for
from podbay.wire import paths

pytestmark = [pytest.mark.root, pytest.mark.timeout(180)]


@pytest.fixture(scope="module", params=OCI_RUNTIMES)
def oci_settings(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    yield from settings_for(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def oci_session(oci_settings: Settings) -> Iterator[DriverSession]:
    yield from session_for(oci_settings)


def test_sandbox_code_cannot_trace_or_rob_the_agent(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    gvisor = Path(oci_session.settings.runtime.oci_runtime).name == "runsc"
    m = oci_machines.up()
    outcomes = probes.agent_attacks(m.agent)
    assert set(outcomes) == {
        "pidfd_getfd",
        "ptrace",
        "mem",
        "fd",
        "take_fd",
        "signal",
        "oom_score_adj",
        "environ",
        "preload",
    }
    allowed = set(probes.OWN_KERNEL_HARMLESS) if gvisor else set()
    won = {k: v for k, v in outcomes.items() if k not in allowed and not v.startswith("refused")}
    assert won == {}, outcomes
    assert probes.agent_out_of_reach(m.agent, own_kernel=gvisor) is None
    # The agent still serves; commands may still trace and signal their own processes.
    traced = m.agent.exec(
        [
            "python3",
            "-c",
            "import ctypes, subprocess; libc = ctypes.CDLL(None, use_errno=True); "
            "p = subprocess.Popen(['sleep', '30']); "
            "print('traced=%d' % libc.ptrace(0x4206, p.pid, 0, 0)); p.kill(); p.wait(); "
            "print('killed=%d' % p.returncode)",
        ]
    )
    assert traced.stdout.split() == ["traced=0", "killed=-9"], traced


def test_what_the_agent_creates_belongs_to_root(oci_machines: Machines) -> None:
    """Under gVisor the agent is not root: what it writes for a caller (a file,
    its missing parents, a directory) is handed to root all the same."""
    m = oci_machines.up()
    body = b"made by the agent\n"
    transport = httpx.HTTPTransport(uds=str(m.agent.socket_path))
    with httpx.Client(transport=transport, base_url="http://agent") as http:
        written = http.put(
            paths.FILES,
            params={"path": "/workspace/new/deeper/file"},
            content=body,
            headers={"X-Podbay-Sha256": hashlib.sha256(body).hexdigest()},
        )
        assert written.status_code == 200, written.text
        made = http.post(paths.FILES_MKDIR, json={"path": "/workspace/a/b", "parents": True})
        assert made.status_code == 200, made.text
    owners = m.agent.exec(
        [
            "python3",
            "-c",
            "import os; print(*(os.stat('/workspace/' + p).st_uid for p in "
            "['new', 'new/deeper', 'new/deeper/file', 'a', 'a/b']))",
        ]
    )
    assert owners.stdout.split() == ["0"] * 5, owners


def test_the_agent_finds_accounts_without_the_sandboxs_nss_modules(oci_machines: Machines) -> None:
    """An account is looked up in /etc/passwd by the agent itself: the C
    library's lookup would follow the sandbox's nsswitch.conf and load the
    ``libnss_<name>`` module it names from the sandbox's own library directories,
    into the agent. With nsswitch.conf naming only a module that does not
    exist, the C library finds no account; the agent still does."""
    m = oci_machines.up()
    assert m.agent.sh("printf 'passwd: podbaynone\\ngroup: podbaynone\\n' > /etc/nsswitch.conf").ok
    found = m.agent.exec(["id", "-u"], user="user")
    assert found.ok, found
    assert found.stdout.strip() == "1000", found
    assert m.agent.exec(["id", "-un"]).exit_code != 0  # the C library's lookup now fails


def test_sandbox_code_that_kills_everything_it_can_stops_no_later_command(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    """``kill -9 -1`` as root takes every process root may signal: under gVisor
    that is the launcher of commands too (podbay.agent.launcher), never the
    agent. The next command still runs, and the agent stays out of reach."""
    gvisor = Path(oci_session.settings.runtime.oci_runtime).name == "runsc"
    m = oci_machines.up()
    parent = "cat /proc/$PPID/stat | cut -d' ' -f1"
    before = m.agent.exec(["sh", "-c", parent]).stdout.strip()
    assert (before != "1") == gvisor  # under gVisor, commands are the launcher's
    # All but itself and init; a moment later, so that the launcher answered
    # for it (killed before, it could not tell the agent the command started).
    m.agent.exec(["sh", "-c", "(sleep 1; kill -9 -1) >/dev/null 2>&1 &"])
    time.sleep(3)
    after = m.agent.exec(["sh", "-c", f"{parent}; echo ran"])
    assert after.stdout.split()[1:] == ["ran"], after
    if gvisor:
        assert after.stdout.split()[0] != before  # a new launcher
    assert probes.agent_out_of_reach(m.agent, own_kernel=gvisor) is None
