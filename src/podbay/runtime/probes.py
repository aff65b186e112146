"""Isolation probes: run inside real machines through their agents, judged on the host.

Driver-agnostic (they only exec through :class:`AgentClient`), used by
``podbay doctor`` and mirrored by the integration tests. Each probe returns a
:class:`Probe` with a one-line detail that says what went wrong.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from podbay.agent.protocol import HIBERNATE_ENV
from podbay.errors import AgentError, AgentUnreachable
from podbay.runtime.staging import AGENT_ENV

from .agent_client import AgentClient


@dataclass(frozen=True)
class Probe:
    name: str
    ok: bool
    detail: str = ""


def run_probe(name: str, check: Callable[[], str | None]) -> Probe:
    """``check`` returns ``None`` when fine, else what is wrong; exceptions fail too."""
    try:
        problem = check()
    except Exception as e:  # noqa: BLE001 - a probe that breaks is a failed probe, with its words
        return Probe(name, False, f"{type(e).__name__}: {e}")
    return Probe(name, problem is None, problem or "")


def user_namespace(agent: AgentClient) -> str | None:
    uid = agent.sh("id -u").stdout.strip()
    mapping = agent.sh("cat /proc/self/uid_map").stdout.split()
    if uid != "0":
        return f"commands run as uid {uid}, expected sandbox root"
    if len(mapping) < 2 or mapping[1] == "0":
        return f"uid 0 inside is uid 0 outside (uid_map {' '.join(mapping)})"
    return None


def hardening(agent: AgentClient) -> str | None:
    if agent.sh("mount -t tmpfs none /mnt 2>/dev/null").ok:
        return "mount succeeded inside the sandbox"
    if agent.sh("unshare -U true 2>/dev/null").ok:
        return "a new user namespace could be made inside the sandbox"
    status = agent.sh("cat /proc/self/status").stdout
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if fields.get("NoNewPrivs", "").strip() != "1":
        return "no_new_privileges is off"
    if fields.get("Seccomp", "").strip() != "2":
        return "no seccomp filter"
    caps = int(fields.get("CapEff", "0").strip() or "0", 16)
    if caps & (1 << 21) or caps & (1 << 12):
        return "CAP_SYS_ADMIN or CAP_NET_ADMIN granted"
    return None


#: What the agent (the sandbox's init) may carry in its environment: PATH, HOME
#: and its own start-up settings. Anything else came from the host.
INIT_ENV_NAMES = frozenset({"PATH", "HOME", HIBERNATE_ENV, *AGENT_ENV})


def no_host_environment(agent: AgentClient) -> str | None:
    # Normally unreadable from inside at all (the agent is non-dumpable).
    env = agent.sh("tr '\\0' '\\n' < /proc/1/environ").stdout.split()
    extra = sorted({e.split("=", 1)[0] for e in env} - INIT_ENV_NAMES)
    return f"the sandbox's init has host variables: {', '.join(extra)}" if extra else None


#: Run inside a sandbox (as root, on the image's python3): each attack on the
#: agent and its outcome, as a JSON object of name → sentence ("refused: …").
AGENT_ATTACKS = r"""
import ctypes, json, os, signal, socket, time
libc = ctypes.CDLL(None, use_errno=True)
SYS_PIDFD_OPEN, SYS_PIDFD_GETFD, PTRACE_SEIZE, PTRACE_DETACH = 434, 438, 0x4206, 17
out = {}

def failed():
    return OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))

def steal():
    pidfd = libc.syscall(SYS_PIDFD_OPEN, 1, 0)
    if pidfd < 0:
        raise failed()
    fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, 3, 0)
    if fd < 0:
        raise failed()
    return "stole a socket listening on " + repr(socket.socket(fileno=fd).getsockname())

def trace():
    if libc.ptrace(PTRACE_SEIZE, 1, 0, 0) != 0:
        raise failed()
    libc.ptrace(PTRACE_DETACH, 1, 0, 0)
    return "attached to the agent"

def memory():
    with open("/proc/1/mem", "rb"):
        return "opened the agent's memory"

def fd_link():
    return "reads fd 3 as " + os.readlink("/proc/1/fd/3")

def take_fd():
    # Its sockets and pipes, through /proc (its standard streams are the console).
    taken = []
    for name in os.listdir("/proc/1/fd"):
        if int(name) > 2:
            try:
                os.close(os.open("/proc/1/fd/" + name, os.O_RDONLY))
                taken.append(name)
            except OSError:
                pass
    if taken:
        return "opened the agent's descriptors " + ", ".join(sorted(taken))
    raise OSError(0, "none of its descriptors opens")

def stop():
    os.kill(1, signal.SIGSTOP)
    time.sleep(0.2)
    with open("/proc/1/status") as f:
        state = [line.split()[1] for line in f if line.startswith("State:")]
    os.kill(1, signal.SIGCONT)
    if state and state[0] == "T":
        return "stopped the agent"
    raise OSError(0, "ignored: a namespace's init takes no such signal from inside")

def oom():
    with open("/proc/1/oom_score_adj", "w") as f:
        f.write("1000")
    return "made the agent the OOM killer's first choice"

def environ():
    with open("/proc/1/environ", "rb") as f:
        return "read the agent's environment: %d bytes" % len(f.read())

def preload():
    # The loader the agent starts (and wakes from hibernation) through reads it.
    # Asked of the kernel (a read-only mount answers EROFS), nothing written.
    path = "/etc/ld.so.preload"
    if not os.path.lexists(path):
        if os.access("/etc", os.W_OK):
            return "can create " + path + ", which the agent's next start would load"
        raise OSError(0, "neither there nor creatable")
    if os.access(path, os.W_OK):
        return "can write " + path + ", which the agent's next start would load"
    raise OSError(0, "read-only")

for name, fn in [("pidfd_getfd", steal), ("ptrace", trace), ("mem", memory),
                 ("fd", fd_link), ("take_fd", take_fd), ("signal", stop),
                 ("oom_score_adj", oom), ("environ", environ), ("preload", preload)]:
    try:
        out[name] = fn()
    except OSError as e:
        out[name] = "refused: " + (e.strerror or str(e))
print(json.dumps(out))
"""

#: Under a kernel of the sandbox's own (gVisor 2022) these attacks succeed
#: without taking the agent over or down, each for a reason of that kernel's
#: (the agent otherwise runs as an id sandbox root cannot reach: see
#: :mod:`podbay.agent.guard`).
OWN_KERNEL_HARMLESS = {
    "fd": "gVisor lists every process's /proc/<pid>/fd to all; none of the agent's "
    "sockets or pipes opens (take_fd)",
    "environ": "gVisor serves /proc/<pid>/environ to all; the agent's holds PATH, HOME, "
    "LANG and malloc settings only (no host environment)",
    "oom_score_adj": "gVisor has no OOM killer; the host's ends the whole sandbox "
    "whatever the score inside",
}


def agent_attacks(agent: AgentClient) -> dict[str, str]:
    """Each attack on the agent from inside and its outcome (see :data:`AGENT_ATTACKS`)."""
    result = agent.exec(["python3", "-c", AGENT_ATTACKS], timeout_ms=30_000)
    if result.exit_code != 0:
        raise RuntimeError(f"the attack script failed: {result.stderr.strip()[-300:]}")
    found = json.loads(result.stdout)
    return {str(k): str(v) for k, v in found.items()}


def agent_out_of_reach(agent: AgentClient, *, own_kernel: bool = False) -> str | None:
    """Sandbox code can neither trace, stop nor rob the agent (its socket,
    memory, descriptors). ``own_kernel``: under gVisor, where the outcomes
    in :data:`OWN_KERNEL_HARMLESS` are that kernel's and do not count."""
    won = [
        f"{name}: {outcome}"
        for name, outcome in agent_attacks(agent).items()
        if not outcome.startswith("refused") and not (own_kernel and name in OWN_KERNEL_HARMLESS)
    ]
    return "; ".join(won) if won else None


def pid_namespace(agent: AgentClient) -> str | None:
    count = len(agent.sh("ps -e -o pid=").stdout.split())
    return f"{count} processes visible: the host's leak in" if count > 30 else None


def own_kernel(agent: AgentClient) -> str | None:
    """A ``vm`` sandbox runs its own kernel: not the host's release or build."""
    import os

    inside = agent.sh("uname -r; uname -v").stdout.split("\n")
    host = [os.uname().release, os.uname().version]
    if inside[:2] == host:
        return f"the sandbox runs the host's kernel ({host[0]})"
    return None


def guest_processes(agent: AgentClient) -> str | None:
    """A guest sees only its own processes (its kernel's threads aside)."""
    rows = [line.split() for line in agent.sh("ps -e -o pid=,ppid=").stdout.splitlines()]
    user = [pid for pid, ppid in rows if "2" not in (pid, ppid)]
    return f"{len(user)} processes visible: the host's leak in" if len(user) > 30 else None


def neighbours(a: AgentClient, b: AgentClient) -> str | None:
    if not a.sh(
        "echo x > /workspace/podbay-probe-a && setsid sleep 4321 </dev/null >/dev/null 2>&1 &"
    ).ok:
        return "could not write in the first sandbox"
    if b.sh("test -e /workspace/podbay-probe-a").ok:
        return "a file of one sandbox is visible in another"
    if b.sh("ps -eo args | grep -c 'sleep 432[1]'").stdout.strip() != "0":
        return "a process of one sandbox is visible in another"
    return None


def fork_bomb(bomb: AgentClient, other: AgentClient) -> str | None:
    """The bomb's sandbox hits its pids limit; ``other`` keeps answering."""
    done = threading.Event()

    def explode() -> None:
        # The bomb's agent may fail to answer while its pids are exhausted.
        with contextlib.suppress(AgentError, AgentUnreachable):
            bomb.sh("f(){ f | f & }; f; sleep 5", timeout_ms=3000)
        done.set()

    threading.Thread(target=explode, daemon=True).start()
    time.sleep(1.0)
    started = time.monotonic()
    answer = other.sh("echo alive", timeout_ms=10_000).stdout.strip()
    if answer != "alive" or time.monotonic() - started > 5:
        return "another sandbox stopped answering during a fork bomb"
    done.wait(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(AgentError, AgentUnreachable):  # not yet back
            if bomb.sh("echo back", timeout_ms=5000).stdout.strip() == "back":
                return None
        time.sleep(0.5)
    return "the fork-bombed sandbox's agent never answered again"


def memory_hog(agent: AgentClient) -> str | None:
    hog = agent.sh(
        "python3 -c 'a = []\nwhile True: a.append(bytearray(16 << 20))'", timeout_ms=60_000
    )
    if hog.exit_code != 137:
        return f"the memory hog ended with {hog.exit_code}, not killed (137)"
    if agent.sh("echo ok").stdout.strip() != "ok":
        return "the agent stopped answering after the memory hog"
    return None


def kernel_contains(
    attack: Callable[[], object],
    victim: AgentClient,
    other: AgentClient,
    restart: Callable[[], None],
) -> str | None:
    """For a sandbox with a kernel of its own (gVisor): an attack that exhausts it
    (fork bomb, memory hog) may end the whole sandbox, as it would a VM, but
    ``other`` keeps answering and the victim answers again, restarted if it ended."""
    # The attack may end the whole sandbox, and its exec with it.
    with contextlib.suppress(AgentError, AgentUnreachable):
        attack()
    if other.sh("echo alive", timeout_ms=10_000).stdout.strip() != "alive":
        return "another sandbox stopped answering"
    with contextlib.suppress(AgentError, AgentUnreachable):  # ended: restarted below
        if victim.sh("echo back", timeout_ms=5000).stdout.strip() == "back":
            return None
    restart()
    if victim.sh("echo back", timeout_ms=10_000).stdout.strip() != "back":
        return "the sandbox did not answer again after a restart"
    return None


def disk_quota(agent: AgentClient, disk_bytes: int) -> str | None:
    mib = disk_bytes // (1024 * 1024) + 64
    fill = agent.sh(
        f"dd if=/dev/zero of=/workspace/fill bs=1M count={mib} 2>&1; rm -f /workspace/fill"
    )
    if "No space left" not in fill.stdout:
        return f"writing {mib} MiB into a {disk_bytes >> 20} MiB disk did not fail"
    return None


def python_removed(agent: AgentClient) -> str | None:
    agent.sh("rm -rf /usr/bin/python3* /usr/lib/python3* /etc/ld.so.cache")
    if agent.sh("echo still").stdout.strip() != "still":
        return "the agent stopped answering once python3 was removed"
    return None


@contextlib.contextmanager
def host_listeners() -> Iterator[tuple[int, list[str]]]:
    """A TCP listener on every host address (port, addresses) for reachability probes."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", 0))  # noqa: S104 - the probe checks it is NOT reachable
    sock.listen(16)
    port = sock.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = sock.accept()
                conn.sendall(b"host\n")
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port, host_ipv4_addresses()
    finally:
        stop.set()
        thread.join(2)
        sock.close()


def host_ipv4_addresses() -> list[str]:
    import subprocess

    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=False
    ).stdout
    return sorted(
        {line.split()[3].split("/")[0] for line in out.splitlines() if len(line.split()) > 3}
    )


def unreachable(agent: AgentClient, targets: list[tuple[str, int]]) -> str | None:
    """None when no target accepts a TCP connection from inside the sandbox.

    The attempts run side by side, each for at most 3 s: a class that drops
    such packets (gVisor's netstack) makes each one wait its whole timeout,
    which one after another would add up."""
    attempts = [
        f"(timeout 3 bash -c {shlex.quote(f'exec 3<>/dev/tcp/{host}/{port}')} 2>/dev/null"
        f" && echo {shlex.quote(f'reached {host}:{port}')}) &"
        for host, port in targets
    ]
    result = agent.exec(["bash", "-c", " ".join([*attempts, "wait"])], timeout_ms=20_000)
    if result.exit_code != 0:
        return f"the probe failed ({result.exit_code}): {result.stderr.strip()[:200]}"
    reached = sorted(line.removeprefix("reached ") for line in result.stdout.split("\n") if line)
    return f"reached {', '.join(reached)}" if reached else None


def outbound(agent: AgentClient, url: str, hint: str = "") -> str | None:
    result = agent.exec(
        ["curl", "-sS", "-o", "/dev/null", "-m", "15", "-w", "%{http_code}", url], timeout_ms=30_000
    )
    if result.exit_code != 0:
        return f"curl {url} failed: {result.stderr.strip()[:200]}" + (f"; {hint}" if hint else "")
    return None


#: Run inside a sandbox (as root, on the image's python3) with the decoy's
#: allowed and refused addresses: each bypass of an egress policy tried side by
#: side, and what the sandbox saw (``connected``/``answered``/``sent`` or the
#: error), as a JSON object. Judged with what reached the decoy (its witness).
BYPASS_ATTEMPTS = r"""
import errno, json, os, socket, struct, sys, threading
allowed, refused, ipv6 = sys.argv[1], sys.argv[2], sys.argv[3]
QUERY = bytes.fromhex("123401000001000000000000076578616d706c6503636f6d0000010001")
out = {}

def tcp(host, port, send=b""):
    with socket.create_connection((host, port), timeout=4) as s:
        s.settimeout(4)
        s.sendall(send)
        return "connected" if s.recv(100) else "closed"

def udp(host, port, payload, proto=0):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM, proto) as s:
        s.settimeout(4)
        s.sendto(payload, (host, port))
        try:
            s.recv(4096)
            return "answered"
        except socket.timeout:
            return "sent"

def ping():
    echo = struct.pack("!BBHHH", 8, 0, 0, os.getpid() & 0xFFFF, 1) + b"podbay-bypass"
    padded = echo + b"\0" * (len(echo) % 2)
    total = sum(struct.unpack("!%dH" % (len(padded) // 2), padded))
    total = (total >> 16) + (total & 0xFFFF)
    echo = echo[:2] + struct.pack("!H", ~(total + (total >> 16)) & 0xFFFF) + echo[4:]
    try:
        s, raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP), False
    except OSError:
        s, raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), True
    with s:
        s.settimeout(4)
        s.sendto(echo, (allowed, 0))
        # A raw socket gets every ICMP message (an error from a gateway too):
        # only an echo reply from the address is an answer.
        while True:
            try:
                data, peer = s.recvfrom(4096)
            except socket.timeout:
                return "sent"
            if raw:
                data = data[(data[0] & 0x0F) * 4:]
            if peer[0] == allowed and data[:1] == b"\0":
                return "answered"
            if data[:1] == b"\3":
                return "unreachable"

def raw(proto):
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, proto) as s:
        s.sendto(b"\0" * 24, (allowed, 0))
        return "sent"

def sctp():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, 132) as s:
        s.settimeout(4)
        s.connect((allowed, 443))
        return "connected"

attempts = {
    "control": lambda: tcp(allowed, 443),
    "direct": lambda: tcp(refused, 443),
    "dns_udp": lambda: udp(allowed, 53, QUERY),
    "dns_tcp": lambda: tcp(allowed, 53, struct.pack("!H", len(QUERY)) + QUERY),
    "dot": lambda: tcp(allowed, 853),
    "doq": lambda: udp(allowed, 853, QUERY),
    "icmp": ping,
    "gre": lambda: raw(47),
    "sctp": sctp,
    "udplite": lambda: udp(allowed, 9, b"podbay-bypass", 136),
    "ipv6_tcp": lambda: tcp(ipv6, 443),
    "ipv6_udp": lambda: udp(ipv6, 53, QUERY),
}

def run(name):
    try:
        out[name] = attempts[name]()
    except socket.timeout:
        out[name] = "timeout"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__
    except Exception as e:
        out[name] = "failed: %s: %s" % (type(e).__name__, e)

threads = [threading.Thread(target=run, args=(n,)) for n in attempts]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(out))
"""

#: The bypasses an egress policy that is not open must hold: name → what it is.
BYPASSES: dict[str, str] = {
    "direct": "direct connection to an address no allowed name gave",
    "dns_udp": "DNS over UDP to another resolver (an allowed address)",
    "dns_tcp": "DNS over TCP to another resolver (an allowed address)",
    "dot": "DNS over TLS or QUIC (port 853) to an allowed address",
    "icmp": "ICMP echo (ping tunnels) to an allowed address",
    "other": "other IP protocols (GRE, SCTP, UDP-Lite) to an allowed address",
    "ipv6": "IPv6 (TCP and UDP to the decoy's IPv6 address, which the host reaches)",
}
#: Which in-sandbox attempts (of BYPASS_ATTEMPTS) and witness counters judge each.
_JUDGED_BY: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "direct": (("direct",), ("https_1",)),
    "dns_udp": (("dns_udp",), ("dns_udp",)),
    "dns_tcp": (("dns_tcp",), ("dns_tcp",)),
    "dot": (("dot", "doq"), ("dot",)),
    "icmp": (("icmp",), ("icmp", "udp_echo")),
    "other": (("gre", "sctp", "udplite"), ("other",)),
    "ipv6": (("ipv6_tcp", "ipv6_udp"), ("ipv6",)),
}


@dataclass(frozen=True)
class BypassOutcome:
    #: Whether the decoy's allowed address answered a plain TCP connection (a
    #: probe that reaches nothing at all proves nothing).
    control: str
    #: Each of :data:`BYPASSES` → ``None`` when held, else what got through.
    reached: dict[str, str | None]
    #: What the sandbox saw of each attempt.
    seen: dict[str, str]


def egress_bypasses(
    agent: AgentClient,
    allowed: str,
    refused: str,
    ipv6: str,
    arrived: Callable[[], dict[str, int]],
    reset: Callable[[], None],
) -> BypassOutcome:
    """Each bypass tried from inside the sandbox against the decoy (its
    ``allowed`` and ``refused`` addresses, and ``ipv6``), under whatever
    policy the sandbox has now, judged by what the sandbox saw *and* what
    ``arrived`` at the decoy (its witness's counters since ``reset``)."""
    reset()
    argv = ["python3", "-c", BYPASS_ATTEMPTS, allowed, refused, ipv6]
    result = agent.exec(argv, timeout_ms=60_000)
    if result.exit_code != 0:
        raise RuntimeError(f"the bypass script failed: {result.stderr.strip()[-300:]}")
    seen = {str(k): str(v) for k, v in json.loads(result.stdout).items()}
    counts = arrived()
    through = {"connected", "answered"}
    reached: dict[str, str | None] = {}
    for name, (attempts, counters) in _JUDGED_BY.items():
        saw = [f"{a}: {seen[a]}" for a in attempts if seen.get(a) in through]
        got = [f"{counts[c]} packets arrived ({c})" for c in counters if counts.get(c, 0)]
        reached[name] = "; ".join(saw + got) or None
    return BypassOutcome(seen.get("control", "?"), reached, seen)
