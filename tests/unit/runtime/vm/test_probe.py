"""The vm probe boots its TCG and KVM guests side by side; its verdicts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from podbay.runtime.base import DriverError
from podbay.runtime.vm import probe, qemu
from podbay.settings import Settings


class Boots:
    """Stands in for boot_marker: each accel's outcome after its own wait, and
    the order things happened in."""

    def __init__(self, outcomes: dict[str, float | BaseException]) -> None:
        self.outcomes = outcomes
        self.events: list[str] = []

    async def __call__(self, kernel: Path, initrd: Path, accel: str, within: float) -> float:
        self.events.append(f"{accel} starts")
        outcome = self.outcomes[accel]
        try:
            await asyncio.sleep(0.05 if accel == "tcg" else 0.2)
        except asyncio.CancelledError:
            self.events.append(f"{accel} killed")
            raise
        self.events.append(f"{accel} ends")
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


Install = Callable[[dict[str, float | BaseException]], Boots]


@pytest.fixture
def boots(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Install:
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF")
    monkeypatch.setattr(probe.os, "geteuid", lambda: 0)
    monkeypatch.setattr(probe.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(qemu, "kernel_release", lambda: "6.1.0-test-cloud-amd64")
    monkeypatch.setattr(probe, "find_busybox", lambda: busybox)
    monkeypatch.setattr(probe, "has_kvm_device", lambda: True)

    def install(outcomes: dict[str, float | BaseException]) -> Boots:
        fake = Boots(outcomes)
        monkeypatch.setattr(probe, "boot_marker", fake)
        return fake

    return install


def run() -> probe.VmProbe:
    return asyncio.run(probe.probe(Settings()))


def test_the_kvm_boot_runs_beside_the_tcg_boot(boots: Install) -> None:
    fake = boots({"tcg": 4.0, "kvm": TimeoutError()})
    result = run()
    assert (result.works, result.accelerated) == (True, False)
    assert "a KVM guest hung" in result.detail
    assert "TCG guest booted in 4.0 s" in result.detail
    # KVM's bound runs while TCG boots, not after it.
    assert fake.events.index("kvm starts") < fake.events.index("tcg ends")


def test_kvm_that_boots_makes_the_class_fast(boots: Install) -> None:
    boots({"tcg": 4.0, "kvm": 0.5})
    result = run()
    assert (result.works, result.accelerated) == (True, True)
    assert "a KVM guest booted in 0.5 s" in result.detail


def test_a_tcg_failure_kills_the_kvm_boot(boots: Install) -> None:
    fake = boots({"tcg": DriverError("no marker"), "kvm": 0.5})
    result = run()
    assert (result.works, result.accelerated) == (False, False)
    assert result.detail == "a TCG guest did not boot: no marker"
    assert fake.events[-1] == "kvm killed"


def test_without_dev_kvm_only_tcg_boots(boots: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "has_kvm_device", lambda: False)
    fake = boots({"tcg": 4.0, "kvm": 0.5})
    result = run()
    assert (result.works, result.accelerated) == (True, False)
    assert "no /dev/kvm" in result.detail
    assert fake.events == ["tcg starts", "tcg ends"]
