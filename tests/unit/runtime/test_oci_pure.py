"""The oci driver's pure parts: bundle, seccomp, records, layout, agent command, registry."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from podbay.runtime import registry
from podbay.runtime.base import Limits, MachineSpec, MachineState
from podbay.runtime.oci import agent_bundle, bundle, records, seccomp
from podbay.runtime.oci.cgroups import Cgroups
from podbay.runtime.oci.image import Recipe, local_ca_certificates, shift_ownership
from podbay.runtime.oci.layout import Layout
from podbay.settings import Settings


def facts(**kw: object) -> bundle.BundleFacts:
    base: dict[str, object] = dict(
        machine_id="m1", hostname="thread-1", rootfs=Path("/run/x/m1/rootfs"),
        image_rootfs=Path("/img/rootfs"), agent_dir=Path("/data/agent/abc"),
        files_dir=Path("/run/x/m1/files"), argv=["/agent"], uid_base=1_000_000,
        memory_bytes=1 << 30, cpus=1.5, pids=256, cgroup_path="/podbay/i/m1")
    base.update(kw)
    return bundle.BundleFacts(**base)  # type: ignore[arg-type]


def test_bundle_isolation() -> None:
    cfg = bundle.config(facts())
    kinds = {ns["type"] for ns in cfg["linux"]["namespaces"]}
    assert kinds == {"pid", "ipc", "uts", "mount", "user", "cgroup", "network"}
    assert cfg["linux"]["uidMappings"] == [
        {"containerID": 0, "hostID": 1_000_000, "size": 65536}]
    caps = cfg["process"]["capabilities"]["bounding"]
    assert "CAP_SYS_ADMIN" not in caps and "CAP_NET_ADMIN" not in caps
    assert cfg["process"]["noNewPrivileges"] is True
    assert cfg["process"]["env"] == bundle.PROCESS_ENV
    assert cfg["hostname"] == "thread-1"
    assert "/proc/kcore" in cfg["linux"]["maskedPaths"]
    res = cfg["linux"]["resources"]
    assert res["memory"] == {"limit": 1 << 30}
    assert res["cpu"] == {"quota": 150_000, "period": 100_000}
    assert res["pids"] == {"limit": 256}


def test_bundle_mounts_are_read_only_where_they_must_be() -> None:
    cfg = bundle.config(facts(netns=Path("/run/x/m1/netns"), resolv_conf=True,
                              limit_swap=True, loader=Path("/img/agent-loader")))
    mounts = {m["destination"]: m for m in cfg["mounts"]}
    assert mounts["/.podbay/loader"]["source"] == "/img/agent-loader"
    for dest in ("/.podbay/image", "/.podbay/agent", "/.podbay/env.json", "/.podbay/loader"):
        assert "ro" in mounts[dest]["options"], dest
    assert mounts["/.podbay/image"]["source"] == "/img/rootfs"
    assert mounts["/sys"]["type"] == "bind" and "ro" in mounts["/sys"]["options"]
    assert "/etc/resolv.conf" in mounts
    net = next(ns for ns in cfg["linux"]["namespaces"] if ns["type"] == "network")
    assert net["path"] == "/run/x/m1/netns"
    assert cfg["linux"]["resources"]["memory"]["swap"] == 1 << 30


def test_bundle_without_host_netns_mounts_sysfs() -> None:
    mounts = {m["destination"]: m for m in bundle.config(facts())["mounts"]}
    assert mounts["/sys"]["type"] == "sysfs"
    assert "/etc/resolv.conf" not in mounts


def test_seccomp_denies_the_dangerous_calls() -> None:
    profile = seccomp.profile()
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    denied = {n for rule in profile["syscalls"] if "args" not in rule for n in rule["names"]}
    for name in ("mount", "unshare", "setns", "bpf", "keyctl", "kexec_load", "init_module",
                 "perf_event_open", "open_by_handle_at", "userfaultfd", "clone3",
                 "io_uring_setup", "pivot_root", "fsopen"):
        assert name in denied, name
    clone_rules = [r for r in profile["syscalls"] if r["names"] == ["clone"]]
    flags = {r["args"][0]["value"] for r in clone_rules}
    assert 0x10000000 in flags  # CLONE_NEWUSER
    assert 0x40000000 in flags  # CLONE_NEWNET


def test_records_round_trip(tmp_path: Path) -> None:
    spec = MachineSpec(machine_id="m1", hostname="h", env={"A": "1"},
                       limits=Limits(memory_bytes=1, cpus=0.5, pids=2, disk_bytes=3),
                       layers=(Path("/l1"), Path("/l2")), labels={"sandbox": "x"})
    records.write(tmp_path, records.MachineRecord(spec, MachineState.RUNNING, "abc"))
    back = records.read(tmp_path)
    assert back == records.MachineRecord(spec, MachineState.RUNNING, "abc")
    assert records.read(tmp_path / "nothing") is None


def test_layout_defaults_keep_socket_paths_short(tmp_path: Path) -> None:
    settings = Settings.load(environ={}, data_dir=tmp_path / ("long" * 30))
    layout = Layout.from_settings(settings)
    assert layout.image_dir == layout.data_dir / "images"
    socket = layout.machine("a" * 63).socket
    assert len(str(socket)) <= 107
    assert layout.cgroup_parent == f"/podbay/{layout.instance}"
    settings.runtime.image_dir = "/shared/images"
    assert Layout.from_settings(settings).image_dir == Path("/shared/images")


def test_recipe_key_follows_the_recipe() -> None:
    assert Recipe().key() == Recipe().key()
    assert Recipe().key() != Recipe(packages=("python3",)).key()
    assert Recipe().key() != Recipe(uid_base=2_000_000).key()


def test_extra_cas_are_part_of_the_recipe(tmp_path: Path) -> None:
    (tmp_path / "proxy.crt").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n")
    (tmp_path / "notes.txt").write_text("not a certificate")
    (tmp_path / "empty.crt").write_text("")
    cas = local_ca_certificates(str(tmp_path))
    assert [name for name, _ in cas] == ["proxy.crt"]
    assert Recipe(extra_cas=cas).key() != Recipe().key()
    assert local_ca_certificates("") == ()
    assert local_ca_certificates(str(tmp_path / "missing")) == ()


def test_agent_argv_uses_the_images_real_loader(tmp_path: Path) -> None:
    libdir = tmp_path / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    (libdir / "ld-linux-x86-64.so.2").write_text("")
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/python3.11").write_text("")
    (tmp_path / "usr/bin/python3").symlink_to("python3.11")
    argv = agent_bundle.agent_argv(tmp_path, fd=3, env_file=True)
    assert argv[0] == "/.podbay/loader"  # the execute-only copy (see stage_loader)
    shared = agent_bundle.agent_argv(tmp_path, fd=3, env_file=True, private_loader=False)
    assert shared[0] == "/.podbay/image/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    assert shared[1:] == argv[1:]
    assert argv[1:4] == ["--inhibit-cache", "--library-path",
                         "/.podbay/image/usr/lib/x86_64-linux-gnu"]
    assert argv[4] == "/.podbay/image/usr/bin/python3.11"
    assert argv[-4:] == ["--fd", "3", "--env-file", "/.podbay/env.json"]


def test_loader_copy_is_execute_only_and_host_owned(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    libdir = rootfs / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    (libdir / "ld-linux-x86-64.so.2").write_bytes(b"\x7fELF loader")
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "usr/bin/python3.11").write_text("")
    copy = agent_bundle.stage_loader(rootfs)
    assert copy == tmp_path / agent_bundle.LOADER_COPY
    st = copy.stat()
    assert st.st_mode & 0o7777 == 0o111
    assert st.st_uid == 0
    assert agent_bundle.stage_loader(rootfs) == copy  # made once


def test_cgroup_freezer_v1_and_v2(tmp_path: Path) -> None:
    v1 = tmp_path / "v1"
    (v1 / "freezer/podbay/m1").mkdir(parents=True)
    (v1 / "freezer/podbay/m1/freezer.state").write_text("THAWED\n")
    groups = Cgroups(v1)
    assert groups.version == 1 and not groups.frozen("/podbay/m1")

    async def cycle(g: Cgroups, path: str) -> None:
        await g.freeze(path, within=0.2)

    asyncio.run(cycle(groups, "/podbay/m1"))
    assert groups.frozen("/podbay/m1")
    groups.thaw("/podbay/m1")
    assert (v1 / "freezer/podbay/m1/freezer.state").read_text().strip() == "THAWED"
    v2 = tmp_path / "v2"
    (v2 / "podbay/m1").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu memory pids\n")
    (v2 / "podbay/m1/cgroup.freeze").write_text("0\n")
    (v2 / "podbay/m1/cgroup.events").write_text("populated 1\nfrozen 0\n")
    groups = Cgroups(v2)
    assert groups.version == 2 and groups.missing_controllers() == []
    # The kernel never reports this fake cgroup frozen: freeze gives up and thaws.
    with pytest.raises(Exception, match="did not freeze"):
        asyncio.run(cycle(groups, "/podbay/m1"))
    assert not groups.frozen("/podbay/m1")
    (v2 / "podbay/m1/cgroup.events").write_text("populated 1\nfrozen 1\n")
    asyncio.run(cycle(groups, "/podbay/m1"))
    assert groups.frozen("/podbay/m1")
    groups.thaw("/podbay/m1")
    assert not groups.frozen("/podbay/m1")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_shift_ownership_keeps_setuid_and_skips_symlinks(tmp_path: Path) -> None:
    tool = tmp_path / "sudo"
    tool.write_text("")
    os.chmod(tool, 0o4755)
    (tmp_path / "link").symlink_to("/etc/passwd")
    before = os.stat("/etc/passwd")
    shift_ownership(tmp_path, 1_000_000)
    assert os.stat(tool).st_uid == 1_000_000
    assert os.stat(tool).st_mode & 0o7777 == 0o4755
    assert os.lstat(tmp_path / "link").st_uid == 1_000_000
    assert os.stat("/etc/passwd").st_uid == before.st_uid


def test_registry() -> None:
    assert "oci" in registry.DRIVERS
    driver = registry.build(Settings.load(environ={}))
    assert driver.name == "oci"
    with pytest.raises(ValueError, match="unknown runtime driver"):
        registry.factory("nope")
