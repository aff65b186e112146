"""The guest's first process after the initramfs: limits, the mux, then the agent.

Runs as PID 1 on the sandbox's root (the initramfs ``switch_root``-ed into it)
and becomes the agent, so the agent is the guest's init, as it is a
container's. Before that it:

- sets the hostname (and later the clock, when the host says: see ``set_clock``);
- puts itself (so every later process) in a cgroup with the machine's pids
  limit (memory and CPUs are the VM's own size);
- makes the agent's listening socket (abstract, so nothing on disk);
- starts the demultiplexer, which joins the host's serial port to that socket.

Then it runs the agent's ``main`` in this same interpreter rather than
exec-ing a second one: under TCG a Python start-up costs seconds (every
block of the interpreter is translated before it runs), so one start is what
a boot can afford.

The demultiplexer is threads over blocking calls: a reader on the port, and per
stream one thread from the agent to the port and one from a queue to the
agent. See :mod:`frames` for the protocol. Stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import sys
import threading
import time

from . import frames as f

AGENT_ADDRESS = "\0podbay-agent"
RUN = "/.podbay/run"
CGROUP = "/sys/fs/cgroup"
STOP_GRACE_SECONDS = 1.0
PORT_NAME = "podbay"
#: A template guest waits here for the configuration of the machine it becomes.
CONFIGURED = threading.Event()
GIVEN: list[dict[str, object]] = []
MUX: list[Mux] = []


def _write(path: str, text: str) -> None:
    with open(path, "w") as out:
        out.write(text)


def set_hostname(name: str) -> None:
    socket.sethostname(name)
    # /etc/hostname and /etc/hosts are these files, bound: rewrite in place.
    for path, text in (
        (f"{RUN}/hostname", name + "\n"),
        (
            f"{RUN}/hosts",
            f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{name}\n",
        ),
    ):
        with contextlib.suppress(OSError):
            _write(path, text)


def set_clock(now_ns: int) -> None:
    """Take on the host's wall clock: the guest's stood still while QEMU was
    stopped (a suspension, a template or checkpoint saved and restored)."""
    try:
        time.clock_settime_ns(time.CLOCK_REALTIME, now_ns)
    except OSError as exc:
        print(f"podbay-vm: clock not set: {exc}", file=sys.stderr, flush=True)


def limit_pids(pids: int) -> None:
    root = CGROUP
    try:
        _write(f"{root}/cgroup.subtree_control", "+pids")
        os.makedirs(f"{root}/sandbox", exist_ok=True)
        _write(f"{root}/sandbox/pids.max", str(pids))
        _write(f"{root}/sandbox/cgroup.procs", str(os.getpid()))
    except OSError as exc:
        print(f"podbay-vm: pids limit not set: {exc}", file=sys.stderr, flush=True)


def find_port() -> str:
    base = "/sys/class/virtio-ports"
    for _ in range(500):
        try:
            for entry in sorted(os.listdir(base)):
                with open(f"{base}/{entry}/name") as named:
                    if named.read().strip() == PORT_NAME:
                        return f"/dev/{entry}"
        except OSError:
            pass
        time.sleep(0.01)
    raise SystemExit("podbay-vm: no virtio-serial port named podbay")


class Stream:
    def __init__(self, mux: Mux, sid: int, sock: socket.socket) -> None:
        self.mux, self.sid, self.sock = mux, sid, sock
        self.alive = True
        self.credit = f.WINDOW
        self.cond = threading.Condition()
        self.inbox: queue.SimpleQueue[bytes | int] = queue.SimpleQueue()
        self.sent_eof = self.got_eof = False

    def start(self) -> None:
        threading.Thread(target=self._to_host, daemon=True).start()
        threading.Thread(target=self._to_agent, daemon=True).start()

    def _to_host(self) -> None:
        try:
            while True:
                with self.cond:
                    while self.alive and self.credit <= 0:
                        self.cond.wait()
                    if not self.alive:
                        return
                    want = min(self.credit, f.MAX_PAYLOAD)
                data = self.sock.recv(want)
                if not data:
                    break
                with self.cond:
                    self.credit -= len(data)
                if not self.mux.send(self, f.frame(f.DATA, self.sid, data)):
                    return
        except OSError:
            self.abort()
            return
        self.sent_eof = True
        self.mux.send(self, f.frame(f.EOF, self.sid))
        self._maybe_done()

    def _to_agent(self) -> None:
        try:
            while True:
                item = self.inbox.get()
                if isinstance(item, bytes):
                    self.sock.sendall(item)
                    self.mux.send(self, f.ack(self.sid, len(item)))
                elif item == f.EOF:
                    self.got_eof = True
                    self.sock.shutdown(socket.SHUT_WR)
                    self._maybe_done()
                else:
                    return
        except OSError:
            self.abort()

    def _maybe_done(self) -> None:
        if self.sent_eof and self.got_eof:
            self.mux.send(self, f.frame(f.CLOSE, self.sid))
            self.close()

    def grant(self, count: int) -> None:
        with self.cond:
            self.credit += count
            self.cond.notify_all()

    def abort(self) -> None:
        if self.alive:
            self.mux.send(self, f.frame(f.CLOSE, self.sid))
        self.close()

    def close(self) -> None:
        with self.cond:
            self.alive = False
            self.cond.notify_all()
        self.inbox.put(f.CLOSE)
        self.mux.forget(self.sid, self)
        with contextlib.suppress(OSError):
            self.sock.close()


class Mux:
    def __init__(self, port: str) -> None:
        self.fd = os.open(port, os.O_RDWR | os.O_CLOEXEC)
        self.lock = threading.Lock()
        self.streams: dict[int, Stream] = {}
        self.parser = f.Parser()

    def send(self, stream: Stream | None, data: bytes) -> bool:
        with self.lock:
            if stream is not None and not stream.alive:
                return False
            view = memoryview(data)
            while view:
                written = os.write(self.fd, view)
                view = view[written:]
        return True

    def forget(self, sid: int, stream: Stream) -> None:
        with self.lock:
            if self.streams.get(sid) is stream:
                del self.streams[sid]

    def drop_all(self) -> None:
        with self.lock:
            streams = list(self.streams.values())
            self.streams.clear()
        for stream in streams:
            stream.close()

    def _sync(self, nonce: bytes) -> None:
        # The machine is about to be switched off. Its processes get a moment to
        # finish what they are writing (a command the agent already answered may
        # still be running under a slow TCG), then every process but this one
        # (the agent, PID 1) is killed, so nothing written after the flush is
        # lost with the VM.
        os.sync()
        time.sleep(STOP_GRACE_SECONDS)
        with contextlib.suppress(OSError):
            os.kill(-1, signal.SIGKILL)
        os.sync()
        self.send(None, f.frame(f.SYNC_ACK, 0, nonce))

    def serve(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except InterruptedError:
                continue
            if not data:
                # The host side is not connected (a server restart): every stream
                # dies with it; wait for the next hello.
                self.drop_all()
                self.parser.reset()
                time.sleep(0.02)
                continue
            self.parser.feed(data)
            for kind, sid, payload in self.parser.frames():
                self.handle(kind, sid, payload)

    def handle(self, kind: int, sid: int, payload: bytes) -> None:
        if kind == f.HELLO:
            self.drop_all()
            self.send(None, f.hello(f.HELLO_ACK, payload))
            return
        if kind == f.HOSTNAME:
            set_hostname(payload.decode(errors="replace"))
            return
        if kind == f.CLOCK:
            set_clock(f.clock_ns(payload))
            return
        if kind == f.CONFIG:
            GIVEN.append(json.loads(payload))
            CONFIGURED.set()
            return
        if kind == f.SYNC:
            threading.Thread(target=self._sync, args=(payload,), daemon=True).start()
            return
        if kind == f.OPEN:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(AGENT_ADDRESS)
            except OSError:
                sock.close()
                self.send(None, f.frame(f.CLOSE, sid))
                return
            stream = Stream(self, sid, sock)
            with self.lock:
                old: Stream | None = self.streams.pop(sid, None)
                self.streams[sid] = stream
            if old is not None:
                old.close()
            stream.start()
            return
        # The stream frames are dispatched as the host's relay.py does (a deliberate
        # twin): this side runs threads in the guest's bare interpreter, the host's
        # side asyncio queues, so the two cannot share the code that feeds them.
        known = self.streams.get(sid)
        if known is None:
            return  # a stream that just ended: its late frames are moot
        if kind == f.DATA:
            known.inbox.put(payload)
        elif kind == f.EOF:
            known.inbox.put(f.EOF)
        elif kind == f.ACK:
            known.grant(f.ack_count(payload))
        elif kind == f.CLOSE:
            known.close()


def run_mux() -> None:
    try:
        mux = Mux(find_port())
        MUX.append(mux)
        mux.serve()
    except BaseException as exc:  # the agent is unreachable without it: say why
        print(f"podbay-vm: the mux stopped: {exc!r}", file=sys.stderr, flush=True)
        raise


def _uptime() -> str:
    with open("/proc/uptime") as up:
        return up.read().split()[0]


def main() -> None:
    print(f"podbay-vm: init at {_uptime()}", file=sys.stderr, flush=True)
    with open(f"{RUN}/config.json") as given:
        config = json.load(given)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(AGENT_ADDRESS)
    listener.listen(128)
    old_size = threading.stack_size(256 * 1024)
    threading.Thread(target=run_mux, name="podbay-mux", daemon=True).start()
    threading.stack_size(old_size)
    from podbay.agent.__main__ import main as agent_main  # staged beside this package

    if config.get("template"):
        # Booted once to be snapshotted: everything above is done and imported;
        # each machine restored from the snapshot continues here with its own
        # hostname, limits and environment.
        while not MUX:
            time.sleep(0.01)
        while not CONFIGURED.wait(1.0):
            MUX[0].send(None, f.frame(f.WAITING, 0))
        config.update(GIVEN[-1])
        _write(f"{RUN}/env.json", json.dumps(config["env"]))
    set_hostname(str(config["hostname"]))
    limit_pids(int(config["pids"]))
    print(f"podbay-vm: agent at {_uptime()}", file=sys.stderr, flush=True)

    sys.exit(agent_main(["--fd", str(listener.fileno()), *config["agent_options"]]))


if __name__ == "__main__":
    main()
