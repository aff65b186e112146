"""A ``vm`` sandbox whose agent guest root stopped (ptrace): calls answer 504
``AGENT_TIMEOUT`` after the bound instead of hanging, and the next attach
starts the sandbox again (QEMU under TCG here: slow, so one test)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

import pytest

from podbay.testing.platform import PlatformServer

pytestmark = [pytest.mark.root, pytest.mark.timeout(900)]

#: Guest root attaches to the agent (PID 1 in the guest) and stops it, and
#: holds it stopped for as long as it runs.
STOP_AGENT = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_O_TRACECLONE = 0x4206, 0x4207, 0x8
# Every thread of it (ptrace stops one thread), and the threads it starts later.
for tid in map(int, os.listdir("/proc/1/task")):
    if libc.ptrace(PTRACE_SEIZE, tid, 0, PTRACE_O_TRACECLONE) != 0:
        sys.exit("ptrace: errno %d" % ctypes.get_errno())
    libc.ptrace(PTRACE_INTERRUPT, tid, 0, 0)
print("stopped", flush=True)
time.sleep(3600)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("vm-silent"),
        env={
            "PODBAY_RUNTIME_CLASSES": "vm,container",
            "PODBAY_RUNTIME_MEMORY_BYTES": str(512 << 20),
            "PODBAY_SERVER_AGENT_ANSWER_SECONDS": "10",
        },
    ) as s:
        yield s


def test_a_traced_vm_agent_answers_504_and_the_next_attach_restarts_it(
    server: PlatformServer,
) -> None:
    token = server.create_deployment("vm-silent")
    for _ in range(900):  # 503 while the server checks the vm class at start
        r = server.attach(token, "traced", json={"class": "vm"})
        if r.status_code != 503:
            break
        time.sleep(1)
    assert r.status_code == 200, r.text
    handle = r.json()
    script = STOP_AGENT.encode()
    put = server.data(
        handle,
        "PUT",
        "/v1/files",
        params={"path": "stop.py"},
        content=script,
        headers={"X-Podbay-Sha256": hashlib.sha256(script).hexdigest()},
    )
    assert put.status_code == 200, put.text
    # The command stops the agent running it: its answer never comes.
    r = server.exec(handle, "python3", "stop.py", timeout_ms=20_000)
    assert r.status_code == 504, r.text
    assert r.json()["code"] == "AGENT_TIMEOUT"
    # Stopping waits (up to 30 s) for the guest to flush its disk, through the
    # stopped agent's process, then boots it again under TCG: a long attach.
    again = server.attach(token, "traced", json={"class": "vm"}, timeout=600)
    assert again.status_code == 200, again.text
    assert again.json()["start"] == "carried_over", again.text
    r = server.exec(again.json(), "cat", "/workspace/stop.py")
    assert r.status_code == 200, r.text
    assert r.json()["stdout"] == STOP_AGENT, r.text
