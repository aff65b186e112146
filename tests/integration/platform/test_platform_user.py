"""The base image's unprivileged account in every class: ``user`` works in
/workspace and its home, reads what root wrote there, and is in no sudo group
(sandbox processes run with no_new_privs, so sudo could not raise it anyway:
README.md, "Users")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root

CLASSES = ("gvisor", "container", "vm")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("user"),
        env={
            "PODBAY_RUNTIME_CLASSES": ",".join(CLASSES),
            "PODBAY_RUNTIME_MEMORY_BYTES": str(512 << 20),
        },
    ) as s:
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("users")


def available(server: PlatformServer, name: str) -> None:
    """Classes past the default are proven in the background (vm: minutes under TCG)."""
    deadline = time.monotonic() + 600
    while name not in server.http.get("/healthz").json()["classes"]["available"]:
        assert time.monotonic() < deadline, f"{name} never became available"
        time.sleep(0.5)


def run(server: PlatformServer, handle: dict[str, Any], line: str, **kw: Any) -> dict[str, Any]:
    r = server.exec(handle, "sh", "-c", line, **kw)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


@pytest.mark.parametrize("sandbox_class", CLASSES)
def test_user_works_in_workspace_and_home(
    server: PlatformServer, token: str, sandbox_class: str
) -> None:
    available(server, sandbox_class)
    # A vm's first boot under TCG on a loaded machine can outlast the client's 60 s.
    r = server.attach(token, f"user-{sandbox_class}", json={"class": sandbox_class}, timeout=600)
    assert r.status_code == 200, r.text
    handle = r.json()
    assert run(server, handle, "echo from-root > /workspace/root.txt")["exit_code"] == 0

    mine = run(
        server,
        handle,
        "cd && touch /workspace/x ~/x && mkdir /workspace/d && echo ok > /workspace/d/f"
        " && stat -c '%U %n' /workspace/x ~/x /workspace/d/f && cat /workspace/root.txt",
        user="user",
    )
    assert mine["exit_code"] == 0, mine
    assert mine["stdout"] == (
        "user /workspace/x\nuser /home/user/x\nuser /workspace/d/f\nfrom-root\n"
    )
    # Root keeps writing where user owns (and user may replace root's files there).
    assert run(server, handle, "echo root > /workspace/d/g && cat /workspace/x")["exit_code"] == 0
    assert run(server, handle, "rm /workspace/root.txt", user="user")["exit_code"] == 0

    groups = run(server, handle, "id -nG", user="user")
    assert groups["stdout"].split() == ["user"]
    sudo = run(server, handle, "sudo -n true", user="user")
    assert sudo["exit_code"] != 0, sudo
    assert "sudo" in sudo["stderr"], sudo
    # A script that prefixes sudo while running as root still works.
    assert run(server, handle, "sudo -n id -un")["stdout"] == "root\n"
