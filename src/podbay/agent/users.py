"""Accounts a command or a file call may run as (``user`` on the wire).

A name or a numeric uid of the sandbox's ``/etc/passwd``; absent means the
default user (root unless the operator set another, sent by the gateway in
:data:`~podbay.wire.paths.DEFAULT_USER_HEADER`).

Commands run as the account through ``Popen(user=, group=, extra_groups=)``.
File calls run in the agent's own (per-connection) thread with that
thread's *filesystem* ids switched (``setfsuid``/``setfsgid``, which Linux
keeps per thread), so the kernel checks permissions exactly as for that user
and new files are owned by it; switching away from uid 0 also drops the
thread's file capabilities, and switching back restores them.

Accounts are read from ``/etc/passwd`` and ``/etc/group`` by this module, not
through the C library's ``getpwnam``: that follows the sandbox's
``/etc/nsswitch.conf`` and loads the ``libnss_*`` module it names, found in
the sandbox's own library directories, so sandbox root could have had its code
run inside the agent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode

from . import guard


@dataclass(frozen=True)
class Account:
    """An account commands run as: its name, ids, home and groups."""

    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...] = ()

    @property
    def is_root(self) -> bool:
        return self.uid == 0


ROOT = Account("root", 0, 0, "/root")


def resolve(requested: str | None, default: str | None = None) -> Account:
    """The account ``requested`` (else ``default``, else root) names."""
    name = requested if requested is not None else default
    if name is None or name in ("", "root", "0"):
        return ROOT
    entry = _find(_table(PASSWD), 2 if _id(name) else 0, name)
    if entry is None or not (_id(entry[2]) and _id(entry[3])):
        raise ApiError(ErrorCode.USER_UNKNOWN, f"user {name!r} is not an account of this sandbox")
    login, uid, gid, home = entry[0], int(entry[2]), int(entry[3]), entry[5] or "/"
    groups = [gid]
    for group in _table(GROUP):
        member = len(group) >= 4 and _id(group[2]) and login in group[3].split(",")
        if member and int(group[2]) not in groups:
            groups.append(int(group[2]))
    return Account(login, uid, gid, home, tuple(groups))


def name_of(uid: int) -> str | None:
    """The name ``/etc/passwd`` gives ``uid``, if any."""
    entry = _find(_table(PASSWD), 2, str(uid))
    return None if entry is None else entry[0]


PASSWD = "/etc/passwd"
GROUP = "/etc/group"
#: Read no more of either: they are the sandbox's, and may be anything.
TABLE_BYTES = 4 << 20


def _id(text: str) -> bool:
    """A uid or gid the kernel takes (``-1``, 4294967295, means "unchanged")."""
    return text.isascii() and text.isdigit() and int(text) < 0xFFFFFFFF


def _table(path: str) -> list[list[str]]:
    """The colon-separated rows of ``path`` (none if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            text = f.read(TABLE_BYTES).decode("utf-8", "replace")
    except OSError:
        return []
    return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]


def _find(rows: list[list[str]], by: int, wanted: str) -> list[str] | None:
    """The first passwd row whose name (``by`` 0) or uid (``by`` 2) is ``wanted``.

    A uid is compared as a number (``0042`` is 42); rows of other shapes are skipped.
    """
    for row in rows:
        if len(row) < 7:
            continue
        if by == 0 and row[0] == wanted and row[0]:
            return row
        if by == 2 and _id(row[2]) and _id(wanted) and int(row[2]) == int(wanted):
            return row
    return None


def command_identity(
    account: Account, env: dict[str, str]
) -> tuple[int | None, int | None, list[int] | None]:
    """``Popen``'s ``user``, ``group`` and ``extra_groups`` to run as ``account``
    (all None for root); ``env`` gets its ``HOME``, ``USER`` and ``LOGNAME``."""
    if account.is_root:
        return None, None, None
    if env.get("HOME") in (None, "/root"):  # a HOME the request set stays
        env["HOME"] = account.home
    env["USER"] = env["LOGNAME"] = account.name
    return account.uid, account.gid, list(account.groups)


_libc = None


def _set_fs_ids(uid: int, gid: int) -> None:
    global _libc
    if _libc is None:
        import ctypes  # only when a file call names a user

        _libc = ctypes.CDLL(None, use_errno=True)
    # setfsgid first: once fsuid is not 0 the thread may no longer change its gid.
    _libc.setfsgid(gid)
    _libc.setfsuid(uid)
    if _libc.setfsuid(-1) != uid or _libc.setfsgid(-1) != gid:
        raise ApiError(ErrorCode.PATH_ACCESS_DENIED, f"cannot act as uid {uid} for this file call")


@contextlib.contextmanager
def acting_as(account: Account) -> Iterator[None]:
    """Run the block with this thread's filesystem ids set to ``account``'s
    (under the guard, gVisor: its effective ids, :func:`guard.acting_as`)."""
    if account.is_root:
        yield
        return
    if guard.active():
        with contextlib.ExitStack() as switched:
            try:
                switched.enter_context(guard.acting_as(account.uid, account.gid, account.groups))
            except OSError as exc:
                raise ApiError(
                    ErrorCode.PATH_ACCESS_DENIED, f"cannot act as uid {account.uid} here: {exc}"
                ) from None
            yield
        return
    _set_fs_ids(account.uid, account.gid)
    try:
        yield
    finally:
        _set_fs_ids(0, 0)
