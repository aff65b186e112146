"""Attach's ``volumes`` checked, kept and carried to the machine (docs/volumes.md):
pure parts, no sandbox (the real mounts: tests/integration/volumes/)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from podbay.control.services.options import options_of
from podbay.control.services.volumes import VolumeService, check_mount_path, mounts_of
from podbay.domain import Deployment, SandboxOptions
from podbay.domain.options import VolumeMount
from podbay.errors import ApiError
from podbay.host import records
from podbay.host.machine import VolumeBind
from podbay.host.volumes import VolumeStore
from podbay.runtime.base import Limits, MachineSpec, MachineState
from podbay.runtime.oci import runsc
from podbay.runtime.oci.bundle import BundleFacts, config
from podbay.settings import Settings
from podbay.wire.control import AttachRequest
from podbay.wire.control import VolumeMount as WireVolumeMount

LIMITS = Limits(memory_bytes=1 << 30, cpus=1.0, pids=64, disk_bytes=1 << 30)


def test_mounts_are_sorted_by_path_in_both_forms() -> None:
    mounts = mounts_of({"/z": "b", "/a": WireVolumeMount(name="a", read_only=True)})
    assert mounts == (VolumeMount("/a", "a", True), VolumeMount("/z", "b", False))


@pytest.mark.parametrize(
    "path",
    [
        "x",
        "/",
        "/proc",
        "/sys/x",
        "/dev",
        "/etc/ssl",
        "/.podbay",
        "/a/..",
        "/a//b",
        "/a/",
        "/a b",
        "/a$b",
        "/a'b",
    ],
)
def test_reserved_and_odd_mount_paths_are_refused(path: str) -> None:
    with pytest.raises(ApiError) as refused:
        check_mount_path(path)
    assert refused.value.code == "VOLUME_MOUNT_INVALID"


def test_etc_like_names_beside_reserved_ones_are_fine() -> None:
    assert check_mount_path("/etcetera") == "/etcetera"
    assert check_mount_path("/devdata/x") == "/devdata/x"


def test_the_options_keep_volumes_and_a_volume_machine_is_never_pooled() -> None:
    options = options_of(AttachRequest(volumes={"/data": "v"}), Settings())
    assert options.volumes == (VolumeMount("/data", "v", False),)
    assert options.machine  # a warm pool's machine has no volume bound
    assert SandboxOptions.from_json(options.to_json()) == options
    assert SandboxOptions.from_json(SandboxOptions().to_json()).volumes == ()


def test_every_class_mounts_volumes_that_exist(tmp_path: Path) -> None:
    service = VolumeService(None, VolumeStore(tmp_path / "d", tmp_path / "r", uid_base=1000))  # type: ignore[arg-type]
    now = datetime.now(UTC)
    deployment = Deployment(
        id="dep_1",
        name="d",
        account="a",
        created_at=now,
        updated_at=now,
        spec_text="",
        sandbox_section={},
    )
    options = SandboxOptions(volumes=(VolumeMount("/data", "v"),))
    for class_ in ("container", "gvisor", "vm"):
        with pytest.raises(ApiError) as missing:
            service.check_attach(deployment, class_, options)
        assert missing.value.code == "VOLUME_NOT_FOUND"
    with pytest.raises(ApiError) as refused:
        service.check_attach(deployment, "some-later-class", options)
    assert refused.value.code == "VOLUME_CLASS_UNSUPPORTED"
    no_volumes = VolumeService(None, None)  # type: ignore[arg-type]
    with pytest.raises(ApiError) as unavailable:
        no_volumes.check_attach(deployment, "container", options)
    assert unavailable.value.code == "VOLUMES_UNAVAILABLE"


def test_the_machine_record_keeps_its_volumes(tmp_path: Path) -> None:
    bind = VolumeBind(Path("/run/v/data"), "/data", True, Path("/d/v/disk.ext4"))
    spec = MachineSpec(machine_id="m1", hostname="h", limits=LIMITS, volumes=(bind,))
    records.write(tmp_path, records.MachineRecord(spec, MachineState.STOPPED))
    read = records.read(tmp_path)
    assert read is not None
    assert read.spec.volumes == (bind,)


def test_volume_binds_come_last_and_gvisor_never_caches_them_as_its_own() -> None:
    facts = BundleFacts(
        machine_id="m1",
        hostname="h",
        rootfs=Path("/r"),
        image_rootfs=Path("/i"),
        agent_dir=Path("/a"),
        files_dir=Path("/f"),
        argv=["/x"],
        uid_base=1000000,
        memory_bytes=1 << 30,
        cpus=1.0,
        pids=256,
        cgroup_path="/podbay/m1",
        volumes=(VolumeBind(Path("/v/b"), "/b", True), VolumeBind(Path("/v/a"), "/a")),
    )
    cfg = config(facts)
    last = cfg["mounts"][-2:]
    assert [(m["destination"], m["source"]) for m in last] == [("/a", "/v/a"), ("/b", "/v/b")]
    assert "rw" in last[0]["options"]
    assert "ro" in last[1]["options"]
    assert "nosuid" in last[1]["options"]
    adapted = runsc.adapt_config(cfg, Path("/s"), volumes=frozenset({"/a", "/b"}))
    hinted = {v for k, v in adapted["annotations"].items() if k.endswith(".source")}
    assert "/v/b" not in hinted
    assert "/i" in hinted  # the image's bind is still the sandbox's alone
