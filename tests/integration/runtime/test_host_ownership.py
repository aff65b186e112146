"""Ownership the runtime gives host files: the base image shifted into the sandbox uid
range, the agent's loader kept by host root (chown needs root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from podbay.host.image import shift_ownership
from podbay.runtime.agent_bundle import LOADER_COPY, stage_loader
from podbay.testing.fixtures import require_host

pytestmark = pytest.mark.root


def test_shift_keeps_set_uid_bits_and_never_follows_symlinks(tmp_path: Path) -> None:
    require_host()
    tool = tmp_path / "sudo"
    tool.write_text("")
    os.chown(tool, 0, 50)
    os.chmod(tool, 0o4755)
    (tmp_path / "link").symlink_to("/etc/passwd")
    before = os.stat("/etc/passwd")
    shift_ownership(tmp_path, 1_000_000)
    assert (os.stat(tool).st_uid, os.stat(tool).st_gid) == (1_000_000, 1_000_050)
    # chown clears set-uid; the shift puts it back.
    assert os.stat(tool).st_mode & 0o7777 == 0o4755
    assert os.lstat(tmp_path / "link").st_uid == 1_000_000
    assert os.stat("/etc/passwd").st_uid == before.st_uid
    assert os.stat(tmp_path).st_uid == 1_000_000


def test_shift_is_idempotent(tmp_path: Path) -> None:
    require_host()
    (tmp_path / "f").write_text("")
    shift_ownership(tmp_path, 1_000_000)
    shift_ownership(tmp_path, 1_000_000)
    assert os.stat(tmp_path / "f").st_uid == 1_000_000


def test_the_agents_loader_copy_is_execute_only_and_host_owned(tmp_path: Path) -> None:
    require_host()
    rootfs = tmp_path / "rootfs"
    libdir = rootfs / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    (libdir / "ld-linux-x86-64.so.2").write_bytes(b"\x7fELF loader")
    os.chown(libdir / "ld-linux-x86-64.so.2", 1_000_000, 1_000_000)  # sandbox root's
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "usr/bin/python3.11").write_text("")
    copy = stage_loader(rootfs)
    assert copy == tmp_path / LOADER_COPY
    st = copy.stat()
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o111, 0, 0)
    assert copy.read_bytes() == b"\x7fELF loader"
    made = st.st_ino
    assert stage_loader(rootfs) == copy
    assert copy.stat().st_ino == made
    os.chmod(copy, 0o755)  # tampered with: made again
    assert stage_loader(rootfs).stat().st_mode & 0o7777 == 0o111
