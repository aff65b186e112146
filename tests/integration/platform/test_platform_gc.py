"""``podbay gc`` beside a live server: it removes nothing the server uses (the
gvisor class's shared shim and agent copies in its run directory), says so
on a clean data directory, and leaves no empty slirp4netns cgroups behind."""

from __future__ import annotations

import json

from podbay.host import storage
from podbay.host.cgroups import Cgroups
from podbay.runtime.classes import GVISOR, class_settings
from podbay.runtime.oci.driver import OciDriver
from podbay.testing.fixtures import sandbox_settings
from podbay.testing.platform import PlatformServer


def _gc(server: PlatformServer, *args: str) -> list[str]:
    out = server.cli("gc", "--json", *args)
    return list(json.loads(out.stdout)["removed"])


def _slirp_parents(server: PlatformServer) -> list[str]:
    """The cgroup parents of the slirp4netns of each OCI class of ``server``."""
    settings = sandbox_settings(server.data_dir)
    settings.runtime.run_dir = server.run_dir
    parents = []
    for derived in (settings, class_settings(settings, GVISOR)):
        limits = OciDriver(derived).network.slirps.limits
        assert limits is not None
        parents.append(limits.cgroup_parent)
    return parents


def test_gc_beside_a_live_gvisor_server_removes_nothing_it_uses(make_server):
    server = make_server({"PODBAY_RUNTIME_CLASSES": "gvisor"})
    token = server.create_deployment("gc-beside")
    first = server.attach(token, "live").json()
    assert server.exec(first, "true").json()["exit_code"] == 0
    # A clean data directory with a live sandbox: nothing is anyone's leftover.
    assert _gc(server) == []
    assert server.cli("gc").stdout.strip() == "nothing to remove"
    # The server still starts gVisor sandboxes (gc once removed its shim: 502).
    second = server.attach(token, "after-gc")
    assert second.status_code == 200, second.text
    assert server.exec(second.json(), "ls", "/").json()["exit_code"] == 0
    assert server.exec(first, "true").json()["exit_code"] == 0


def test_gc_leaves_no_empty_slirp_cgroups(make_server):
    server = make_server({"PODBAY_RUNTIME_CLASSES": "gvisor,container"})
    token = server.create_deployment("gc-cgroups")
    for name, sandbox_class in (("g", "gvisor"), ("c", "container")):
        r = server.attach(token, name, json={"class": sandbox_class})
        assert r.status_code == 200, r.text
    parents = _slirp_parents(server)
    cgroups = Cgroups()
    assert all(cgroups.existing(parent) for parent in parents)  # the sandboxes' slirp4netns
    # A node killed between a slirp4netns' end and its cgroup's removal left these.
    gone = [f"{parent}/m-gone-machine" for parent in parents]
    for path in gone:
        cgroups.limit(path, memory_bytes=1 << 30, pids=8, cpus=0.5)
    removed = _gc(server)
    assert not any(cgroups.existing(path) for path in gone), removed
    assert removed, removed
    assert all(line.startswith(("removed cgroup", "gvisor: removed cgroup")) for line in removed), (
        removed
    )
    # The live sandboxes' own are kept.
    for name in ("g", "c"):
        handle = server.attach(token, name).json()
        assert server.exec(handle, "true").json()["exit_code"] == 0
    server.stop()
    removed = _gc(server, "--all")
    assert not any(cgroups.existing(parent) for parent in parents), removed
    # The image's and the agent's read-only views (the sandboxes' bind sources) too.
    assert not [m for m in storage.mountpoints() if m.startswith(server.run_dir)]
