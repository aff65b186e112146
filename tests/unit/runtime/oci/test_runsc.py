"""runsc's command lines and bundle, without runsc or root."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from podbay.errors import DriverError
from podbay.runtime import native_build
from podbay.runtime.oci import bundle, runsc


def _runsc(tmp_path: Path) -> runsc.Runsc:
    return runsc.Runsc(
        "runsc",
        tmp_path / "root",
        platform="ptrace",
        netns=lambda machine_id: tmp_path / machine_id / "netns",
    )


def test_global_flags(tmp_path: Path) -> None:
    argv = _runsc(tmp_path).argv("state", "m1")
    assert argv[:3] == ["runsc", "--root", str(tmp_path / "root")]
    assert {
        "--platform=ptrace",
        "--network=sandbox",
        "--host-uds=create",
        "--overlay2=none",
    } <= set(argv)
    assert argv[-2:] == ["state", "m1"]


def test_run_starts_inside_the_machine_namespace_with_the_root_test_covered(tmp_path: Path) -> None:
    (tmp_path / "bundle").mkdir()
    netns = tmp_path / "m1" / "netns"
    argv = _runsc(tmp_path).launch_argv("m1", tmp_path / "bundle", netns)
    assert argv[:3] == ["nsenter", f"--net={netns}", "--"]
    script = argv[argv.index("-c") + 1]
    assert "/proc/sys/net/core" in script
    assert "mount -t proc" in script
    assert argv[argv.index("-c") + 2] == str(tmp_path / "bundle" / runsc.PROC_DIR)
    assert argv[-4:] == ["--detach", "--bundle", str(tmp_path / "bundle"), "m1"]


def test_run_starts_through_runsc_enter_when_it_was_built(tmp_path: Path) -> None:
    (tmp_path / "bundle").mkdir()
    netns = tmp_path / "m1" / "netns"
    r = _runsc(tmp_path)
    r.enter = tmp_path / "runsc-enter"
    argv = r.launch_argv("m1", tmp_path / "bundle", netns)
    proc = str(tmp_path / "bundle" / runsc.PROC_DIR)
    assert argv[:5] == [str(r.enter), str(netns), proc, "runsc", "--root"]
    assert argv[-4:] == ["--detach", "--bundle", str(tmp_path / "bundle"), "m1"]


def test_commands_for_a_live_sandbox_enter_its_namespace_only_when_mounted(tmp_path: Path) -> None:
    # Not an nsfs mount here: the plain command line.
    assert _runsc(tmp_path).command("state", "m1")[0] == "runsc"


def test_container_ids_from_state_files(tmp_path: Path) -> None:
    r = _runsc(tmp_path)
    r.root.mkdir()
    for name in ("a_sandbox:a.state", "a_sandbox:a.lock", "b_sandbox:b.state", "junk"):
        (r.root / name).touch()
    assert r.container_ids() == ["a", "b"]


def test_no_state_file_is_no_container_without_asking_runsc(tmp_path: Path) -> None:
    r = runsc.Runsc("/nonexistent/runsc", tmp_path / "root", platform="ptrace", netns=Path)
    r.root.mkdir()
    assert asyncio.run(r.query("m1")) is None  # runsc itself would fail to start here
    r._state_file("m1").write_text("{}")
    with pytest.raises(FileNotFoundError):
        asyncio.run(r.query("m1"))  # with a state file, runsc is asked


def test_bundle_for_gvisor(tmp_path: Path) -> None:
    facts = bundle.BundleFacts(
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
        netns=Path("/n"),
    )
    cfg = runsc.adapt_config(bundle.config(facts), tmp_path / "sock")
    mounts = {m["destination"]: m for m in cfg["mounts"]}
    assert mounts["/sys"]["type"] == "sysfs"  # gVisor's own, not the host's bound in
    assert mounts[runsc.SOCKET_DIR]["source"] == str(tmp_path / "sock")
    assert "rw" in mounts[runsc.SOCKET_DIR]["options"]
    assert cfg["linux"]["uidMappings"][0]["hostID"] == 1000000
    # Read-only binds are the sandbox's alone (cached like its root); what the
    # host rewrites while it runs (hosts, hostname, the socket dir) is not.
    hints = cfg["annotations"]
    exclusive = {
        hints[key.removesuffix(".share") + ".source"]
        for key, value in hints.items()
        if key.startswith(runsc.MOUNT_HINT + ".") and key.endswith(".share")
        if value == "container"
    }
    assert exclusive == {"/i", "/a", "/f/env.json"}
    assert all(hints[key] == "bind" for key in hints if key.endswith(".type"))
    # Not guarded: the pids limit stays the host's.
    assert cfg["linux"]["resources"]["pids"] == {"limit": 256}
    assert "CAP_SYS_ADMIN" not in cfg["process"]["capabilities"]["bounding"]


def test_a_guarded_agent_gets_the_pids_limit_and_the_host_a_budget(tmp_path: Path) -> None:
    cfg = {
        "process": {
            "args": ["/py", "--socket", "/s", "--guard-uid", "65535"],
            "capabilities": {"bounding": ["CAP_KILL"], "permitted": ["CAP_KILL"]},
        },
        "linux": {"resources": {"pids": {"limit": 32}, "memory": {"limit": 1 << 30}}},
    }
    adapted = runsc.guest_pids(cfg)
    assert adapted["process"]["args"][-2:] == ["--pids-max", "32"]
    assert adapted["process"]["capabilities"]["bounding"] == ["CAP_KILL", "CAP_SYS_ADMIN"]
    resources = adapted["linux"]["resources"]
    assert resources == {"pids": {"limit": runsc.host_pids(32)}, "memory": {"limit": 1 << 30}}
    assert runsc.host_pids(32) > 32 * 66 + 100  # the worst measured per guest process, idle
    assert cfg["linux"]["resources"]["pids"] == {"limit": 32}  # pure


def test_the_guests_pids_limit_is_what_its_memory_holds() -> None:
    """gVisor's host threads per guest process fill the sandbox's memory: the
    default 256 processes in 512 MiB ended the sandbox (no OOM killer there)."""
    cfg = {
        "process": {"args": ["/py", "--guard-uid", "65535"], "capabilities": {}},
        "linux": {"resources": {"pids": {"limit": 256}, "memory": {"limit": 512 << 20}}},
    }
    adapted = runsc.guest_pids(cfg)
    cap = runsc.guest_pids_cap(512 << 20)
    assert cap < 256
    assert cap * runsc.HOST_BYTES_PER_GUEST + runsc.HOST_BYTES_BASE <= 512 << 20
    assert adapted["process"]["args"][-2:] == ["--pids-max", str(cap)]
    assert adapted["linux"]["resources"]["pids"] == {"limit": runsc.host_pids(cap)}


def test_reachable(tmp_path: Path) -> None:
    private = tmp_path / "private"
    (private / "inner").mkdir(parents=True)
    private.chmod(0o700)
    assert not runsc.reachable(private / "inner")
    private.chmod(0o711)
    assert runsc.reachable(private / "inner") == runsc.reachable(tmp_path)


def test_platform_setting_wins(tmp_path: Path) -> None:
    assert runsc.choose_platform("runsc", "kvm", cache=tmp_path / "c.json") == "kvm"
    assert not (tmp_path / "c.json").exists()


def test_end_leaves_what_its_state_cannot_name_to_runsc_delete(tmp_path: Path) -> None:
    r = _runsc(tmp_path)
    r.root.mkdir()
    state = r._state_file("m1")
    for text in ("not json", "{}", '{"sandbox": {"pid": 0}, "goferPid": 0}', "[1]"):
        state.write_text(text)
        assert asyncio.run(r._end("m1", paused_only=False)) is False
        assert state.exists()
    # Named processes that are gone (or not this container's runsc) are not
    # signalled; the state files go.
    state.write_text('{"sandbox": {"pid": 1}, "goferPid": 999999999}')
    state.with_suffix(".lock").touch()
    assert asyncio.run(r._end("m1", paused_only=True)) is False  # running: runsc delete
    assert asyncio.run(r._end("m1", paused_only=False)) is True
    assert not state.exists()
    assert not state.with_suffix(".lock").exists()


def test_the_prebuilt_programs_are_copied_to_each_run_directory_without_a_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native = native_build.build(tmp_path / "native")
    # The daemon's side never compiles: with no compiler and no subprocess, it stages.
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(subprocess, "run", None)
    first = runsc.stage_statx_shim(tmp_path / "run1", native=native)
    second = runsc.stage_statx_shim(tmp_path / "run2", native=native)
    assert second.parent.parent == tmp_path / "run2"
    for name in ("statx-shim.so", "launcher", "namer", "waiter", "runsc-enter"):
        assert (
            (second / name).read_bytes()
            == (native / name).read_bytes()
            == (first / name).read_bytes()
        )
    assert (second / "runsc-enter").stat().st_mode & 0o777 == 0o700
    assert (second / "ld.so.preload").read_text() == runsc.SHIM_IN_SANDBOX + "\n"


def test_without_a_build_the_gvisor_class_says_which_step_builds_it(tmp_path: Path) -> None:
    with pytest.raises(DriverError, match=r"not built .*\./run serve"):
        runsc.stage_statx_shim(tmp_path / "run", native=tmp_path / "never-built")


def _agent_later(directory: Path, bound: Path) -> threading.Thread:
    """An agent that binds and listens after a moment (under another name, then
    renamed into place) and answers one ``GET /v1/info`` with 200."""

    def serve() -> None:
        time.sleep(0.1)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with listener:
            listener.bind(str(directory / "tmp.sock"))
            listener.listen(1)
            os.rename(directory / "tmp.sock", bound)
            connection, _ = listener.accept()
            with connection:
                connection.recv(4096)
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("watched", [True, False])
def test_the_agents_socket_is_watched_for_not_polled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watched: bool
) -> None:
    """Each poll of the socket directory lost a start ~5 ms on average: its
    creation is watched (inotify), with no sleep while waiting; polled only
    where inotify cannot be had. Either way it ends moved to its final place."""
    directory = tmp_path / "agent"
    directory.mkdir()
    bound, final = directory / runsc.SOCKET_NAME, tmp_path / "agent.sock"
    if not watched:
        monkeypatch.setattr(runsc, "watch_created", lambda directory: None)
    sleeps: list[float] = []
    real_sleep = asyncio.sleep

    async def counted(delay: float) -> None:
        sleeps.append(delay)
        await real_sleep(delay)

    monkeypatch.setattr(runsc.asyncio, "sleep", counted)

    async def alive() -> bool:
        return True

    agent = _agent_later(directory, bound)
    asyncio.run(runsc.wait_bound(bound, final, 10, alive=alive))
    agent.join(10)
    assert final.is_socket()
    assert not bound.exists()
    assert (sleeps == []) is watched, sleeps
