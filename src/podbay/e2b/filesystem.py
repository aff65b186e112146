"""envd's filesystem service on the agent's files API (``/v1/files…``): Stat,
ListDir (with depth), MakeDir, Move and Remove. The entries are envd's
``EntryInfo`` in proto3 JSON; refusals are Connect codes the SDK maps to its
exceptions (``not_found`` → ``FileNotFoundException``, ``already_exists`` →
``make_dir`` answering False).

What the agent does not report: a symlink's target (``symlinkTarget`` is
absent, ``type`` is ``FILE_TYPE_SYMLINK`` as older envd gives it), the owner
of listed entries (Stat has it), and group names (``group`` is the gid).
"""

from __future__ import annotations

import stat
from typing import Any

from starlette.requests import Request

from podbay.control.services.sandboxes import Attached
from podbay.wire.paths import FILES, FILES_LIST, FILES_MKDIR, FILES_MOVE, FILES_STAT

from . import connect
from .relay import call, in_home, service_of, unary, user_of

#: How deep ListDir goes at most (envd's depth is a uint32; each level is a call).
MAX_DEPTH = 32
#: How many entries one ListDir answers at most, whatever the depth.
MAX_ENTRIES = 100_000
_TYPES = {
    "file": "FILE_TYPE_FILE",
    "directory": "FILE_TYPE_DIRECTORY",
    "symlink": "FILE_TYPE_SYMLINK",
}
_MODE_BITS = {"file": stat.S_IFREG, "directory": stat.S_IFDIR, "symlink": stat.S_IFLNK}


async def _call(request: Request, attached: Attached, method: str, path: str, **kw: Any) -> Any:
    params: dict[str, str] = kw.pop("params", {})
    params["user"] = user_of(request)
    answer = await call(service_of(request), attached, method, path, params=params, **kw)
    return answer.json() if answer.content else None


def _path(request: Request, message: dict[str, Any], name: str = "path") -> str:
    value = message.get(name)
    if not isinstance(value, str) or not value:
        raise connect.ConnectError("invalid_argument", f"{name} is required")
    return in_home(user_of(request), value)


def entry(info: dict[str, Any]) -> dict[str, Any]:
    """podbay's ``FileInfo`` as envd's ``EntryInfo``."""
    kind = str(info["type"])
    mode = int(info["mode"])
    out: dict[str, Any] = {
        "name": info["name"],
        "type": _TYPES.get(kind, "FILE_TYPE_UNSPECIFIED"),
        "path": info["path"],
        "size": str(info["size"]),  # int64: a string in proto3 JSON
        "mode": mode,
        "permissions": stat.filemode(_MODE_BITS.get(kind, 0) | mode),
        "modifiedTime": info["mtime"],
    }
    if info.get("owner") is not None:
        out["owner"] = info["owner"]
    if info.get("gid") is not None:
        out["group"] = str(info["gid"])
    return out


async def _stat(request: Request, attached: Attached, message: dict[str, Any]) -> dict[str, Any]:
    params = {"path": _path(request, message), "owner": "true"}
    return {"entry": entry(await _call(request, attached, "GET", FILES_STAT, params=params))}


async def _list_dir(
    request: Request, attached: Attached, message: dict[str, Any]
) -> dict[str, Any]:
    depth = message.get("depth") or 1
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        raise connect.ConnectError("invalid_argument", "depth must be at least 1")
    depth = min(depth, MAX_DEPTH)
    entries: list[dict[str, Any]] = []
    level = [_path(request, message)]
    for _ in range(depth):
        below: list[str] = []
        for directory in level:
            listed = await _call(request, attached, "GET", FILES_LIST, params={"path": directory})
            for info in listed["entries"]:
                entries.append(entry(info))
                if info["type"] == "directory":  # symlinks are not followed: no cycles
                    below.append(info["path"])
            if len(entries) > MAX_ENTRIES:
                raise connect.ConnectError(
                    "resource_exhausted", f"more than {MAX_ENTRIES} entries: list less deep"
                )
        level = below
    return {"entries": entries}


async def _make_dir(
    request: Request, attached: Attached, message: dict[str, Any]
) -> dict[str, Any]:
    """envd creates the parents too, and answers ``already_exists`` for an
    existing path (the SDK's ``make_dir`` then returns False)."""
    path = _path(request, message)
    try:
        made = await _call(
            request, attached, "POST", FILES_MKDIR, json={"path": path, "parents": False}
        )
    except connect.ConnectError as exc:
        if exc.code != "not_found":
            raise
        made = await _call(
            request, attached, "POST", FILES_MKDIR, json={"path": path, "parents": True}
        )
    return {"entry": entry(made)}


async def _move(request: Request, attached: Attached, message: dict[str, Any]) -> dict[str, Any]:
    body = {
        "source": _path(request, message, "source"),
        "destination": _path(request, message, "destination"),
        "overwrite": True,  # envd renames as rename(2) does: a file there is replaced
    }
    return {"entry": entry(await _call(request, attached, "POST", FILES_MOVE, json=body))}


async def _remove(request: Request, attached: Attached, message: dict[str, Any]) -> dict[str, Any]:
    params = {"path": _path(request, message), "recursive": "true"}
    await _call(request, attached, "DELETE", FILES, params=params)
    return {}


stat_rpc = unary(_stat)
list_dir = unary(_list_dir)
make_dir = unary(_make_dir)
move = unary(_move)
remove = unary(_remove)
