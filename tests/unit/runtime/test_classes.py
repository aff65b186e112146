"""Sandbox classes: the enabled set, what ``default`` means, each class's settings."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from podbay.runtime import classes
from podbay.runtime.classes import HostCheck, enabled_classes, resolve_default
from podbay.settings import Settings

RUNS, SLOW, DOWN = (
    HostCheck(True, True, ""),
    HostCheck(True, False, ""),
    HostCheck(False, False, ""),
)


def settings(**runtime: str) -> Settings:
    s = Settings.load(
        environ={f"PODBAY_RUNTIME_{k.upper()}": v for k, v in runtime.items()},
        data_dir=Path("/srv/podbay"),
    )
    return s


def test_enabled_classes_default_and_order():
    assert enabled_classes(settings()) == ("gvisor", "container")
    assert enabled_classes(settings(classes="vm, gvisor,container")) == (
        "vm",
        "gvisor",
        "container",
    )
    assert enabled_classes(settings(classes="container,gvisor")) == ("container", "gvisor")


@pytest.mark.parametrize(
    ("raw", "pin", "problem"),
    [
        ("gvisor,gpu", "", "unknown class 'gpu'"),
        (" , ", "", "enables no class"),
        ("container,container", "", "twice"),
        ("container", "gvisor", "default_class='gvisor' is not enabled"),
    ],
)
def test_enabled_classes_refuses_what_cannot_be_meant(raw, pin, problem):
    with pytest.raises(ValueError, match=problem):
        enabled_classes(settings(classes=raw, default_class=pin))


def test_default_is_the_first_enabled_class_at_useful_speed():
    every = ("vm", "gvisor", "container")
    assert resolve_default(every, {"vm": RUNS, "gvisor": RUNS, "container": RUNS}) == "vm"
    # vm under TCG works but is not useful speed: default skips it.
    assert resolve_default(every, {"vm": SLOW, "gvisor": RUNS, "container": RUNS}) == "gvisor"
    assert resolve_default(every, {"vm": DOWN, "gvisor": DOWN, "container": RUNS}) == "container"
    # Order is the operator's preference.
    assert (
        resolve_default(("container", "gvisor"), {"gvisor": RUNS, "container": RUNS}) == "container"
    )
    # Nothing fast: the first that works at all; nothing works: none.
    assert resolve_default(("vm",), {"vm": SLOW}) == "vm"
    assert resolve_default(("gvisor",), {"gvisor": DOWN}) is None
    # A pin is the operator's word, even where it cannot run.
    assert resolve_default(every, {"gvisor": RUNS}, pin="container") == "container"


def test_gvisor_gets_its_own_data_and_run_directories_over_the_shared_image():
    base = settings(run_dir="/run/podbay-x")
    gvisor = classes.class_settings(base, "gvisor")
    assert gvisor.data_dir == Path("/srv/podbay/gvisor")
    assert gvisor.runtime.run_dir == "/run/podbay-x-gvisor"
    assert gvisor.runtime.image_dir == "/srv/podbay/images"
    assert gvisor.runtime.oci_runtime == "runsc"
    assert base.runtime.oci_runtime == "runc"
    assert base.data_dir == Path("/srv/podbay")
    assert classes.class_settings(base, "container") is base
    # Default run directories differ too: they hash the data directory.
    from podbay.host.layout import Layout

    plain = settings()
    layouts = [
        Layout.from_settings(classes.class_settings(plain, n)) for n in ("container", "gvisor")
    ]
    assert layouts[0].run_dir != layouts[1].run_dir
    assert layouts[0].cgroup_parent != layouts[1].cgroup_parent
    assert layouts[0].image_dir == layouts[1].image_dir
    assert layouts[0].machines != layouts[1].machines


def test_oci_class_drivers_are_built_with_their_runtime():
    driver = classes.build_driver(settings(), "gvisor")
    assert driver.runc.binary == "runsc"  # type: ignore[attr-defined]
    assert classes.build_driver(settings(), "container").runc.binary == "runc"  # type: ignore[attr-defined]


def test_probe_answers_of_every_shape():
    assert classes.as_host_check(HostCheck(True, False, "tcg")) == HostCheck(True, False, "tcg")
    assert classes.as_host_check((True, True, "kvm")) == HostCheck(True, True, "kvm")
    # Not working is never useful speed.
    assert classes.as_host_check((False, True, "no")) == HostCheck(False, False, "no")
    shaped = SimpleNamespace(works=True, accelerated=False, detail="TCG")
    assert classes.as_host_check(shaped) == HostCheck(True, False, "TCG")


def test_vm_without_its_driver_is_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setattr(classes, "VM_PROBE", "podbay.runtime.no_such_vm:probe")
    check = asyncio.run(classes.host_check(settings(), "vm"))
    assert not check.works
    assert "not installed" in check.detail


def test_a_missing_runtime_binary_says_what_to_install():
    check = asyncio.run(classes.host_check(settings(gvisor_runtime="/nonexistent/runsc"), "gvisor"))
    assert not check.works
    expected = "not found: apt-get install runsc" if os.geteuid() == 0 else "needs root"
    assert expected in check.detail


def test_a_probe_that_hangs_is_cut_off(monkeypatch):
    async def hang(settings: Settings) -> HostCheck:
        await asyncio.sleep(60)
        raise AssertionError("not reached")

    monkeypatch.setattr(classes, "CHECK_TIMEOUT_S", 0.05)
    monkeypatch.setattr(classes, "_vm_check", hang)
    check = asyncio.run(classes.host_check(settings(), "vm"))
    assert not check.works
    assert "took over" in check.detail


@pytest.mark.parametrize(
    ("answer", "accel", "works", "fast", "says"),
    [
        ((True, True, "a KVM guest booted"), "kvm", True, True, "a KVM guest booted"),
        # KVM works but the operator runs guests under TCG: works, not at useful speed.
        ((True, True, "a KVM guest booted"), "tcg", True, False, "runtime.vm_accel=kvm"),
        ((True, False, "a KVM guest hung: TCG only"), "tcg", True, False, "TCG only"),
        # Told to use KVM where KVM guests hang: it cannot run.
        ((True, False, "a KVM guest hung: TCG only"), "kvm", False, False, "but runtime.vm_accel"),
        ((False, False, "qemu not found"), "tcg", False, False, "qemu not found"),
    ],
)
def test_vm_is_useful_speed_only_where_kvm_boots_and_is_used(
    monkeypatch, answer, accel, works, fast, says
):
    async def probe(settings: Settings) -> tuple[bool, bool, str]:
        return answer

    real_load = classes._load
    monkeypatch.setattr(
        classes, "_load", lambda target: probe if target == classes.VM_PROBE else real_load(target)
    )
    check = asyncio.run(classes.host_check(settings(vm_accel=accel), "vm"))
    assert (check.works, check.fast) == (works, fast)
    assert says in check.detail
