"""The checkpoint image's manifest: sealed once, checked before a restore."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from podbay.runtime.base import DriverError
from podbay.runtime.oci import checkpoint


def sealed_home(tmp_path: Path) -> Path:
    image = checkpoint.fresh_image_dir(tmp_path)
    (image / "checkpoint.img").write_bytes(b"memory" * 1000)
    checkpoint.seal(tmp_path)
    return image


@pytest.mark.root
def test_a_fresh_image_dir_is_roots_alone(tmp_path: Path) -> None:
    image = checkpoint.fresh_image_dir(tmp_path)
    st = image.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, 0)


@pytest.mark.root
def test_a_sealed_image_verifies(tmp_path: Path) -> None:
    sealed_home(tmp_path)
    assert checkpoint.sealed(tmp_path)
    assert checkpoint.verify(tmp_path).bytes == 6000


@pytest.mark.root
@pytest.mark.parametrize("damage", ["flip", "add", "remove", "manifest"])
def test_a_damaged_image_is_refused(tmp_path: Path, damage: str) -> None:
    image = sealed_home(tmp_path)
    if damage == "flip":
        (image / "checkpoint.img").write_bytes(b"Memory" + b"memory" * 999)
    elif damage == "add":
        (image / "extra").write_bytes(b"")
    elif damage == "remove":
        (image / "checkpoint.img").unlink()
    else:
        checkpoint.manifest_path(tmp_path).write_text("{")
    with pytest.raises(DriverError):
        checkpoint.verify(tmp_path)


@pytest.mark.root
def test_discard_removes_the_manifest_and_the_image(tmp_path: Path) -> None:
    image = sealed_home(tmp_path)
    checkpoint.discard(tmp_path)
    assert not checkpoint.sealed(tmp_path)
    assert not image.exists()


def test_nothing_sealed_is_not_suspended(tmp_path: Path) -> None:
    assert not checkpoint.sealed(tmp_path)
