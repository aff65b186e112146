"""E2B's own SDK (``e2b``, pinned in the dev extra) against a real ``podbay
serve``, unchanged: only ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and a key that
``podbay deployment create --e2b-key`` printed. One server per class for the
module; the SDK reads the URLs per call, so they are passed explicitly."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from podbay.e2b import connect
from podbay.testing.platform import SANDBOX_SPEC, PlatformServer, e2b_key

e2b = pytest.importorskip("e2b")

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def server(e2b_server: PlatformServer) -> PlatformServer:
    """One ``podbay serve`` per class (``conftest.py``)."""
    return e2b_server


_key = e2b_key


@pytest.fixture(scope="module")
def key(server: PlatformServer) -> str:
    return _key(server, "e2b-a")


def _opts(server: PlatformServer, key: str) -> dict[str, Any]:
    return {"api_key": key, "api_url": server.base_url, "sandbox_url": server.base_url}


@pytest.mark.parametrize("e2b_server", ["gvisor", "container", "vm"], indirect=True)
def test_create_run_files_list_kill(server: PlatformServer, key: str) -> None:
    opts = _opts(server, key)
    sandbox = e2b.Sandbox.create(metadata={"suite": "e2b"}, envs={"GREETING": "hello"}, **opts)
    try:
        result = sandbox.commands.run("echo hi")
        assert (result.stdout, result.exit_code) == ("hi\n", 0)
        assert sandbox.commands.run("echo $GREETING-$X", envs={"X": "y"}).stdout == "hello-y\n"
        seen: list[str] = []
        ran = sandbox.commands.run(
            "cd /tmp && pwd; id -un", cwd="/", user="root", on_stdout=seen.append
        )
        assert ran.stdout == "/tmp\nroot\n"
        assert "".join(seen) == ran.stdout
        with pytest.raises(e2b.CommandExitException) as failed:
            sandbox.commands.run("echo oops >&2; exit 3")
        assert (failed.value.exit_code, failed.value.stderr) == (3, "oops\n")

        sandbox.files.write("/tmp/e2b.txt", "written by e2b\n")
        assert sandbox.files.read("/tmp/e2b.txt") == "written by e2b\n"
        assert sandbox.commands.run("cat /tmp/e2b.txt").stdout == "written by e2b\n"

        listed = e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"suite": "e2b"}), **opts)
        assert [s.sandbox_id for s in listed.next_items()] == [sandbox.sandbox_id]
        other = e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"suite": "x"}), **opts)
        assert other.next_items() == []
        info = sandbox.get_info()
        assert (info.template_id, info.metadata) == ("base", {"suite": "e2b"})
        sandbox.set_timeout(600)
        assert (sandbox.get_info().end_at - info.started_at).total_seconds() >= 599
        # the same sandbox through podbay's own API, under its E2B id
        assert server.http.get(f"/sandboxes/{sandbox.sandbox_id}", headers={"X-API-Key": key})
    finally:
        sandbox.kill()
    assert not sandbox.is_running()
    with pytest.raises(e2b.SandboxException):
        sandbox.commands.run("true")


def test_async_sdk(server: PlatformServer, key: str) -> None:
    async def main() -> None:
        sandbox = await e2b.AsyncSandbox.create(**_opts(server, key))
        try:
            result = await sandbox.commands.run("echo async")
            assert (result.stdout, result.exit_code) == ("async\n", 0)
            with pytest.raises(e2b.CommandExitException):
                await sandbox.commands.run("false")
            await sandbox.files.write("/tmp/a.bin", b"\x00\xffbytes")
            assert await sandbox.files.read("/tmp/a.bin", format="bytes") == b"\x00\xffbytes"
        finally:
            await sandbox.kill()

    asyncio.run(main())


def test_a_key_reaches_only_its_deployment(server: PlatformServer, key: str) -> None:
    other_key = _key(server, "e2b-b")
    sandbox = e2b.Sandbox.create(**_opts(server, key))
    try:
        with pytest.raises(e2b.SandboxException):  # not found: another deployment's
            e2b.Sandbox.connect(sandbox.sandbox_id, **_opts(server, other_key))
        assert e2b.Sandbox.kill(sandbox.sandbox_id, **_opts(server, other_key)) is False
        assert e2b.Sandbox.list(**_opts(server, other_key)).next_items() == []
        # The sandbox API without its access token, with the other key: refused.
        answer = server.http.post(
            "/process.Process/Start",
            headers={
                "E2b-Sandbox-Id": sandbox.sandbox_id,
                "X-API-Key": other_key,
                "Content-Type": "application/json",
            },
            content=b"{}",
        )
        assert answer.status_code == 502
        assert "was not found" in answer.json()["message"]
        assert sandbox.commands.run("echo still mine").stdout == "still mine\n"
    finally:
        sandbox.kill()


def test_timeout_kills_the_sandbox(server: PlatformServer, key: str) -> None:
    sandbox = e2b.Sandbox.create(timeout=1, **_opts(server, key))
    while sandbox.is_running():  # the sweep kills it past endAt; pytest's timeout bounds this
        time.sleep(0.2)
    assert sandbox.sandbox_id not in [
        s.sandbox_id for s in e2b.Sandbox.list(**_opts(server, key)).next_items()
    ]


def test_revoked_key_is_refused(server: PlatformServer) -> None:
    key = _key(server, "e2b-revoked")
    server.cli("deployment", "e2b-key", "e2b-revoked", "--revoke")
    with pytest.raises(e2b.AuthenticationException):
        e2b.Sandbox.create(**_opts(server, key))


def test_list_filters_by_template_start_and_order(server: PlatformServer, key: str) -> None:
    """``SandboxQuery(template=, started_after=)`` and ``order=``, which both E2B
    SDKs send as ``template``, ``startedAfter`` and ``order``: newest first unless
    ``asc``, as E2B's API."""
    opts = _opts(server, key)
    marked = {"suite": "list-filters"}
    first = e2b.Sandbox.create(template="base", metadata=marked, **opts)
    # The deployment's own name is a template too (the same environment as base).
    second = e2b.Sandbox.create(template="e2b-a", metadata=marked, **opts)
    try:
        ids = (first.sandbox_id, second.sandbox_id)

        def listed(order: Any = None, **query: Any) -> list[str]:
            found = e2b.Sandbox.list(
                query=e2b.SandboxQuery(metadata=marked, **query), order=order, **opts
            )
            return [s.sandbox_id for s in found.next_items()]

        assert listed() == listed(order="desc") == [ids[1], ids[0]]
        assert listed(order="asc") == list(ids)
        assert listed(template="base") == [ids[0]]
        assert listed(template="e2b-a") == [ids[1]]
        assert listed(template="other") == []
        started = second.get_info().started_at
        assert listed(started_after=started) == [ids[1]]
        # A page boundary holds in either order.
        page = e2b.Sandbox.list(
            query=e2b.SandboxQuery(metadata=marked), order="asc", limit=1, **opts
        )
        assert [s.sandbox_id for s in page.next_items()] == [ids[0]]
        assert [s.sandbox_id for s in page.next_items()] == [ids[1]]
        assert not page.has_next
        for bad in ({"order": "sideways"}, {"startedAfter": "yesterday"}):
            answer = server.http.get("/v2/sandboxes", headers={"X-API-Key": key}, params=bad)
            assert answer.status_code == 400
            assert answer.json()["error_code"] == "REQUEST_INVALID"
    finally:
        first.kill()
        second.kill()


def test_unsupported_calls_answer_e2b_errors(server: PlatformServer, key: str) -> None:
    answer = server.http.post("/templates", headers={"X-API-Key": key}, json={"alias": "x"})
    assert answer.status_code == 501
    assert answer.json()["code"] == 501
    assert "not implemented" in answer.json()["message"]
    unknown = server.http.post(
        "/v2/sandboxes", headers={"X-API-Key": key}, json={"templateID": "nope"}
    )
    assert unknown.status_code == 404
    assert "nope" in unknown.json()["message"]


@pytest.mark.parametrize("e2b_server", ["gvisor", "container", "vm"], indirect=True)
def test_background_commands_outlive_their_stream(server: PlatformServer, key: str) -> None:
    sandbox = e2b.Sandbox.create(envs={"GREETING": "hi"}, **_opts(server, key))
    try:
        handle = sandbox.commands.run(
            "read line; echo $GREETING:$line; read rest; echo rest:$rest; sleep 600",
            background=True,
            stdin=True,
            cwd="/tmp",
        )
        listed = {p.pid: p for p in sandbox.commands.list()}
        assert handle.pid in listed
        assert listed[handle.pid].cwd == "/tmp"
        assert listed[handle.pid].cmd == "/bin/bash"
        assert "sleep 600" in listed[handle.pid].args[-1]
        sandbox.commands.send_stdin(handle.pid, "one\n")
        # The first handle lets go; the command keeps running and is followed again.
        handle.disconnect()
        again = sandbox.commands.connect(handle.pid)
        sandbox.commands.stream_input(handle.pid, ["two", "\n"])
        sandbox.commands.close_stdin(handle.pid)
        seen: list[str] = []
        for stdout, _, _ in again:
            if stdout:
                seen.append(stdout)
            if "rest:two\n" in "".join(seen):
                break
        assert sandbox.commands.kill(handle.pid) is True
        with pytest.raises(e2b.CommandExitException) as killed:
            again.wait()
        assert killed.value.exit_code == 137
        assert handle.pid not in [p.pid for p in sandbox.commands.list()]
        assert sandbox.commands.kill(handle.pid) is False
        with pytest.raises(e2b.NotFoundException):
            sandbox.commands.send_stdin(handle.pid, "late")
    finally:
        sandbox.kill()


def test_a_command_is_killed_at_its_timeout_without_a_follower(
    server: PlatformServer, key: str
) -> None:
    sandbox = e2b.Sandbox.create(**_opts(server, key))
    try:
        handle = sandbox.commands.run("sleep 600", background=True, timeout=1)
        handle.disconnect()
        while handle.pid in [p.pid for p in sandbox.commands.list()]:
            time.sleep(0.2)  # the server's timer kills it; pytest's timeout bounds this
        # the output of a finished command stays readable until its end is delivered
        done = sandbox.commands.run("echo done", background=True)
        assert done.wait().stdout == "done\n"
    finally:
        sandbox.kill()


def test_async_background_commands(server: PlatformServer, key: str) -> None:
    async def main() -> None:
        sandbox = await e2b.AsyncSandbox.create(**_opts(server, key))
        try:
            seen: list[str] = []
            handle = await sandbox.commands.run(
                "read x; echo got:$x", background=True, stdin=True, on_stdout=seen.append
            )
            assert handle.pid in [p.pid for p in await sandbox.commands.list()]
            await sandbox.commands.send_stdin(handle.pid, "async\n")
            result = await handle.wait()
            assert (result.stdout, result.exit_code, seen) == ("got:async\n", 0, ["got:async\n"])
            sleeper = await sandbox.commands.run("sleep 600", background=True)
            assert await sandbox.commands.kill(sleeper.pid) is True
            assert await sandbox.commands.kill(sleeper.pid) is False
        finally:
            await sandbox.kill()

    asyncio.run(main())


@pytest.mark.parametrize("e2b_server", ["gvisor", "container", "vm"], indirect=True)
def test_filesystem_calls(server: PlatformServer, key: str) -> None:
    sandbox = e2b.Sandbox.create(**_opts(server, key))
    files = sandbox.files
    try:
        assert files.make_dir("/tmp/fs/a/b") is True  # parents too, as envd makes them
        assert files.make_dir("/tmp/fs/a/b") is False
        files.write("/tmp/fs/a/b/deep.txt", "deep")
        files.write("/tmp/fs/top.txt", "top!")
        info = files.get_info("/tmp/fs/top.txt")
        assert (info.name, info.type, info.size, info.path) == (
            "top.txt",
            e2b.FileType.FILE,
            4,
            "/tmp/fs/top.txt",
        )
        assert info.permissions == "-rw-r--r--"
        assert info.owner == "user"  # E2B's default account
        assert files.get_info("/tmp/fs/a").type == e2b.FileType.DIR
        assert [e.name for e in files.list("/tmp/fs")] == ["a", "top.txt"]
        deep = {e.path for e in files.list("/tmp/fs", depth=3)}
        assert deep == {
            "/tmp/fs/a",
            "/tmp/fs/a/b",
            "/tmp/fs/a/b/deep.txt",
            "/tmp/fs/top.txt",
        }
        assert files.exists("/tmp/fs/top.txt")
        assert not files.exists("/tmp/fs/nope")
        moved = files.rename("/tmp/fs/top.txt", "/tmp/fs/a/moved.txt")
        assert moved.path == "/tmp/fs/a/moved.txt"
        assert files.read(moved.path) == "top!"
        assert not files.exists("/tmp/fs/top.txt")
        files.remove("/tmp/fs/a")  # a whole tree, as envd removes it
        assert not files.exists("/tmp/fs/a")
        with pytest.raises(e2b.FileNotFoundException):
            files.get_info("/tmp/fs/a")
        with pytest.raises(e2b.FileNotFoundException):
            files.list("/tmp/fs/a")
        with pytest.raises(e2b.FileNotFoundException):
            files.remove("/tmp/fs/a")
        with pytest.raises(e2b.FileNotFoundException):
            files.rename("/tmp/fs/a", "/tmp/fs/b")
        with pytest.raises(e2b.InvalidArgumentException):
            files.list("/tmp/fs", depth=0)
    finally:
        sandbox.kill()


def test_async_filesystem_calls(server: PlatformServer, key: str) -> None:
    async def main() -> None:
        sandbox = await e2b.AsyncSandbox.create(**_opts(server, key))
        files = sandbox.files
        try:
            assert await files.make_dir("/tmp/afs/x") is True
            await files.write("/tmp/afs/x/f.txt", "f")
            listed = await files.list("/tmp/afs", depth=2)
            assert [e.path for e in listed] == ["/tmp/afs/x", "/tmp/afs/x/f.txt"]
            assert (await files.get_info("/tmp/afs/x/f.txt")).size == 1
            await files.rename("/tmp/afs/x/f.txt", "/tmp/afs/g.txt")
            assert await files.exists("/tmp/afs/g.txt")
            await files.remove("/tmp/afs")
            assert not await files.exists("/tmp/afs")
        finally:
            await sandbox.kill()

    asyncio.run(main())


def test_envs_and_metadata_are_podbays_create_options(server: PlatformServer) -> None:
    out = server.cli(
        "deployment", "create", "e2b-opts", "--spec", "-", "--e2b-key", input=SANDBOX_SPEC
    )
    token, key = out.stdout.strip().splitlines()[-2:]
    sandbox = e2b.Sandbox.create(
        envs={"GREETING": "hello"}, metadata={"suite": "opts"}, **_opts(server, key)
    )
    try:
        # podbay's own API: the same sandbox, with E2B's envs as its env and metadata as labels
        record = server.api("GET", f"/api/v1/sandboxes/{sandbox.sandbox_id}", token).json()
        assert record["labels"] == {"suite": "opts"}
        handle = server.attach(token, sandbox.sandbox_id).json()
        ran = server.exec(handle, "sh", "-c", "echo $GREETING").json()
        assert ran["stdout"] == "hello\n"
        free_form = e2b.Sandbox.create(metadata={"not a label key": "x"}, **_opts(server, key))
        try:  # metadata that cannot be labels stays E2B's only
            assert free_form.get_info().metadata == {"not a label key": "x"}
            listed = server.api("GET", f"/api/v1/sandboxes/{free_form.sandbox_id}", token)
            assert not listed.json().get("labels")
        finally:
            free_form.kill()
        with pytest.raises(e2b.SandboxException, match="NOT-A-NAME"):  # a 400, not made
            e2b.Sandbox.create(envs={"NOT-A-NAME": "x"}, **_opts(server, key))
    finally:
        sandbox.kill()


def _frames(raw: bytes) -> list[tuple[int, dict[str, Any]]]:
    out = []
    while raw:
        length = int.from_bytes(raw[1:5], "big")
        out.append((raw[0], json.loads(raw[5 : 5 + length])))
        raw = raw[5 + length :]
    return out


def test_tags_and_bad_messages_over_raw_connect(server: PlatformServer, key: str) -> None:
    """What the SDK's commands API does not expose (tags) and what it never
    sends (bad messages), in Connect's JSON as envd takes it."""
    sandbox = e2b.Sandbox.create(**_opts(server, key))
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-API-Key": key}
    unary = {**headers, "Content-Type": "application/json"}
    try:
        start = {"process": {"cmd": "/bin/sleep", "args": ["600"]}, "tag": "napper"}
        body = connect.envelope(start)
        with server.http.stream(
            "POST",
            "/process.Process/Start",
            headers={**headers, "Content-Type": connect.STREAM_JSON},
            content=body,
        ) as started:
            chunks = started.iter_bytes()
            first = next(chunks)
            pid = _frames(first[: 5 + int.from_bytes(first[1:5], "big")])[0][1]["event"]["start"][
                "pid"
            ]
            listed = server.http.post("/process.Process/List", headers=unary, content=b"{}").json()
            mine = [p for p in listed["processes"] if p["pid"] == pid]
            assert mine[0]["tag"] == "napper"
            assert mine[0]["config"]["args"] == ["600"]
            killed = server.http.post(
                "/process.Process/SendSignal",
                headers=unary,
                json={"process": {"tag": "napper"}, "signal": "SIGNAL_SIGKILL"},
            )
            assert (killed.status_code, killed.json()) == (200, {})
            rest = first[5 + int.from_bytes(first[1:5], "big") :] + b"".join(chunks)
        frames = _frames(rest)
        assert frames[-2][1]["event"]["end"]["exitCode"] == 137
        assert frames[-1] == (connect.FLAG_END, {})
        for path, content, code in [
            ("/process.Process/List", b"not json", "invalid_argument"),
            (
                "/process.Process/SendSignal",
                b'{"process": {"pid": "x"}, "signal": 9}',
                "invalid_argument",
            ),
            (
                "/process.Process/SendSignal",
                b'{"process": {"pid": 1}, "signal": "SIGNAL_SIGHUP"}',
                "invalid_argument",
            ),
            (
                "/process.Process/SendInput",
                b'{"process": {"tag": "nobody"}, "input": {"stdin": ""}}',
                "not_found",
            ),
            ("/filesystem.Filesystem/Stat", b"{}", "invalid_argument"),
            ("/filesystem.Filesystem/ListDir", b'{"path": "/", "depth": -1}', "invalid_argument"),
            ("/filesystem.Filesystem/Frobnicate", b"{}", "unimplemented"),
        ]:
            answer = server.http.post(path, headers=unary, content=content)
            assert answer.json()["code"] == code, (path, answer.text)
            assert answer.status_code == connect.STATUS[code]
    finally:
        sandbox.kill()


def test_two_followers_both_get_the_end(server: PlatformServer, key: str) -> None:
    sandbox = e2b.Sandbox.create(**_opts(server, key))
    try:
        first = sandbox.commands.run("read x; echo got:$x", background=True, stdin=True)
        second = sandbox.commands.connect(first.pid)
        sandbox.commands.send_stdin(first.pid, "go\n")
        assert first.wait().stdout == "got:go\n"
        assert second.wait().exit_code == 0
        assert first.pid not in [p.pid for p in sandbox.commands.list()]
    finally:
        sandbox.kill()
