"""``files.watch_dir`` through E2B's SDK: the async SDK's WatchDir stream and
the sync SDK's polling watcher (CreateWatcher, GetWatcherEvents,
RemoveWatcher), with inotify events for changes made in the sandbox: create,
write, remove, rename, chmod, recursive or not; refusals for what cannot be
watched."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

e2b = pytest.importorskip("e2b")

pytestmark = [
    pytest.mark.root,
    # Every class: inotify is the guest kernel's under vm, gVisor's own under gvisor.
    pytest.mark.parametrize("e2b_server", ["gvisor", "container", "vm"], indirect=True),
]

CHANGES = (
    "cd /tmp/w && echo a > a.txt && echo more >> a.txt && chmod 600 a.txt"
    " && mv a.txt b.txt && mkdir sub && rm b.txt"
)

#: How many watcher processes run in the sandbox (the pattern's brackets keep
#: the shell running it from matching itself).
WATCHERS = "pgrep -fc 'IN_DONT_FOLL[O]W' || true"


def _kinds(events: list[Any]) -> set[tuple[str, str]]:
    return {(e.name, e.type.value) for e in events}


def test_polling_watcher(e2b_opts: dict[str, Any]) -> None:
    sandbox = e2b.Sandbox.create(**e2b_opts)
    try:
        sandbox.files.make_dir("/tmp/w")
        watcher = sandbox.files.watch_dir("/tmp/w")
        sandbox.commands.run(CHANGES)
        events: list[Any] = []
        while ("b.txt", "remove") not in _kinds(events):  # pytest's timeout bounds it
            events += watcher.get_new_events()
        assert {
            ("a.txt", "create"),
            ("a.txt", "write"),
            ("a.txt", "chmod"),
            ("a.txt", "rename"),
            ("b.txt", "create"),
            ("sub", "create"),
            ("b.txt", "remove"),
        } <= _kinds(events)
        assert not any(name.startswith("sub/") for name, _ in _kinds(events))  # not recursive
        # The watcher runs in the sandbox but is no command of the SDK's.
        assert sandbox.commands.run(WATCHERS).stdout == "1\n"
        assert sandbox.commands.list() == []
        watcher.stop()
        assert sandbox.commands.run(WATCHERS).stdout == "0\n"
        with pytest.raises(e2b.SandboxException):
            watcher.get_new_events()

        deep = sandbox.files.watch_dir("/tmp/w", recursive=True)
        sandbox.commands.run("mkdir /tmp/w/sub/x")
        seen: list[Any] = []
        while ("sub/x", "create") not in _kinds(seen):
            seen += deep.get_new_events()
        # once its create is seen, a new directory is watched too
        sandbox.commands.run("echo 1 > /tmp/w/sub/x/y")
        while ("sub/x/y", "write") not in _kinds(seen):
            seen += deep.get_new_events()
        deep.stop()

        with pytest.raises(e2b.NotFoundException):
            sandbox.files.watch_dir("/tmp/nowhere")
        sandbox.files.write("/tmp/w/file", "x")
        with pytest.raises(e2b.InvalidArgumentException):
            sandbox.files.watch_dir("/tmp/w/file")
        # Bounded: at most 16 polling watchers per sandbox.
        many = [sandbox.files.watch_dir("/tmp/w") for _ in range(16)]
        with pytest.raises(e2b.SandboxException, match="at most 16 watchers"):
            sandbox.files.watch_dir("/tmp/w")
        many.pop().stop()
        many.append(sandbox.files.watch_dir("/tmp/w"))
        for each in many:
            each.stop()
        sandbox.commands.run("mkdir -m 700 /tmp/private", user="root")
        with pytest.raises(e2b.SandboxException, match="Permission denied"):
            sandbox.files.watch_dir("/tmp/private")  # user may not read it
        sandbox.files.watch_dir("/tmp/private", user="root").stop()
    finally:
        sandbox.kill()


def test_async_watch_dir(e2b_opts: dict[str, Any]) -> None:
    async def main() -> None:
        sandbox = await e2b.AsyncSandbox.create(**e2b_opts)
        try:
            await sandbox.files.make_dir("/tmp/w")
            events: list[Any] = []
            arrived = asyncio.Event()

            def on_event(event: Any) -> None:
                events.append(event)
                arrived.set()

            async def until(name: str, kind: str) -> None:
                while (name, kind) not in _kinds(events):
                    arrived.clear()
                    await arrived.wait()

            handle = await sandbox.files.watch_dir("/tmp/w", on_event, recursive=True)
            await sandbox.commands.run(CHANGES)
            await until("b.txt", "remove")
            await sandbox.commands.run("echo deep > /tmp/w/sub/c.txt")
            await until("sub/c.txt", "write")
            assert {
                ("a.txt", "create"),
                ("a.txt", "write"),
                ("a.txt", "chmod"),
                ("a.txt", "rename"),
                ("b.txt", "create"),
                ("sub", "create"),
                ("sub/c.txt", "create"),
            } <= _kinds(events)
            await handle.stop()
            # the stream's end removes its watcher process (once the server sees it closed)
            await sandbox.commands.run(f"while [ $({WATCHERS}) != 0 ]; do sleep 0.05; done")
            with pytest.raises(e2b.NotFoundException):
                await sandbox.files.watch_dir("/tmp/nowhere", on_event)
        finally:
            await sandbox.kill()

    asyncio.run(main())
