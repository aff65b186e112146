"""Sandbox classes end to end through the HTTP API: ``gvisor`` and ``container``
sandboxes side by side in one real ``podbay serve``, each on its own kernel."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root

HOST_RELEASE = os.uname().release


def all_proven(server: PlatformServer) -> dict[str, Any]:
    """/healthz once every enabled class is proven (those past the default are
    proven in the background after the server is ready)."""
    deadline = time.monotonic() + 120
    while True:
        health: dict[str, Any] = server.http.get("/healthz").json()
        classes = health["classes"]
        if classes["available"] == classes["enabled"] or time.monotonic() > deadline:
            return health
        time.sleep(0.1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("classes"),
        env={
            "PODBAY_RUNTIME_CLASSES": "gvisor,container",
        },
    ) as s:
        all_proven(s)
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("classy")


def kernel(server: PlatformServer, handle: dict[str, Any]) -> str:
    r = server.exec(handle, "uname", "-r")
    assert r.status_code == 200, r.text
    return str(r.json()["stdout"].strip())


def test_default_is_gvisor_here_and_the_handle_says_so(server, token):
    health = all_proven(server)
    assert health["classes"] == {
        "default": "gvisor",
        "available": ["gvisor", "container"],
        "enabled": ["gvisor", "container"],
        "checking": [],
    }
    r = server.attach(token, "by-default")
    assert r.status_code == 200, r.text
    handle = r.json()
    assert handle["runtime_class"] == "gvisor"
    assert handle["start"] == "created"
    # gVisor's own kernel answers, not the host's.
    assert kernel(server, handle) != HOST_RELEASE
    record = server.api("GET", "/api/v1/sandboxes/by-default", token).json()
    assert record["runtime_class"] == "gvisor"


def test_each_class_runs_on_its_own_kernel_side_by_side(server, token):
    g = server.attach(token, "g", json={"class": "gvisor"}).json()
    c = server.attach(token, "c", json={"class": "container"}).json()
    assert (g["class"], c["class"]) == ("gvisor", "container")
    assert kernel(server, c) == HOST_RELEASE
    assert kernel(server, g) != HOST_RELEASE
    # Same workspace contract in both; neither sees the other's files.
    for handle in (g, c):
        wrote = server.exec(handle, "sh", "-c", f"echo {handle['class']} > /workspace/who")
        assert wrote.status_code == 200
        assert wrote.json()["exit_code"] == 0
    for handle in (g, c):
        assert (
            server.exec(handle, "cat", "/workspace/who").json()["stdout"] == handle["class"] + "\n"
        )
    listed = {
        s["name"]: s["class"]
        for s in server.api("GET", "/api/v1/sandboxes", token).json()["sandboxes"]
    }
    assert listed["g"] == "gvisor"
    assert listed["c"] == "container"


@pytest.mark.parametrize("sandbox_class", ["gvisor", "container"])
def test_ps_shows_the_agent_as_pid_1_by_name(server, token, sandbox_class):
    # Not the loader's options and the agent's bootstrap code (its argv at start).
    handle = server.attach(token, f"ps-{sandbox_class}", json={"class": sandbox_class}).json()
    cmdline = server.exec(handle, "cat", "/proc/1/cmdline").json()["stdout"]
    assert cmdline.rstrip("\0") == "podbay-agent"
    shown = server.exec(handle, "ps", "-o", "args=", "-p", "1").json()["stdout"]
    assert shown.strip() == "podbay-agent"
    # The agent answers as before (a hibernation's re-exec uses its own argv).
    assert server.exec(handle, "true").json()["exit_code"] == 0


def test_the_classes_refusals(server, token):
    r = server.attach(token, "v", json={"class": "vm"})
    assert r.status_code == 409
    assert r.json()["code"] == "SANDBOX_CLASS_UNAVAILABLE"
    assert r.json()["error"].endswith("it can run: gvisor, container")
    assert server.api("GET", "/api/v1/sandboxes/v", token).status_code == 404
    server.attach(token, "keeps", json={"class": "container"})
    r = server.attach(token, "keeps", json={"class": "gvisor"})
    assert r.status_code == 409
    assert r.json()["code"] == "SANDBOX_CLASS_CONFLICT"
    again = server.attach(token, "keeps")
    # Without a class the handle says "default", the caller's word; it runs in its own.
    assert again.json()["class"] == "default"
    assert again.json()["start"] == "reused"
    assert again.json()["runtime_class"] == "container"


def test_suspend_resume_and_restart_adopt_each_class(server, token):
    handles = {
        name: server.attach(token, f"life-{name}", json={"class": name}).json()
        for name in ("gvisor", "container")
    }
    for name, handle in handles.items():
        server.exec(handle, "sh", "-c", f"echo {name} > /workspace/kept")
        stop = server.api("POST", f"/api/v1/sandboxes/life-{name}/stop", token)
        assert stop.status_code == 204
        back = server.attach(token, f"life-{name}").json()
        assert back["start"] == "resumed"
        assert back["runtime_class"] == name
        handles[name] = back
    server.kill9()
    server.spawn()
    server.wait_ready()
    all_proven(server)
    for name, handle in handles.items():
        r = server.exec(handle, "cat", "/workspace/kept")  # the old credential still works
        assert r.status_code == 200, (name, r.text)
        assert r.json()["stdout"] == f"{name}\n", (name, r.text)


def test_delete_leaves_nothing_in_either_class(server, token):
    g = server.attach(token, "gone-g", json={"class": "gvisor"}).json()
    c = server.attach(token, "gone-c", json={"class": "container"}).json()
    run_dirs = {"container": Path(server.run_dir), "gvisor": Path(f"{server.run_dir}-gvisor")}
    homes = {
        "container": server.data_dir / "machines",
        "gvisor": server.data_dir / "gvisor" / "machines",
    }
    before = {name: {p.name for p in homes[name].iterdir()} for name in homes}
    for name in ("gone-g", "gone-c"):
        assert server.api("DELETE", f"/api/v1/sandboxes/{name}", token).status_code == 204
    for name, run_dir in run_dirs.items():
        gone = before[name] - {p.name for p in homes[name].iterdir()}
        assert len(gone) == 1, (name, before[name])
        machine_id = gone.pop()
        assert not (run_dir / machine_id).exists()
        assert not (homes[name] / machine_id).exists()
    for handle in (g, c):
        assert server.exec(handle, "true").status_code == 401


def test_one_environment_layer_serves_both_classes(server):
    token = server.create_deployment(
        "classy-env", "name: classy-env\nsandbox:\n  toolchain: never\n  packages: [tree]\n"
    )
    handles = {}
    for name in ("gvisor", "container"):
        deadline = time.monotonic() + 600
        while True:
            r = server.attach(token, f"env-{name}", json={"class": name})
            if r.status_code != 202:
                break
            assert time.monotonic() < deadline, "the layer never got built"
            time.sleep(float(r.headers["Retry-After"]))
        assert r.status_code == 200, r.text
        handles[name] = r.json()
        assert handles[name]["class"] == name
        ran = server.exec(handles[name], "tree", "--version")
        assert ran.status_code == 200, ran.text
        assert ran.json()["exit_code"] == 0, ran.text
    # Built once, in the container class (the builder of every OCI class's layers).
    layers = [p for p in (server.data_dir / "layers").iterdir() if not p.name.startswith(".")]
    assert len(layers) == 1, layers


def test_mountinfo_names_no_host_path_of_podbay(server, token):
    """A sandbox's /proc/self/mountinfo shows what its binds come from: their
    sources' paths within their filesystems and overlayfs' options. Neither
    may name the data directory, the image cache or the run directory."""
    host_paths = [str(server.data_dir), server.env["PODBAY_RUNTIME_IMAGE_DIR"], server.run_dir]
    for sandbox_class in ("gvisor", "container"):
        r = server.attach(token, f"mounts-{sandbox_class}", json={"class": sandbox_class})
        assert r.status_code == 200, r.text
        mountinfo = server.exec(r.json(), "cat", "/proc/self/mountinfo").json()["stdout"]
        assert " /.podbay/agent " in mountinfo or sandbox_class == "gvisor", mountinfo
        for path in host_paths:
            assert path not in mountinfo, (sandbox_class, path, mountinfo)
