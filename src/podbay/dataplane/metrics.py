"""Prometheus metrics, one registry per app (nothing global, nothing at import).

* ``podbay_sandboxes{state}``: sandboxes by state, read from the store at scrape
* ``podbay_attach_seconds{start}``: attach latency by how it got its sandbox
* ``podbay_gateway_request_seconds{kind}``: relayed requests; ``kind="exec"``
  is the exec round trip through gateway and agent
* ``podbay_lifecycle_transitions_total{transition}``
* ``podbay_refusals_total{code}``: every refusal, control plane and gateway
  (the agent's own refusals, relayed, are not counted)
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST

_FAST = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.sandboxes = Gauge(
            "podbay_sandboxes", "Sandboxes by state.", ["state"], registry=self.registry
        )
        self.attach = self._latency("podbay_attach_seconds", "Attach latency.", "start")
        self.gateway = self._latency(
            "podbay_gateway_request_seconds", "Data-plane requests through the gateway.", "kind"
        )
        self.transitions = Counter(
            "podbay_lifecycle_transitions_total",
            "Sandbox state transitions.",
            ["transition"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "podbay_refusals_total", "Refusals by code.", ["code"], registry=self.registry
        )
        self.warm_pool = Gauge(
            "podbay_warm_pool_machines", "Ready machines in the warm pool.", registry=self.registry
        )

    def _latency(self, name: str, documentation: str, label: str) -> Histogram:
        """A latency histogram by ``label``, in buckets from 0.5 ms to a minute."""
        return Histogram(name, documentation, [label], buckets=_FAST, registry=self.registry)

    def transition(self, old: str, new: str) -> None:
        self.transitions.labels(f"{old}->{new}").inc()

    def refused(self, code: str) -> None:
        self.refusals.labels(code).inc()

    def observe_gateway(self, kind: str, status: int, seconds: float) -> None:
        self.gateway.labels(kind).observe(seconds)

    def render(self, by_state: Mapping[str, int]) -> bytes:
        for state in ("creating", "running", "suspended", "stopped", "deleting"):
            self.sandboxes.labels(state).set(by_state.get(state, 0))
        return generate_latest(self.registry)
