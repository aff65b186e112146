"""The agent's command line: the pristine image's interpreter through the image's own
loader, by paths resolved on the host (inside, ``/lib64/ld-linux*`` is an absolute
symlink that would lead into the user's writable overlay)."""

from __future__ import annotations

from pathlib import Path

import pytest

from podbay.errors import DriverError
from podbay.runtime import agent_bundle

LIB = "usr/lib/x86_64-linux-gnu"


def image(root: Path, *pythons: str) -> Path:
    (root / LIB).mkdir(parents=True)
    (root / LIB / "ld-linux-x86-64.so.2").write_text("")
    (root / "usr/bin").mkdir(parents=True)
    for name in pythons:
        (root / "usr/bin" / name).write_text("")
    return root


def test_the_agent_runs_on_the_images_loader_and_python(tmp_path: Path) -> None:
    root = image(tmp_path, "python3.11")
    (root / "usr/bin/python3").symlink_to("python3.11")
    argv = agent_bundle.sandbox_argv(root)
    # Through the execute-only copy of the loader (see stage_loader), bound at LOADER.
    assert argv[:5] == [
        agent_bundle.LOADER,
        "--inhibit-cache",
        "--library-path",
        f"/.podbay/image/{LIB}",
        "/.podbay/image/usr/bin/python3.11",
    ]
    # Isolated mode, no site: nothing in the sandbox's environment or site-packages
    # reaches the agent's interpreter.
    assert argv[5:8] == ["-I", "-S", "-c"]
    assert "/.podbay/agent" in argv[8]
    assert argv[9:] == ["--fd", "3", "--env-file", agent_bundle.ENV_FILE]


def test_the_images_shell_opens_the_agents_oom_score_first(tmp_path: Path) -> None:
    """Non-dumpable once started, the agent could not open its own
    oom_score_adj: the image's dash opens it and execs the agent with it."""
    root = image(tmp_path, "python3.11")
    bare = agent_bundle.sandbox_argv(root)
    (root / "usr/bin/dash").write_text("")
    argv = agent_bundle.sandbox_argv(root)
    assert argv[:5] == [
        f"/.podbay/image/{LIB}/ld-linux-x86-64.so.2",
        "--inhibit-cache",
        "--library-path",
        f"/.podbay/image/{LIB}",
        "/.podbay/image/usr/bin/dash",
    ]
    script = 'command exec 4<>/proc/self/oom_score_adj; unset PWD; exec "$0" "$@"'
    assert argv[5:7] == ["-c", script]  # dash would add PWD to the agent's environment
    assert argv[7:] == [*bare, "--oom-fd", "4"]
    # gVisor's agent needs none of it (no OOM killer inside).
    assert "--oom-fd" not in agent_bundle.sandbox_argv(root, private_loader=False)


def test_without_the_private_loader_the_images_own_is_used(tmp_path: Path) -> None:
    root = image(tmp_path, "python3.11")
    private = agent_bundle.sandbox_argv(root)
    shared = agent_bundle.sandbox_argv(root, private_loader=False)
    assert shared[0] == f"/.podbay/image/{LIB}/ld-linux-x86-64.so.2"
    # Without the host kernel's protection the agent guards itself (agent.guard).
    assert shared[1:] == [*private[1:], "--guard-uid", "65535"]
    # And hibernates into the static waiter the runtime binds in (waiter.c).
    programs = agent_bundle.sandbox_argv(
        root, private_loader=False, launcher="/.podbay/launcher", waiter="/.podbay/waiter"
    )
    assert programs[len(shared) :] == [
        "--launcher",
        "/.podbay/launcher",
        "--waiter",
        "/.podbay/waiter",
    ]


def test_the_newest_real_python_is_chosen(tmp_path: Path) -> None:
    root = image(tmp_path, "python3.9", "python3.11", "python3.11-config", "python3.10")
    (root / "usr/bin/python3.12").symlink_to("python3.11")  # a link is never trusted
    argv = agent_bundle.sandbox_argv(root)
    assert argv[4] == "/.podbay/image/usr/bin/python3.11"


def test_a_symlinked_loader_is_not_used(tmp_path: Path) -> None:
    root = image(tmp_path, "python3.11")
    (root / LIB / "ld-linux-x86-64.so.2").unlink()
    (root / LIB / "ld-linux-x86-64.so.2").symlink_to("/lib64/ld-linux-x86-64.so.2")
    with pytest.raises(DriverError, match="no python3 or no dynamic loader"):
        agent_bundle.sandbox_argv(root)


def test_an_image_without_python_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DriverError, match="no python3 or no dynamic loader"):
        agent_bundle.sandbox_argv(image(tmp_path))


def test_on_the_host_the_same_interpreter_is_run_by_host_paths(tmp_path: Path) -> None:
    root = image(tmp_path, "python3.11")
    assert agent_bundle.image_python(root) == [
        str(root / LIB / "ld-linux-x86-64.so.2"),
        "--inhibit-cache",
        "--library-path",
        str(root / LIB),
        str(root / "usr/bin/python3.11"),
    ]
