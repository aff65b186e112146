"""A command that fills its sandbox's memory loses to the OOM killer; the agent does not.

The attack (no malice needed): many small processes that together exceed the
sandbox's memory limit, each smaller than the agent. The kernel kills the
largest process in the memory cgroup, which was the agent: the exec's answer
was lost (502) and the sandbox had to be restarted. Now every command gets a
higher ``oom_score_adj`` than the agent (podbay.agent.oom): the kernel kills
commands, the exec answers ``oom_killed: true`` and the next exec runs at once.

Under gVisor (2022) the host's OOM killer sees one sandbox process and ends
the whole sandbox, agent included; the next attach starts it again.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from podbay.testing.platform import PlatformServer

pytestmark = [pytest.mark.root, pytest.mark.alone, pytest.mark.timeout(300)]

MEMORY = 128 << 20
#: 24 awk processes holding 6 MB each (~7.5 MiB resident, the agent ~14 MiB):
#: together past the limit, each smaller than the agent. Each notes in /tmp/held
#: that it holds its memory and keeps it until its stdin ends: the pipe from a
#: watcher that waits until every hog either holds its memory or was killed (the
#: sandbox cgroup's oom_kill count), 50 s at most. So they hold their memory
#: together however slowly they start (a fixed sleep raced a slow start), and the
#: command ends as soon as all 24 have met the OOM killer or survived it.
SMALL_HOGS = r"""
kills() {
    sed -n 's/^oom_kill //p' /sys/fs/cgroup/memory.events \
        /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null | head -n 1
}
# Whatever this shell forks before the agent raises it from 500 to 1000 keeps
# 500 (podbay.agent.oom), and the kernel would take this shell, at 1000, before
# any hog: the hogs are forked once it has been raised (or 5 s have passed).
n=0
while read score < /proc/$$/oom_score_adj && [ "$score" = 500 ] && [ $n -lt 100 ]; do
    sleep 0.05; n=$((n + 1))
done
: > /tmp/held
{
    n=0
    while [ $n -lt 500 ]; do
        k=$(kills)
        [ $(($(wc -l < /tmp/held) + ${k:-0})) -ge HOGS ] && break
        sleep 0.1; n=$((n + 1))
    done
} | {
    exec 3<&0  # a background job's stdin is /dev/null unless redirected
    for i in $(seq HOGS); do
        awk 'BEGIN { s = sprintf("%HOG_BYTESs", "")
                     print 1 >> "/tmp/held"; close("/tmp/held"); getline x }' <&3 &
    done
    wait
}
echo finished
"""


@pytest.fixture(scope="module", params=["container", "gvisor"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("serve"),
        env={
            "PODBAY_RUNTIME_CLASSES": request.param,
            "PODBAY_RUNTIME_MEMORY_BYTES": str(MEMORY),
        },
    ) as s:
        yield s


def test_memory_hogs_lose_to_the_oom_killer_not_the_agent(server: PlatformServer) -> None:
    token = server.create_deployment("oom")
    handle = server.attach(token, "hog").json()
    gvisor = handle["runtime_class"] == "gvisor"
    # gVisor caps its guest processes at (memory - 64 MiB) / 4 MiB (16 here),
    # so there fewer, larger hogs fill the memory: 8 of 20 MB.
    hogs, size = (8, 20_000_000) if gvisor else (24, 6_000_000)
    script = SMALL_HOGS.replace("HOG_BYTES", str(size)).replace("HOGS", str(hogs))
    r = server.exec(handle, "sh", "-c", script, timeout_ms=60_000)
    if gvisor:
        # gVisor's kernel has no OOM killer: the host's ends the whole sandbox.
        assert (r.status_code, r.json().get("code")) == (502, "AGENT_UNREACHABLE"), r.text
        handle = server.attach(token, "hog").json()
    else:
        assert r.status_code == 200, r.text
        result = r.json()
        assert result["oom_killed"] is True, result
        assert result["stdout"] == "finished\n"  # sh itself survived its children
    # The agent's own score is 500 while it starts a command: read it once
    # this command is well under way.
    after = server.exec(
        handle,
        "sh",
        "-c",
        "echo alive; cat /proc/self/oom_score_adj; sleep 0.5; cat /proc/1/oom_score_adj",
    )
    assert after.status_code == 200, after.text
    alive, command_score, agent_score = after.json()["stdout"].split()
    assert alive == "alive"
    assert "oom_killed" not in after.json()
    # Whatever a command starts outscores the agent (500 if forked before the
    # agent raised the command itself to 1000: see podbay.agent.oom).
    assert int(command_score) >= 500, after.text
    assert agent_score == "0", after.text
