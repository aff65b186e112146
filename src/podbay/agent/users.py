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
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode


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
    import pwd  # only when a user is asked for: keeps start-up lean

    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError, OverflowError):
        raise ApiError(
            ErrorCode.USER_UNKNOWN, f"user {name!r} is not an account of this sandbox"
        ) from None
    try:
        groups = tuple(g for g in os.getgrouplist(entry.pw_name, entry.pw_gid))
    except OSError:
        groups = (entry.pw_gid,)
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir or "/", groups)


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
        raise ApiError(ErrorCode.INTERNAL, f"cannot act as uid {uid} for this file call")


@contextlib.contextmanager
def acting_as(account: Account) -> Iterator[None]:
    """Run the block with this thread's filesystem ids set to ``account``'s."""
    if account.is_root:
        yield
        return
    _set_fs_ids(account.uid, account.gid)
    try:
        yield
    finally:
        _set_fs_ids(0, 0)
