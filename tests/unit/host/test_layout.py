"""Where a data directory keeps what: one name per path, short enough for sockets."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from podbay.host.layout import RUN_MODE, Layout, instance_id
from podbay.settings import Settings

#: sun_path holds 108 bytes, the terminating NUL included.
SOCKET_PATH_MAX = 107


def layout_for(data_dir: Path, **runtime: str) -> Layout:
    settings = Settings.load(environ={}, data_dir=data_dir)
    for key, value in runtime.items():
        setattr(settings.runtime, key, value)
    return Layout.from_settings(settings)


def test_the_instance_names_the_data_directory(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert instance_id(a) == instance_id(a) != instance_id(b)
    assert len(instance_id(a)) == 10
    assert instance_id(a).isalnum()
    # The same directory reached another way is the same instance.
    (tmp_path / "link").symlink_to(a)
    a.mkdir()
    assert instance_id(tmp_path / "link") == instance_id(a)


def test_defaults(tmp_path: Path) -> None:
    layout = layout_for(tmp_path / "data")
    assert layout.data_dir == (tmp_path / "data").resolve()
    assert layout.image_dir == layout.data_dir / "images"
    assert layout.run_dir == Path("/run/podbay") / layout.instance
    assert layout.machines == layout.data_dir / "machines"
    assert layout.runc_root == layout.run_dir / "runc"
    assert layout.cgroup_parent == f"/podbay/{layout.instance}"


def test_settings_move_the_image_cache_and_the_run_directory(tmp_path: Path) -> None:
    layout = layout_for(tmp_path, image_dir="/shared/images", run_dir="/run/elsewhere")
    assert layout.image_dir == Path("/shared/images")
    assert layout.run_dir == Path("/run/elsewhere")
    assert layout.runc_root == Path("/run/elsewhere/runc")


def test_a_machine_keeps_files_in_the_data_dir_and_the_rest_in_the_run_dir(tmp_path: Path) -> None:
    layout = layout_for(tmp_path)
    paths = layout.machine("m1")
    assert paths.home == layout.machines / "m1"
    assert paths.disk_image == paths.home / "disk.ext4"
    assert paths.run == layout.run_dir / "m1"
    assert paths.cgroup == f"/podbay/{layout.instance}/m1"
    assert (paths.rootfs, paths.disk_mount, paths.socket) == (
        paths.run / "rootfs",
        paths.run / "disk",
        paths.run / "agent.sock",
    )


def test_what_a_sandbox_can_write_lives_on_its_own_disk(tmp_path: Path) -> None:
    paths = layout_for(tmp_path).machine("m1")
    assert paths.files == paths.disk_mount / "host"
    assert paths.console.parent == paths.files
    assert paths.console.is_relative_to(paths.disk_mount)


def test_socket_paths_fit_however_deep_the_data_directory(tmp_path: Path) -> None:
    layout = layout_for(tmp_path / ("very-long-directory-name" * 12))
    assert len(str(layout.data_dir)) > SOCKET_PATH_MAX
    longest = layout.machine("a" * 63).socket
    assert len(str(longest).encode()) <= SOCKET_PATH_MAX


def test_a_run_directory_is_traverse_only_whatever_the_umask(tmp_path: Path) -> None:
    """The sandbox's unprivileged processes pass through it to their root
    filesystem: a restrictive umask, or a directory left 0700, must not stop them."""
    paths = layout_for(tmp_path, run_dir=str(tmp_path / "run")).machine("m1")
    old = os.umask(0o077)
    try:
        paths.make_run()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(paths.run).st_mode) == RUN_MODE == 0o711
    os.chmod(paths.run, 0o700)
    paths.make_run()
    assert stat.S_IMODE(os.stat(paths.run).st_mode) == 0o711
