"""Kill a command's whole tree, or every process in the sandbox but the agent.

A process group is not a tree: any descendant may call ``setsid()`` and
leave it (a fork bomb that does so outlives a ``killpg``). A command's tree
here is its process group, its session, and every descendant of a member,
read from ``/proc``. Members are stopped first (``SIGSTOP`` cannot be caught)
and the tree is read again until no new member appears: a stopped process
neither forks nor exits, so its children stay attached to it and lineage is
not lost to re-parenting. Then every member gets ``SIGKILL``.

As the sandbox's init (PID 1), :func:`kill_all_but_self` uses ``kill(-1,
SIGKILL)``, which Linux delivers to every other process of the pid
namespace at once (a process forking concurrently either is killed or never
forks); gVisor does not, so it is sent again until no other process is
left. Outside a sandbox (tests, local debugging) it takes the trees of the
agent's own descendants instead: ``kill(-1)`` there would reach the host.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterable, Iterator

Table = dict[int, tuple[int, int, int]]

#: Re-reads of /proc while stopping a tree; a tree that still grows after
#: this many (it cannot, once stopped) is killed as found.
MAX_ROUNDS = 50


def _stats() -> Iterator[tuple[int, list[bytes]]]:
    """Every live process: its pid and the fields of its ``stat`` after its name
    (state, parent, process group, session, ...). Zombies are left out."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        if fields[0] not in (b"Z", b"X"):
            yield int(name), fields


def _table() -> Table:
    """Every live process: pid → (parent, process group, session)."""
    return {pid: (int(f[1]), int(f[2]), int(f[3])) for pid, f in _stats()}


def _others() -> dict[int, bytes]:
    """Every live process but the sandbox's init: pid → its state letter."""
    return {pid: fields[0] for pid, fields in _stats() if pid != 1}


def _all_stopped(others: dict[int, bytes]) -> bool:
    return all(state in (b"T", b"t") for state in others.values())


def _none_left(others: dict[int, bytes]) -> bool:
    return not others


def _descendants(roots: Iterable[int], table: Table) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    todo = [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(children.get(pid, ()))
    return seen


def _signal(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def kill_tree(leader: int) -> int:
    """SIGKILL the tree of the command ``leader`` (which leads its own session
    and group, see :mod:`.launch`); the number of processes killed."""
    me = os.getpid()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signal.SIGSTOP)  # the whole group at once, forks included

    def members(table: Table) -> set[int]:
        roots = {
            pid
            for pid, (_, group, session) in table.items()
            if pid == leader or group == leader or session == leader
        }
        return _descendants(roots, table)

    killed = _stop_all(members)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signal.SIGKILL)
    killed.discard(me)
    return len(killed)


def kill_all_but_self() -> int:
    """SIGKILL every other process of the sandbox (or, outside one, every
    descendant of this process); the number of processes there were."""
    me = os.getpid()
    if me == 1:
        count = sum(1 for pid in _table() if pid != 1)
        # gVisor's kill(-1) walks its processes one by one: one forking meanwhile
        # leaves a child it never reaches (a fork bomb at its limit refills each
        # freed slot at once). So everyone is stopped first, again until no one
        # runs (a stopped process cannot fork), then killed, again until none is
        # left; under Linux each takes one round.
        for signum, done in ((signal.SIGSTOP, _all_stopped), (signal.SIGKILL, _none_left)):
            for _ in range(MAX_ROUNDS):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(-1, signum)
                if done(_others()):
                    break
        return count

    def members(table: Table) -> set[int]:
        return _descendants([me], table) - {me}

    return len(_stop_all(members))


def _stop_all(members: Callable[[Table], set[int]]) -> set[int]:
    """Stop what ``members(table)`` names until it stops growing, then kill it."""
    me = os.getpid()
    stopped: set[int] = set()
    for _ in range(MAX_ROUNDS):
        found = members(_table()) - {me, 1}
        new = found - stopped
        if not new:
            break
        _signal(new, signal.SIGSTOP)
        stopped |= new
    _signal(stopped, signal.SIGKILL)
    return stopped
