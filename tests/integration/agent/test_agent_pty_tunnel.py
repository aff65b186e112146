"""The gateway's leg of terminals and ports, spoken to the agent directly:
an HTTP/1.1 upgrade, then stream frames (pty) or raw bytes (tunnel)."""

from __future__ import annotations

import json
import socket
import threading
import time

from agent_harness import Agent, open_pty, upgrade

from podbay.wire import paths, stream


def test_python_repl_on_a_terminal_answers_resizes_and_reports_its_exit(agent: Agent) -> None:
    sock, head, frames = open_pty(
        agent, command=["python3", "-q", "-i"], rows=30, cols=100, term="xterm-mono"
    )
    assert head.startswith(b"HTTP/1.1 101"), head
    frames.output_until(b">>> ")
    sock.sendall(stream.frame(stream.DATA, b"6*7\r"))
    assert b"42" in frames.output_until(b"42")
    sock.sendall(
        stream.frame(
            stream.DATA,
            b"import os, shutil; print(os.environ['TERM'], "
            b"shutil.get_terminal_size(), os.isatty(0))\r",
        )
    )
    assert b"xterm-mono os.terminal_size(columns=100, lines=30) True" in frames.output_until(
        b"True"
    )
    sock.sendall(stream.resize_frame(50, 132))
    sock.sendall(stream.frame(stream.DATA, b"print(shutil.get_terminal_size())\r"))
    assert b"columns=132, lines=50" in frames.output_until(b"lines=50")
    # Ctrl-C on the terminal is SIGINT to the foreground program.
    sock.sendall(stream.frame(stream.DATA, b"import time; time.sleep(30)\r"))
    time.sleep(0.3)
    sock.sendall(stream.frame(stream.DATA, b"\x03"))
    frames.output_until(b"KeyboardInterrupt")
    sock.sendall(stream.frame(stream.DATA, b"raise SystemExit(7)\r"))
    assert frames.exit_code() == 7
    sock.close()


def test_a_closed_terminal_kills_its_command(agent: Agent) -> None:
    sock, head, frames = open_pty(agent, command=["sh", "-c", "echo $$; exec sleep 300"])
    assert head.startswith(b"HTTP/1.1 101")
    pid = int(frames.output_until(b"\n").split()[0])
    sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    break
        except (FileNotFoundError, ProcessLookupError):  # reaped, or while reading
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the command outlived its terminal")


def test_a_command_that_cannot_start_is_refused_without_upgrade(agent: Agent) -> None:
    sock, head, rest = upgrade(
        agent, "POST", paths.PTY, paths.UPGRADE_PTY, json.dumps({"command": ["/no/such"]}).encode()
    )
    assert head.startswith(b"HTTP/1.1 400"), head
    assert b"COMMAND_START_FAILED" in rest or b"COMMAND_START_FAILED" in sock.recv(4096)
    for bad in (
        {"command": ["sh"], "rows": 0},
        {"command": ["sh"], "term": "a\nb"},
        {"command": ["sh"], "extra": 1},
    ):
        sock, head, _ = upgrade(
            agent, "POST", paths.PTY, paths.UPGRADE_PTY, json.dumps(bad).encode()
        )
        assert head.startswith(b"HTTP/1.1 400"), (bad, head)


def test_hostile_frames_end_the_session(agent: Agent) -> None:
    sock, head, _ = open_pty(agent, command=["cat"])
    assert head.startswith(b"HTTP/1.1 101")
    sock.sendall(b"d" + (stream.MAX_FRAME + 1).to_bytes(4, "big"))
    while sock.recv(65536):  # whatever cat echoed, then the end
        pass


def test_tunnel_splices_to_a_server_on_the_sandbox_loopback(agent: Agent) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def echo_once() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data.upper())

    threading.Thread(target=echo_once, daemon=True).start()
    sock, head, rest = upgrade(agent, "GET", f"{paths.TUNNEL}?port={port}", paths.UPGRADE_TUNNEL)
    assert head.startswith(b"HTTP/1.1 101"), head
    sock.sendall(b"hello" * 100_000)
    sock.shutdown(socket.SHUT_WR)
    got = rest
    while chunk := sock.recv(65536):
        got += chunk
    assert got == b"HELLO" * 100_000
    server.close()


def test_tunnel_to_a_closed_port_or_a_bad_one_is_refused(agent: Agent) -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    _, head, rest = upgrade(agent, "GET", f"{paths.TUNNEL}?port={port}", paths.UPGRADE_TUNNEL)
    assert head.startswith(b"HTTP/1.1 502"), (head, rest)
    assert b"PORT_UNREACHABLE" in rest, (head, rest)
    for bad in ("0", "65536", "x", "", "-1"):
        _, head, _ = upgrade(agent, "GET", f"{paths.TUNNEL}?port={bad}", paths.UPGRADE_TUNNEL)
        assert head.startswith(b"HTTP/1.1 400"), (bad, head)
    _, head, _ = upgrade(agent, "GET", f"{paths.TUNNEL}?port={port}", "websocket")
    assert head.startswith(b"HTTP/1.1 400"), head
