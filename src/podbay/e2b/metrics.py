"""E2B's ``GET /sandboxes/{id}/metrics`` (``Sandbox.get_metrics()``): podbay's
per-sandbox samples (docs/observability.md) in E2B's ``SandboxMetric`` shape.

E2B's ``cpuUsedPct`` is of the sandbox's CPUs together (podbay's
``cpu_percent`` is of one core); ``start`` and ``end`` are unix seconds.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request

from podbay.wire.observe import MetricSample

from .error_responses import E2BError


def unix_param(request: Request, name: str) -> datetime | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or len(raw) > 11:  # past year 5000: nothing there anyway
        raise E2BError(400, "REQUEST_INVALID", f"{name} must be unix seconds")
    return datetime.fromtimestamp(int(raw), UTC)


def metric(sample: MetricSample, cpus: float, disk_total: int) -> dict[str, Any]:
    return {
        "timestamp": sample.at.isoformat().replace("+00:00", "Z"),
        "timestampUnix": int(sample.at.timestamp()),
        "cpuCount": max(1, round(cpus)),
        "cpuUsedPct": round(min(100.0, sample.cpu_percent / max(cpus, 0.01)), 2),
        "memUsed": sample.memory_bytes,
        "memTotal": sample.memory_limit_bytes,
        "memCache": 0,  # the working set leaves the page cache out
        "diskUsed": sample.disk_bytes,
        "diskTotal": disk_total,
    }
