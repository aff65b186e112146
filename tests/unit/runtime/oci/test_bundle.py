"""A machine's OCI ``config.json``, read as data: what isolates it and what limits it."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest

from podbay.runtime.oci import bundle, seccomp


def facts(**kw: object) -> bundle.BundleFacts:
    base: dict[str, object] = dict(
        machine_id="m1",
        hostname="thread-1",
        rootfs=Path("/run/x/m1/rootfs"),
        image_rootfs=Path("/img/rootfs"),
        agent_dir=Path("/data/agent/abc"),
        files_dir=Path("/run/x/m1/files"),
        argv=["/agent", "--fd", "3"],
        uid_base=1_000_000,
        memory_bytes=1 << 30,
        cpus=1.5,
        pids=256,
        cgroup_path="/podbay/i/m1",
    )
    base.update(kw)
    return bundle.BundleFacts(**base)  # type: ignore[arg-type]


def by_destination(cfg: dict[str, object]) -> dict[str, dict[str, object]]:
    mounts = cfg["mounts"]
    assert isinstance(mounts, list)
    found = {m["destination"]: m for m in mounts}
    assert len(found) == len(mounts), "a destination mounted twice"
    return found


def test_every_namespace_and_an_unprivileged_root() -> None:
    cfg = bundle.config(facts())
    kinds = [ns["type"] for ns in cfg["linux"]["namespaces"]]
    assert sorted(kinds) == sorted(["pid", "ipc", "uts", "mount", "user", "cgroup", "network"])
    # Root inside is uid_base outside, for exactly the image's id range.
    mapping = [{"containerID": 0, "hostID": 1_000_000, "size": bundle.ID_RANGE}]
    assert cfg["linux"]["uidMappings"] == mapping
    assert cfg["linux"]["gidMappings"] == mapping
    assert cfg["process"]["user"] == {"uid": 0, "gid": 0}


def test_privileges_are_those_of_a_plain_container() -> None:
    process = bundle.config(facts())["process"]
    caps = process["capabilities"]
    assert caps["bounding"] == caps["effective"] == caps["permitted"] == bundle.CAPABILITIES
    for dangerous in (
        "CAP_SYS_ADMIN",
        "CAP_NET_ADMIN",
        "CAP_SYS_PTRACE",
        "CAP_SYS_MODULE",
        "CAP_DAC_READ_SEARCH",
        "CAP_SYS_RAWIO",
        "CAP_SYS_TIME",
        "CAP_BPF",
    ):
        assert dangerous not in caps["bounding"], dangerous
    assert process["noNewPrivileges"] is True
    assert process["terminal"] is False
    assert {"type": "RLIMIT_CORE", "hard": 0, "soft": 0} in process["rlimits"]


def test_the_first_process_is_the_agent_with_no_host_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PODBAY_SECRET_ON_THE_HOST", "hunter2")
    process = bundle.config(facts())["process"]
    assert process["args"] == ["/agent", "--fd", "3"]
    assert process["env"] == bundle.PROCESS_ENV
    assert not any("hunter2" in entry for entry in process["env"])
    assert process["cwd"] == "/"


def test_the_agent_hibernates_only_when_the_facts_say() -> None:
    env = bundle.config(facts(hibernate_seconds=300.0))["process"]["env"]
    assert env == [*bundle.PROCESS_ENV, "PODBAY_AGENT_HIBERNATE_SECONDS=300"]
    assert bundle.config(facts(hibernate_seconds=0.0))["process"]["env"] == bundle.PROCESS_ENV


def test_open_files_never_exceed_what_the_host_process_may_have() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    rlimits = {r["type"]: r for r in bundle.config(facts())["process"]["rlimits"]}
    nofile = rlimits["RLIMIT_NOFILE"]
    assert nofile["hard"] == nofile["soft"] == min(65536, hard)


def test_limits_come_from_the_facts() -> None:
    cfg = bundle.config(facts(memory_bytes=512 << 20, cpus=0.25, pids=64))
    res = cfg["linux"]["resources"]
    assert res["memory"] == {"limit": 512 << 20}  # no swap key unless asked for
    assert res["cpu"] == {"quota": 25_000, "period": 100_000}
    assert res["pids"] == {"limit": 64}
    assert res["devices"] == [{"allow": False, "access": "rwm"}]
    assert cfg["linux"]["cgroupsPath"] == "/podbay/i/m1"


def test_a_tiny_cpu_share_still_gets_a_quota_the_kernel_accepts() -> None:
    cpu = bundle.config(facts(cpus=0.001))["linux"]["resources"]["cpu"]
    assert cpu["quota"] == 1000  # the kernel refuses quotas under 1 ms


def test_swap_is_capped_at_the_memory_limit_where_the_host_accounts_it() -> None:
    memory = bundle.config(facts(limit_swap=True))["linux"]["resources"]["memory"]
    assert memory == {"limit": 1 << 30, "swap": 1 << 30}


def test_root_filesystem_hostname_and_hardening() -> None:
    cfg = bundle.config(facts())
    assert cfg["root"] == {"path": "/run/x/m1/rootfs", "readonly": False}
    assert cfg["hostname"] == "thread-1"
    assert cfg["linux"]["seccomp"] == seccomp.profile()
    assert cfg["linux"]["maskedPaths"] == bundle.MASKED_PATHS
    assert cfg["linux"]["readonlyPaths"] == bundle.READONLY_PATHS
    assert {"/proc/kcore", "/proc/keys", "/sys/firmware"} <= set(bundle.MASKED_PATHS)
    assert "/proc/sysrq-trigger" in bundle.READONLY_PATHS
    assert cfg["linux"]["rootfsPropagation"] == "private"


def test_what_podbay_binds_in_is_read_only() -> None:
    mounts = by_destination(bundle.config(facts()))
    image, agent, env = (
        mounts[d] for d in ("/.podbay/image", "/.podbay/agent", "/.podbay/env.json")
    )
    assert (image["source"], agent["source"], env["source"]) == (
        "/img/rootfs",
        "/data/agent/abc",
        "/run/x/m1/files/env.json",
    )
    for mount in (image, agent, env):
        assert {"ro", "nosuid", "nodev"} <= set(mount["options"])
    # The sandbox may edit its own hostname and hosts files (the host rewrites them
    # on assign), but never gets set-uid or device files through them.
    for dest in ("/etc/hostname", "/etc/hosts"):
        assert mounts[dest]["source"] == f"/run/x/m1/files/{dest.rsplit('/', 1)[1]}"
        assert {"rw", "nosuid", "nodev"} <= set(mounts[dest]["options"])


def test_the_agents_execute_only_loader_is_bound_read_only_when_given() -> None:
    assert "/.podbay/loader" not in by_destination(bundle.config(facts()))
    mounts = by_destination(bundle.config(facts(loader=Path("/img/agent-loader"))))
    loader = mounts["/.podbay/loader"]
    assert loader["source"] == "/img/agent-loader"
    assert {"ro", "nosuid", "nodev"} <= set(loader["options"])


def test_kernel_filesystems_are_mounted_without_exec_or_set_uid() -> None:
    mounts = by_destination(bundle.config(facts()))
    for dest in ("/proc", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", "/sys/fs/cgroup"):
        assert {"nosuid", "noexec"} <= set(mounts[dest]["options"]), dest
    assert "ro" in mounts["/sys/fs/cgroup"]["options"]
    assert "ro" in mounts["/sys"]["options"]


def test_without_a_host_network_namespace_the_machine_gets_its_own() -> None:
    cfg = bundle.config(facts())
    network = next(ns for ns in cfg["linux"]["namespaces"] if ns["type"] == "network")
    assert network == {"type": "network"}
    mounts = by_destination(cfg)
    assert mounts["/sys"]["type"] == "sysfs"
    assert "/etc/resolv.conf" not in mounts


def test_a_host_made_network_namespace_is_joined() -> None:
    cfg = bundle.config(facts(netns=Path("/run/x/m1/netns"), resolv_conf=True))
    network = next(ns for ns in cfg["linux"]["namespaces"] if ns["type"] == "network")
    assert network == {"type": "network", "path": "/run/x/m1/netns"}
    mounts = by_destination(cfg)
    # sysfs cannot be mounted from a user namespace that does not own the network
    # namespace: the host's is bound read-only instead.
    assert mounts["/sys"]["type"] == "bind"
    assert "ro" in mounts["/sys"]["options"]
    assert mounts["/etc/resolv.conf"]["source"] == "/run/x/m1/files/resolv.conf"


def test_the_config_is_plain_json() -> None:
    cfg = bundle.config(
        facts(netns=Path("/n"), resolv_conf=True, limit_swap=True, loader=Path("/l"))
    )
    assert json.loads(json.dumps(cfg)) == cfg
