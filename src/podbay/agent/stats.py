"""``GET /v1/stats``: the guest's own figures, for a host that cannot read them.

A ``vm`` machine's memory is the guest kernel's business: QEMU keeps pages the
guest has freed, so its host cgroup never shows a program's memory falling;
its disk and network are the guest's too. The node asks here instead (the
host's CPU reading of QEMU stays the host's). Nothing here is trusted by the
host beyond being this sandbox's own claim about itself.

>>> net_dev_bytes("h\\nh\\n lo: 5 0 0 0 0 0 0 0 5 0\\n eth0: 7 1 0 0 0 0 0 0 9 1\\n")
(7, 9)
"""

from __future__ import annotations

import os

from podbay.wire.data import AgentStats
from podbay.wire.observe import net_dev_bytes


def _meminfo() -> tuple[int, int]:
    """Memory in use (total minus available) and the total, in bytes."""
    fields: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, _, rest = line.partition(":")
            value = rest.split()
            if value and value[0].isdigit():
                fields[name] = int(value[0]) * 1024
    total = fields.get("MemTotal", 0)
    return max(0, total - fields.get("MemAvailable", fields.get("MemFree", 0))), total


def read_stats(root: str = "/") -> AgentStats:
    used, total = _meminfo()
    st = os.statvfs(root)
    try:
        with open("/proc/net/dev") as f:
            rx, tx = net_dev_bytes(f.read())
    except OSError:
        rx = tx = 0
    kills = 0
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == "oom_kill" and value.strip().isdigit():
                    kills = int(value)
    except OSError:
        pass
    return AgentStats(
        memory_bytes=used,
        memory_total_bytes=total,
        disk_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize,
        net_rx_bytes=rx,
        net_tx_bytes=tx,
        oom_kills=kills,
    )
