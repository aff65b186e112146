"""Native files: streamed reads and writes checked by SHA-256, stat, list,
delete, mkdir (the ``files`` feature).

Bytes travel as they are (no base64) and never all at once: a read hashes
the file in a first pass, sends the digest and length in the headers, then
streams it in a second pass, re-hashing as it goes and holding back the last
chunk until the digests agree. If the file changed between the passes the
connection is cut rather than finishing a body that does not match its
digest. Files up to 1 MiB are kept from the first pass instead (one read, and
``/proc`` files that change on every read still match their digest).

A reader that asks with ``X-Podbay-Sha256: trailing`` (as a writer may send
it) gets a larger file in one pass instead: the bytes as they are read and
hashed, then their hex digest as the body's last 64 bytes, answered with
``X-Podbay-Sha256: trailing``. A file that changes meanwhile (its size, its
modification or change time) has its connection cut, as between two passes.
Old readers, which do not ask, get the two passes; an old agent ignores the
request and answers with the digest first, which readers still take.

A write streams the body into a temporary file beside the target, checks
the writer's digest, and only then renames it into place: readers see the
old content or the new, never a mix, and a mismatch leaves the old content
untouched. The body goes from the socket into one buffer and from there to
the hash and the file, in one pass and without further copies. The
writer's digest comes in ``X-Podbay-Sha256``, or, with the value
``trailing``, as the body's last 64 bytes, after the content: then the
writer too hashes in the same pass as it sends.

Paths are the sandbox's own: absolute, or relative to the workspace. The
agent is root in its sandbox and the sandbox is the boundary, so ``..`` is
resolved by the kernel like any other component, not refused. Reads and
writes follow symlinks (writing through a symlink replaces its target and
keeps the link); stat, list entries and delete do not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import stat
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode
from podbay.wire.data import (
    ChmodRequest,
    DirListing,
    FileInfo,
    FileType,
    MakeDirRequest,
    MoveRequest,
)
from podbay.wire.paths import DIGEST_HEX_LENGTH, DIGEST_TRAILING

from . import guard, users
from .http import Aborted
from .refusal import path_refusal, read_refusal

CHUNK = 256 * 1024
#: A write's buffer: the socket fills it, the hash and the file read from it.
WRITE_BUFFER = 1024 * 1024
#: Files up to this size are kept in memory from the first pass and sent from
#: there: one read, and content that changes on every read (``/proc``) still
#: matches its digest.
SMALL_FILE = 1024 * 1024
DEFAULT_FILE_MODE = 0o644
#: A file replaced by a write is freed off the answer's path from this size on.
LARGE_REPLACED = 8 * 1024 * 1024
DEFAULT_DIR_MODE = 0o755
_HEX = frozenset("0123456789abcdef")


def _file_type(mode: int) -> FileType:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def parse_digest(value: str | None) -> str:
    """The writer's hex SHA-256, lower-cased, or ``trailing`` (it follows the
    content); refused when absent or malformed."""
    if value is None or not value.strip():
        raise ApiError(
            ErrorCode.DIGEST_MISSING, "a write must carry the content's SHA-256 in X-Podbay-Sha256"
        )
    digest = value.strip().lower()
    if digest == DIGEST_TRAILING:
        return digest
    if len(digest) != 64 or not set(digest) <= _HEX:
        raise ApiError(ErrorCode.REQUEST_INVALID, "X-Podbay-Sha256 must be 64 hex digits")
    return digest


def parse_mode(value: str | None) -> int | None:
    """Octal permission bits (``0755``, ``644``); None when absent.

    >>> parse_mode("0755"), parse_mode(None)
    (493, None)
    """
    if value is None:
        return None
    text = value.strip()
    if not text or len(text) > 5 or any(c not in "01234567" for c in text):
        raise ApiError(ErrorCode.REQUEST_INVALID, "X-Podbay-Mode must be octal bits like 0644")
    return int(text, 8)


def check_mode(mode: int) -> int:
    if not 0 <= mode <= 0o7777:
        raise ApiError(ErrorCode.REQUEST_INVALID, "mode must be permission bits (0 to 0o7777)")
    return mode


class FileStream:
    """The second pass of a read: chunks of exactly ``length`` bytes whose
    SHA-256 is ``digest``, or :class:`~podbay.agent.http.Aborted`."""

    def __init__(self, fd: int, length: int, digest: str) -> None:
        self.fd = fd
        self.length = length
        self.digest = digest
        #: The whole content, when the file was small enough to keep from the
        #: first pass (then there is no second pass to go wrong).
        self.data: bytes | None = None

    def __iter__(self) -> Iterator[bytes]:
        import hashlib

        if self.data is not None:
            yield self.data
            return
        if self.digest == DIGEST_TRAILING:
            yield from self._one_pass()
            return
        try:
            os.lseek(self.fd, 0, os.SEEK_SET)
            hasher = hashlib.sha256()
            left = self.length
            pending = b""
            while left:
                chunk = os.read(self.fd, min(CHUNK, left))
                if not chunk:
                    raise Aborted("the file shrank while it was being sent")
                hasher.update(chunk)
                left -= len(chunk)
                if pending:
                    yield pending
                pending = chunk
            if hasher.hexdigest() != self.digest:
                raise Aborted("the file changed while it was being sent")
            if pending:
                yield pending
        finally:
            self.close()

    def _one_pass(self) -> Iterator[bytes]:
        """The bytes as read and hashed, then their hex digest (``trailing``)."""
        try:
            before = _version(os.fstat(self.fd))
            hasher = _sha256()
            left = self.length
            while left:
                chunk = os.read(self.fd, min(CHUNK, left))
                if not chunk:
                    raise Aborted("the file shrank while it was being sent")
                hasher.update(chunk)
                left -= len(chunk)
                yield chunk
            if _version(os.fstat(self.fd)) != before:
                raise Aborted("the file changed while it was being sent")
            yield hasher.hexdigest().encode("ascii")
        finally:
            self.close()

    @property
    def body_length(self) -> int:
        """The answer's length: the file's, and the trailing digest's."""
        return self.length + (DIGEST_HEX_LENGTH if self.digest == DIGEST_TRAILING else 0)

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


def _version(st: os.stat_result) -> tuple[int, int, int]:
    """What a write to the file changes: its size, modification and change time."""
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


class Files:
    """File operations on the sandbox's filesystem, relative to ``workspace``."""

    def __init__(self, workspace: str) -> None:
        self.workspace = workspace

    # -- paths ---------------------------------------------------------------
    def resolve(self, raw: str | None) -> tuple[str, str]:
        """``(path to use, path to show)`` for a request's ``path``."""
        if raw is None or raw == "":
            raise ApiError(ErrorCode.PATH_INVALID, "path is required and must not be empty")
        if "\0" in raw:
            raise ApiError(ErrorCode.PATH_INVALID, "path must not contain NUL characters")
        path = os.path.join(self.workspace, raw)
        return path, os.path.normpath(path)

    def info(self, path: str, shown: str, *, follow: bool = False) -> FileInfo:
        try:
            st = os.stat(path) if follow else os.lstat(path)
        except OSError as exc:
            raise path_refusal(exc, shown) from None
        return _info(st, shown)

    # -- operations ----------------------------------------------------------
    def stat(self, raw: str | None, owner: bool = False) -> FileInfo:
        path, shown = self.resolve(raw)
        info = self.info(path, shown)
        if not owner:
            return info
        st = os.lstat(path)
        return dataclasses.replace(info, uid=st.st_uid, gid=st.st_gid, owner=_user_name(st.st_uid))

    def chmod(self, req: ChmodRequest) -> FileInfo:
        path, shown = self.resolve(req.path)
        try:
            os.chmod(path, check_mode(req.mode))
        except OSError as exc:
            raise path_refusal(exc, shown) from None
        return self.info(path, shown, follow=True)

    def move(self, req: MoveRequest) -> FileInfo:
        """Rename ``source`` to ``destination`` (same filesystem, atomic); an
        existing destination is replaced only with ``overwrite`` (never a
        non-empty directory)."""
        source, shown_source = self.resolve(req.source)
        dest, shown = self.resolve(req.destination)
        try:
            os.lstat(source)
        except OSError as exc:
            raise path_refusal(exc, shown_source) from None
        if not req.overwrite and os.path.lexists(dest):
            raise ApiError(ErrorCode.PATH_EXISTS, f"{shown} already exists")
        _make_parents(os.path.dirname(dest), shown)
        try:
            os.rename(source, dest)
        except OSError as exc:
            if exc.errno == 18:  # EXDEV
                raise ApiError(
                    ErrorCode.PATH_INVALID,
                    f"{shown_source} and {shown} are on different filesystems; copy, then delete",
                ) from None
            raise path_refusal(exc, shown) from None
        return self.info(dest, shown)

    def list(self, raw: str | None) -> DirListing:
        path, shown = self.resolve(raw)
        entries = []
        try:
            with os.scandir(path) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed while listing
                    entries.append(_info(st, os.path.join(shown, entry.name)))
        except OSError as exc:
            raise path_refusal(exc, shown) from None
        entries.sort(key=lambda e: e.name)
        return DirListing(path=shown, entries=entries)

    def open_read(self, raw: str | None, *, trailing: bool = False) -> FileStream:
        """Hash the file (first pass) and return the stream for the second;
        ``trailing``: a file larger than :data:`SMALL_FILE` is not read here,
        its stream hashes as it sends and ends with the digest."""
        path, shown = self.resolve(raw)
        try:
            # O_NONBLOCK: opening a FIFO must not hang; it is refused below.
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:  # gVisor's /dev/tty with no terminal behind it: EIO
            raise read_refusal(exc, shown) from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise ApiError(ErrorCode.PATH_IS_DIRECTORY, f"{shown} is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise ApiError(ErrorCode.PATH_INVALID, f"{shown} is not a regular file")
            os.set_blocking(fd, True)
            if trailing and st.st_size > SMALL_FILE:
                return FileStream(fd, st.st_size, DIGEST_TRAILING)
            hasher = _sha256()
            length = 0
            kept: list[bytes] | None = []
            while chunk := os.read(fd, CHUNK):
                hasher.update(chunk)
                length += len(chunk)
                if kept is not None:
                    kept.append(chunk)
                    if length > SMALL_FILE:
                        kept = None  # too big to hold: a second pass will stream it
        except OSError as exc:
            os.close(fd)
            raise read_refusal(exc, shown) from None
        except BaseException:
            os.close(fd)
            raise
        stream = FileStream(fd, length, hasher.hexdigest())
        if kept is not None:
            stream.data = b"".join(kept)
            stream.close()
        return stream

    def write(
        self,
        raw: str | None,
        readinto: Callable[[memoryview], int],
        digest: str,
        mode: int | None,
        length: int | None = None,
    ) -> FileInfo:
        """Stream the body (``readinto``, ``length`` bytes when known) into place
        atomically once its SHA-256 is ``digest`` (or, for ``trailing``, the
        body's last 64 bytes)."""
        path, shown = self.resolve(raw)
        if path.endswith("/"):
            raise ApiError(ErrorCode.PATH_INVALID, f"{shown}: a file path cannot end with '/'")
        # Writing through a symlink replaces its target and keeps the link.
        target = os.path.realpath(path) if os.path.islink(path) else path
        try:
            old: os.stat_result | None = os.stat(target)
        except FileNotFoundError:
            old = None
        except OSError as exc:
            raise path_refusal(exc, shown) from None
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise ApiError(ErrorCode.PATH_IS_DIRECTORY, f"{shown} is a directory")
        parent, name = os.path.split(target)
        _make_parents(parent, shown)
        temp = os.path.join(parent, f".{name}.podbay-{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise path_refusal(exc, shown) from None
        try:
            if length:
                _reserve(fd, length - (DIGEST_HEX_LENGTH if digest == DIGEST_TRAILING else 0))
            hasher = _sha256()
            digest = _receive(readinto, fd, hasher, digest, shown)
            if hasher.hexdigest() != digest:
                raise ApiError(
                    ErrorCode.DIGEST_MISMATCH,
                    f"{shown}: the content's SHA-256 is {hasher.hexdigest()}, "
                    f"not {digest}; nothing was written",
                )
            if old is not None:
                with contextlib.suppress(OSError):
                    os.fchown(fd, old.st_uid, old.st_gid)
            else:
                guard.claim(fd)
            keep = stat.S_IMODE(old.st_mode) if old is not None else DEFAULT_FILE_MODE
            os.fchmod(fd, mode if mode is not None else keep)
            os.close(fd)
            fd = -1
            _replace(temp, target, old)
        except BaseException as exc:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            if isinstance(exc, OSError):
                raise path_refusal(exc, shown) from None
            raise
        return self.info(path, shown, follow=True)

    def delete(self, raw: str | None, recursive: bool) -> None:
        path, shown = self.resolve(raw)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(path)
            elif recursive:
                import shutil  # only here: deleting trees is rare

                shutil.rmtree(path)
            else:
                os.rmdir(path)
        except OSError as exc:
            if exc.errno == 17:  # EEXIST: some filesystems say this for a non-empty rmdir
                raise ApiError(
                    ErrorCode.DIRECTORY_NOT_EMPTY, f"{shown}: directory not empty"
                ) from None
            raise path_refusal(exc, shown) from None

    def mkdir(self, req: MakeDirRequest) -> FileInfo:
        path, shown = self.resolve(req.path)
        mode = check_mode(req.mode) if req.mode is not None else DEFAULT_DIR_MODE
        try:
            with guard.claiming_new_dirs(path):
                if req.parents:
                    os.makedirs(path, mode=mode, exist_ok=True)
                else:
                    os.mkdir(path, mode)
            if req.mode is not None:
                os.chmod(path, mode)  # exact bits, whatever the umask
        except FileExistsError:
            raise ApiError(ErrorCode.PATH_EXISTS, f"{shown} already exists") from None
        except OSError as exc:
            raise path_refusal(exc, shown) from None
        return self.info(path, shown, follow=True)


def _reserve(fd: int, size: int) -> None:
    """Allocate the temporary file's ``size`` bytes before the body arrives.

    A full disk is then refused before a byte is received, and the blocks are
    not allocated late: ext4 (the sandbox's disk) starts writing back a file
    whose blocks are still delayed-allocated when it is renamed over another
    (``auto_da_alloc``, its guard for programs that skip ``fsync``), and that
    put the write-back of a whole rewritten file into its answer. The write promises
    atomicity, not durability (no ``fsync``), so the kernel's writeback in due
    course is enough. Where the filesystem cannot allocate ahead, nothing is
    lost but the early refusal.
    """
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


def _replace(temp: str, target: str, old: os.stat_result | None) -> None:
    """Rename ``temp`` over ``target``. The replaced file's pages are freed when
    its last reference goes, which is the rename itself unless something holds
    it: tens of ms for a large file, spent here in the answer's path. So a
    reference is held across the rename and dropped by a thread of its own."""
    held = -1
    if old is not None and old.st_size >= LARGE_REPLACED:
        with contextlib.suppress(OSError):
            held = os.open(target, os.O_PATH | os.O_CLOEXEC)
    try:
        os.rename(temp, target)
    finally:
        if held >= 0:
            _close_aside(held)


def _close_aside(fd: int) -> None:
    try:
        threading.Thread(target=os.close, args=(fd,), name="free-replaced", daemon=True).start()
    except RuntimeError:  # no thread to be had (the sandbox's pids limit): here, then
        os.close(fd)


def _make_parents(parent: str, shown: str) -> None:
    """Create the missing directories above a path being written or moved to."""
    try:
        with guard.claiming_new_dirs(parent):
            os.makedirs(parent, exist_ok=True)
    except FileExistsError:
        raise ApiError(
            ErrorCode.PATH_NOT_DIRECTORY, f"{shown}: a parent is not a directory"
        ) from None
    except OSError as exc:
        raise path_refusal(exc, shown) from None


def _info(st: os.stat_result, shown: str) -> FileInfo:
    return FileInfo(
        name=os.path.basename(shown) or shown,
        path=shown,
        type=_file_type(st.st_mode),
        size=st.st_size,
        mode=stat.S_IMODE(st.st_mode),
        mtime=datetime.fromtimestamp(st.st_mtime, UTC),
    )


def _user_name(uid: int) -> str | None:
    return users.name_of(uid)  # not through pwd: see podbay.agent.users


def _receive(
    readinto: Callable[[memoryview], int], fd: int, hasher: Any, digest: str, shown: str
) -> str:
    """Body → hash and file, one pass; the digest to check (read from the end of
    the body when it is ``trailing``)."""
    buf = bytearray(WRITE_BUFFER)
    view = memoryview(buf)
    hold = DIGEST_HEX_LENGTH if digest == DIGEST_TRAILING else 0
    held = 0  # bytes at the front of buf that may yet be the trailing digest
    while n := readinto(view[held:]):
        end = held + n
        keep = min(hold, end)
        content = view[: end - keep]
        hasher.update(content)
        _write_all(fd, content)
        if keep:
            buf[:keep] = buf[end - keep : end]
        held = keep
    if not hold:
        return digest
    try:
        trailing = parse_digest(bytes(buf[:held]).decode("ascii")) if held == hold else ""
    except (UnicodeDecodeError, ApiError):
        trailing = ""
    if not trailing or trailing == DIGEST_TRAILING:
        raise ApiError(
            ErrorCode.REQUEST_INVALID,
            f"{shown}: the body does not end with the content's hex SHA-256 "
            "(X-Podbay-Sha256: trailing); nothing was written",
        )
    return trailing


def _sha256() -> Any:
    # Imported on first use: hashlib loads OpenSSL, which the agent's start
    # need not pay for.
    import hashlib

    return hashlib.sha256()


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
