"""The warm pool: a new sandbox is a ready machine given its identity."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.root


@pytest.mark.parametrize("class_", ["container", "gvisor"])
def test_attach_takes_a_pooled_machine_and_the_pool_refills(make_server, class_):
    # gvisor: the hostname comes through the process waiting in the pooled machine.
    server = make_server({"PODBAY_RUNTIME_WARM_POOL": "1", "PODBAY_RUNTIME_CLASSES": class_})
    token = server.create_deployment("pooled")
    for name in ("Thread_One", "thread.two"):
        started = time.perf_counter()
        h = server.attach(token, name).json()
        elapsed = time.perf_counter() - started
        assert h["start"] == "created"
        assert elapsed < 2.0
        r = server.exec(h, "hostname")
        assert r.json()["stdout"].strip() == name.lower().replace("_", "-").replace(".", "-")
        assert server.exec(h, "ls", "-A", "/workspace").json()["stdout"] == ""
        deadline = time.monotonic() + 20
        while "podbay_warm_pool_machines 1.0" not in server.http.get("/metrics").text:
            assert time.monotonic() < deadline, "the pool did not refill"
            time.sleep(0.1)
    # restart: pooled machines of the last run are not adopted as sandboxes
    server.kill9()
    server.spawn()
    server.wait_ready()
    names = [s["name"] for s in server.api("GET", "/api/v1/sandboxes", token).json()["sandboxes"]]
    assert sorted(names) == ["Thread_One", "thread.two"]
