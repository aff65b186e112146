"""The seccomp profile's shape: allow by default, refuse a fixed list, and
refuse namespace-creating clone flags (clone3 cannot be inspected, so it is refused
with ENOSYS, which makes libc fall back to clone)."""

from __future__ import annotations

import errno
from typing import Any

import pytest

from podbay.runtime.oci import seccomp

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000


@pytest.fixture
def profile() -> dict[str, Any]:
    return seccomp.profile()


def plain_rules(profile: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for rule in profile["syscalls"] if "args" not in rule]


def test_allow_by_default_on_the_architectures_podbay_runs(profile: dict[str, Any]) -> None:
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert {"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"} <= set(
        profile["architectures"]
    )  # 32-bit entry points must not bypass the list


@pytest.mark.parametrize(
    "name",
    [
        "mount",
        "umount2",
        "pivot_root",
        "fsopen",
        "fsmount",
        "move_mount",
        "open_tree",
        "unshare",
        "setns",
        "bpf",
        "perf_event_open",
        "keyctl",
        "add_key",
        "kexec_load",
        "init_module",
        "finit_module",
        "open_by_handle_at",
        "userfaultfd",
        "io_uring_setup",
        "reboot",
        "swapon",
        "clock_settime",
        "iopl",
        "ioperm",
    ],
)
def test_escape_hatches_are_refused_with_eperm(profile: dict[str, Any], name: str) -> None:
    refusing = [r for r in plain_rules(profile) if name in r["names"]]
    assert len(refusing) == 1, name
    assert (refusing[0]["action"], refusing[0]["errnoRet"]) == ("SCMP_ACT_ERRNO", errno.EPERM)


@pytest.mark.parametrize("name", ["read", "write", "clone", "execve", "ptrace", "socket"])
def test_ordinary_calls_are_not_listed(profile: dict[str, Any], name: str) -> None:
    assert not any(name in r["names"] for r in plain_rules(profile))


def test_clone3_is_refused_as_unknown_so_libc_falls_back(profile: dict[str, Any]) -> None:
    rule = next(r for r in profile["syscalls"] if r["names"] == ["clone3"])
    assert (rule["action"], rule["errnoRet"]) == ("SCMP_ACT_ERRNO", errno.ENOSYS)


def test_each_namespace_flag_of_clone_is_refused(profile: dict[str, Any]) -> None:
    clone = [r for r in profile["syscalls"] if r["names"] == ["clone"]]
    flags = set()
    for rule in clone:
        assert (rule["action"], rule["errnoRet"]) == ("SCMP_ACT_ERRNO", errno.EPERM)
        [arg] = rule["args"]
        # Masked equality on the flags argument: refused when that bit is set,
        # whatever the other bits are.
        assert (arg["index"], arg["op"]) == (0, "SCMP_CMP_MASKED_EQ")
        assert arg["value"] == arg["valueTwo"]
        flags.add(arg["value"])
    assert flags == set(seccomp.NAMESPACE_FLAGS)
    assert {CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS} <= flags
    for flag in flags:
        assert flag & (flag - 1) == 0, f"{flag:#x} is not a single bit"


def test_no_call_is_listed_twice(profile: dict[str, Any]) -> None:
    names = [n for rule in plain_rules(profile) for n in rule["names"]]
    assert len(names) == len(set(names))


def test_each_call_gets_a_fresh_profile() -> None:
    first = seccomp.profile()
    first["syscalls"].clear()
    assert seccomp.profile()["syscalls"], "a caller's edit leaked into the next profile"
