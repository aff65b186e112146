"""Code in a sandbox cannot take over or take down its agent (PID 1).

The attacks (:data:`podbay.runtime.probes.AGENT_ATTACKS`, also run by
``podbay doctor``): ptrace the agent, steal its listening socket with
``pidfd_getfd(1, 3)`` (and then answer the gateway itself), open its memory or
fds through ``/proc/1``, read its environment, or make it the OOM killer's
first choice through ``/proc/1/oom_score_adj``. Each is refused by the kernel
because the agent is non-dumpable and its memory belongs to the host's user
namespace (docs/runtime.md, "The agent inside").
"""

from __future__ import annotations

import pytest

from podbay.runtime import probes
from podbay.testing.fixtures import Machines

pytestmark = [pytest.mark.root, pytest.mark.timeout(180)]


def test_sandbox_code_cannot_trace_or_rob_the_agent(oci_machines: Machines) -> None:
    m = oci_machines.up()
    outcomes = probes.agent_attacks(m.agent)
    assert set(outcomes) == {"pidfd_getfd", "ptrace", "mem", "fd", "oom_score_adj", "environ"}
    assert all(v.startswith("refused") for v in outcomes.values()), outcomes
    assert probes.agent_out_of_reach(m.agent) is None
    # The agent still serves, and commands may still trace their own processes.
    traced = m.sh(
        'sleep 30 & pid=$!; python3 -c "import ctypes, sys; '
        "libc = ctypes.CDLL(None, use_errno=True); "
        'sys.exit(libc.ptrace(0x4206, int(sys.argv[1]), 0, 0))" $pid; '
        "echo traced=$?; kill $pid"
    )
    assert "traced=0" in traced.stdout, traced
