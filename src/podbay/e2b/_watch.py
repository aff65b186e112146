"""A directory watcher, run INSIDE the sandbox by ``python3 -c`` (as the
caller's user) for envd's WatchDir and CreateWatcher.

Not imported by podbay: ``podbay.e2b.watchers`` spawns this file's source
through the agent with the directory and ``1`` (recursive) or ``0``, and reads
its stdout, one JSON object a line: first ``{"ready": true}`` once the watches
are in place (or ``{"error": <Connect code>, "message": ...}`` and exit 1),
then ``{"name": <path relative to the directory>, "type": <kind>}`` per event.
Events come from inotify (Linux's, or gVisor's own for changes made in the
sandbox), named as envd's fsnotify names them: create (IN_CREATE, and the new
name of a rename), write (IN_MODIFY), remove (IN_DELETE), rename (the old
name), chmod (IN_ATTRIB). Recursive watching adds a watch for each directory
below, and for each one made later (before its create event is written: what
is made in it after a client saw that event is seen), up to ``MAX_WATCHES``. Symlinks are not
followed; a directory the user may not read is not watched (Linux refuses it,
and gVisor would not). Standard library only (any Python 3.8+).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import struct
import sys

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_IGNORED = 0x8000
IN_ISDIR = 0x40000000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_CLOEXEC = 0o2000000
WATCHED = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
WATCHED |= IN_DELETE_SELF
KINDS = (
    (IN_CREATE | IN_MOVED_TO, "create"),
    (IN_MODIFY, "write"),
    (IN_DELETE, "remove"),
    (IN_MOVED_FROM, "rename"),
    (IN_ATTRIB, "chmod"),
)
#: Directories one recursive watcher watches at most (each costs a kernel watch).
MAX_WATCHES = 8192
HEADER = struct.Struct("iIII")
CODES = {
    errno.ENOENT: "not_found",
    errno.ENOTDIR: "invalid_argument",
    errno.EACCES: "permission_denied",
}


def emit(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> int:
    root, recursive = sys.argv[1], sys.argv[2] == "1"
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(IN_CLOEXEC)
    if fd < 0:
        emit({"error": "internal", "message": os.strerror(ctypes.get_errno())})
        return 1
    watches: dict[int, str] = {}

    def add(rel: str) -> int:
        if len(watches) >= MAX_WATCHES:
            return 0
        path = os.path.join(root, rel) if rel else root
        # Linux asks for read permission on what is watched; gVisor does not
        # check it, so the check is made here: the names in a directory the
        # user may not list are never reported to it, in any class.
        if not os.access(path, os.R_OK, follow_symlinks=False) and os.path.isdir(path):
            return errno.EACCES
        wd = libc.inotify_add_watch(fd, os.fsencode(path), WATCHED | IN_ONLYDIR | IN_DONT_FOLLOW)
        if wd >= 0:
            watches[wd] = rel
            return 0
        return ctypes.get_errno()

    def add_tree(rel: str) -> None:
        top = os.path.join(root, rel) if rel else root
        for directory, subdirs, _ in os.walk(top):
            for name in subdirs:
                add(os.path.relpath(os.path.join(directory, name), root))

    failed = add("")
    if failed:
        message = f"path {root}: {os.strerror(failed)}"
        if failed == errno.ENOTDIR:
            message = f"path {root} is not a directory"
        emit({"error": CODES.get(failed, "internal"), "message": message})
        return 1
    if recursive:
        add_tree("")
    emit({"ready": True})
    while True:
        data = os.read(fd, 64 * 1024)
        offset = 0
        while offset + HEADER.size <= len(data):
            wd, mask, _, length = HEADER.unpack_from(data, offset)
            raw = data[offset + HEADER.size : offset + HEADER.size + length].rstrip(b"\0")
            offset += HEADER.size + length
            if mask & IN_IGNORED:
                watches.pop(wd, None)
                if not watches:  # the directory itself is gone
                    return 0
                continue
            if wd not in watches or not raw:
                continue
            name = raw.decode("utf-8", "replace")
            rel = os.path.join(watches[wd], name) if watches[wd] else name
            # A new directory is watched before its event is told, so a client
            # that saw it created sees what is then made in it.
            if recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
                add(rel)
                add_tree(rel)
            for bits, kind in KINDS:
                if mask & bits:
                    emit({"name": rel, "type": kind})


if __name__ == "__main__":
    sys.exit(main())
