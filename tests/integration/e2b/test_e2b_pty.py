"""``sandbox.pty`` through E2B's SDK (sync and async) on podbay's terminals:
create with size, user, cwd and envs; input; resize (``Update``); a second
follower (``connect``); exit codes; kill; refusals. Output is awaited by
markers the shell computes (``A$((6*7))`` prints ``A42``, its echo does not)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from podbay.e2b import connect
from podbay.testing.platform import PlatformServer

e2b = pytest.importorskip("e2b")

pytestmark = [
    pytest.mark.root,
    pytest.mark.parametrize("e2b_server", ["gvisor", "container", "vm"], indirect=True),
]


class Screen:
    """What a terminal wrote, filled by a thread that follows its handle."""

    def __init__(self, handle: Any) -> None:
        self.text = ""
        self.changed = threading.Condition()
        self.exit: BaseException | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._follow, args=(handle,), daemon=True)
        self._thread.start()

    def _follow(self, handle: Any) -> None:
        try:
            handle.wait(on_pty=self._add)
        except BaseException as exc:  # noqa: BLE001 - the handle's end, as the SDK raises it, kept for the test to read
            self.exit = exc
        finally:
            self.done.set()
            with self.changed:
                self.changed.notify_all()

    def _add(self, data: bytes) -> None:
        with self.changed:
            self.text += data.decode(errors="replace")
            self.changed.notify_all()

    def until(self, marker: str) -> str:
        """The output up to ``marker``, once it came (pytest's timeout bounds the wait)."""
        with self.changed:
            self.changed.wait_for(lambda: marker in self.text or self.done.is_set())
        assert marker in self.text, self.text
        return self.text[: self.text.index(marker)]

    def ended(self) -> BaseException | None:
        self.done.wait()
        return self.exit


def test_pty_input_resize_connect_and_exit(
    e2b_server: PlatformServer, e2b_opts: dict[str, Any]
) -> None:
    sandbox = e2b.Sandbox.create(**e2b_opts)
    try:
        handle = sandbox.pty.create(e2b.PtySize(rows=24, cols=80), envs={"MARK": "mk"})
        screen = Screen(handle)
        sandbox.pty.send_stdin(handle.pid, b"stty size; pwd; id -un; echo $MARK-$TERM A$((6*7))\n")
        seen = screen.until("A42")
        assert "24 80" in seen
        assert "/home/user" in seen
        assert "mk-xterm-256color" in seen
        assert "\nuser" in seen.replace("\r", "")

        sandbox.pty.resize(handle.pid, e2b.PtySize(rows=30, cols=100))
        sandbox.pty.send_stdin(handle.pid, b"stty size; echo B$((6*7))\n")
        assert "30 100" in screen.until("B42").split("A42")[-1]

        assert handle.pid in [p.pid for p in sandbox.commands.list()]
        second = Screen(sandbox.pty.connect(handle.pid))
        sandbox.pty.send_stdin(handle.pid, b"echo C$((6*7))\n")
        screen.until("C42")
        second.until("C42")

        sandbox.pty.stream_input(handle.pid, [b"echo G", b"$((6*7))\n"])  # StreamInput
        screen.until("G42")

        sandbox.pty.send_stdin(handle.pid, b"exit 3\n")
        for follower in (screen, second):
            ended = follower.ended()
            assert isinstance(ended, e2b.CommandExitException)
            assert ended.exit_code == 3
        assert handle.pid not in [p.pid for p in sandbox.commands.list()]
        assert sandbox.pty.kill(handle.pid) is False
    finally:
        sandbox.kill()


def test_pty_as_root_in_a_cwd_and_kill(e2b_opts: dict[str, Any]) -> None:
    sandbox = e2b.Sandbox.create(**e2b_opts)
    try:
        handle = sandbox.pty.create(e2b.PtySize(rows=10, cols=40), user="root", cwd="/tmp")
        screen = Screen(handle)
        sandbox.pty.send_stdin(handle.pid, b"id -un; pwd; echo D$((6*7))\n")
        seen = screen.until("D42").replace("\r", "")
        assert "root\n/tmp\n" in seen
        assert sandbox.pty.kill(handle.pid) is True
        ended = screen.ended()
        assert isinstance(ended, e2b.CommandExitException)
        assert ended.exit_code == -1
        assert handle.pid not in [p.pid for p in sandbox.commands.list()]
        # a command without a PTY cannot be resized; an unknown pid is not found
        running = sandbox.commands.run("sleep 60", background=True)
        with pytest.raises(e2b.SandboxException, match="no PTY"):
            sandbox.pty.resize(running.pid, e2b.PtySize(rows=5, cols=5))
        running.kill()
        with pytest.raises(e2b.SandboxException):
            sandbox.pty.resize(handle.pid, e2b.PtySize(rows=5, cols=5))
    finally:
        sandbox.kill()


def test_async_pty(e2b_opts: dict[str, Any]) -> None:
    async def main() -> None:
        sandbox = await e2b.AsyncSandbox.create(**e2b_opts)
        try:
            text = ""
            grew = asyncio.Event()

            def on_data(data: bytes) -> None:
                nonlocal text
                text += data.decode(errors="replace")
                grew.set()

            async def until(marker: str) -> None:
                while marker not in text:
                    grew.clear()
                    await grew.wait()

            handle = await sandbox.pty.create(e2b.PtySize(rows=12, cols=34), on_data=on_data)
            await sandbox.pty.send_stdin(handle.pid, b"stty size; echo E$((6*7))\n")
            await until("E42")
            assert "12 34" in text
            await sandbox.pty.resize(handle.pid, e2b.PtySize(rows=40, cols=120))
            await sandbox.pty.send_stdin(handle.pid, b"stty size; echo F$((6*7))\n")
            await until("F42")
            assert "40 120" in text.split("E42")[-1]
            await sandbox.pty.send_stdin(handle.pid, b"exit\n")
            assert (await handle.wait()).exit_code == 0

            killed = await sandbox.pty.create(e2b.PtySize(rows=5, cols=5), on_data=on_data)
            assert await sandbox.pty.kill(killed.pid) is True
            with pytest.raises(e2b.CommandExitException):
                await killed.wait()

            # A terminal that cannot start: its stream ends with the refusal.
            refused = await sandbox.pty.create(
                e2b.PtySize(rows=5, cols=5), on_data=on_data, cwd="/no/such/dir"
            )
            with pytest.raises(e2b.SandboxException):
                await refused.wait()
            with pytest.raises(e2b.SandboxException, match="rows and cols"):
                await sandbox.pty.create(e2b.PtySize(rows=0, cols=5), on_data=on_data)
        finally:
            await sandbox.kill()

    asyncio.run(main())


def test_a_quiet_terminal_gets_keepalives(
    e2b_server: PlatformServer, e2b_opts: dict[str, Any]
) -> None:
    """With ``Keepalive-Ping-Interval`` (the SDK sends 50 s), a terminal with
    nothing to say sends keepalive events, as envd does."""
    sandbox = e2b.Sandbox.create(**e2b_opts)
    try:
        start = {
            "process": {"cmd": "/bin/sleep", "args": ["600"]},
            "pty": {"size": {"rows": 5, "cols": 5}},
        }
        headers = {
            "E2b-Sandbox-Id": sandbox.sandbox_id,
            "X-Access-Token": sandbox._envd_access_token,
            "Content-Type": connect.STREAM_JSON,
            "Keepalive-Ping-Interval": "1",
        }
        url = e2b_server.base_url + "/process.Process/Start"
        with httpx.stream("POST", url, headers=headers, content=connect.envelope(start)) as answer:
            events = _events(answer.iter_bytes())
            pid = next(events)["start"]["pid"]
            assert next(events) == {"keepalive": {}}
        assert sandbox.pty.kill(pid) is True
    finally:
        sandbox.kill()


def _events(chunks: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    """The events of a Connect stream, as they arrive."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        while len(buffer) >= 5 and len(buffer) >= 5 + int.from_bytes(buffer[1:5], "big"):
            length = int.from_bytes(buffer[1:5], "big")
            message = json.loads(buffer[5 : 5 + length])
            buffer = buffer[5 + length :]
            yield message["event"]
