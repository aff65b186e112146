"""Sans-I/O pieces of files, search and shell lines: commands to run and how to read them.

Both clients use these for the reference's exec-based paths (base64 reads and
chunked writes, ``ls``, ``grep``, ``exec 2>&1``) and for the native files
API's digest checks. Commands pass data as positional parameters (``"$1"``),
never by splicing it into the shell line, so no quoting can go wrong.

>>> parse_grep("a.py\\x0012:x = 1: two\\n", "a.py")
[GrepMatch(path='a.py', line=12, text='x = 1: two')]
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import posixpath
import stat
import tarfile
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import BinaryIO

from podbay.errors import SandboxRequestError, SandboxUnavailableError
from podbay.wire.data import ExecResult, FileInfo, FileType
from podbay.wire.limits import BASE64_WRITE_CHUNK, EXEC_OUTPUT_CAP
from podbay.wire.paths import DIGEST_HEADER, DIGEST_HEX_LENGTH, DIGEST_TRAILING

from ._models import CombinedResult, DirEntry, GrepMatch

#: Bytes per read/write when streaming files through the native API.
STREAM_CHUNK = 1024 * 1024
SH = "/bin/sh"


def combined_command(line: str) -> list[str]:
    """argv for :meth:`exec_combined`: stderr joins stdout at the shell, so order is kept."""
    return [SH, "-c", f"exec 2>&1\n{line}"]


def combined_result(result: ExecResult) -> CombinedResult:
    return CombinedResult(
        output=result.stdout,
        exit_code=result.exit_code,
        truncated=result.truncated,
        timed_out=result.timed_out,
    )


# -- base64 fallback ---------------------------------------------------------


def read_command(path: str) -> list[str]:
    return [SH, "-c", 'exec base64 -w 0 -- "$1"', "sh", path]


def decode_read(result: ExecResult, path: str) -> bytes:
    """Bytes of a base64 read; a truncated read is refused, never returned as a prefix."""
    if result.exit_code != 0:
        raise SandboxRequestError(404, f"cannot read {path}: {_reason(result)}", "PATH_NOT_FOUND")
    if result.truncated:
        raise SandboxRequestError(
            413,
            f"{path} is too large for the exec+base64 path: its base64 exceeds exec's "
            f"{EXEC_OUTPUT_CAP // (1024 * 1024)} MiB output cap (files above "
            f"{EXEC_OUTPUT_CAP * 3 // 4 // 1024} KiB); this sandbox's agent has no native "
            "files API",
            "FILE_TOO_LARGE",
        )
    try:
        return base64.b64decode("".join(result.stdout.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SandboxRequestError(
            502, f"reading {path}: base64 did not decode ({exc})", "RESPONSE_INVALID"
        ) from None


def write_commands(path: str, source: BinaryIO) -> Iterator[list[str]]:
    """argv lists that write ``source`` to ``path`` in 48 KiB chunks.

    Chunks go to a hidden sibling, appended; the last command renames it over
    ``path``, so a reader never sees half a file and a failure leaves
    ``path`` as it was.
    """
    directory, base = posixpath.split(path)
    temp = posixpath.join(directory, f".{base}.podbay-{uuid.uuid4().hex[:12]}")
    first = True
    while True:
        chunk = source.read(BASE64_WRITE_CHUNK)
        if not chunk and not first:
            break
        redirect = ">" if first else ">>"
        data = base64.b64encode(chunk).decode()
        yield [SH, "-c", f'printf %s "$1" | base64 -d {redirect} "$2"', "sh", data, temp]
        first = False
        if len(chunk) < BASE64_WRITE_CHUNK:
            break
    yield [SH, "-c", 'mv -f -- "$1" "$2"', "sh", temp, path]


def cleanup_command(path: str) -> list[str]:
    """Remove the hidden write temporaries for ``path`` after a failure."""
    directory, base = posixpath.split(path)
    pattern = posixpath.join(directory or ".", f".{base}.podbay-")
    return [SH, "-c", 'rm -f -- "$1"*', "sh", pattern]


def check_write(result: ExecResult, path: str) -> None:
    if result.exit_code != 0:
        missing = "No such file" in result.stderr or "nonexistent" in result.stderr
        full = "No space left" in result.stderr or "quota exceeded" in result.stderr
        status, code = (
            (404, "PATH_NOT_FOUND")
            if missing
            else (507, "NO_SPACE")
            if full
            else (409, "PATH_ACCESS_DENIED")
        )
        raise SandboxRequestError(status, f"cannot write {path}: {_reason(result)}", code)


# -- list_dir and grep ---------------------------------------------------------


def list_command(path: str) -> list[str]:
    return [SH, "-c", 'cd -- "$1" && exec ls -1Ap', "sh", path]


def parse_list(result: ExecResult, path: str) -> list[DirEntry]:
    if result.exit_code != 0:
        raise SandboxRequestError(404, f"cannot list {path}: {_reason(result)}", "PATH_NOT_FOUND")
    entries = []
    for line in result.stdout.splitlines():
        if not line:
            continue
        is_dir = line.endswith("/")
        entries.append(DirEntry(name=line[:-1] if is_dir else line, is_directory=is_dir))
    return entries


def grep_command(pattern: str, path: str) -> list[str]:
    """``-H`` names the file even for a single file; ``-Z`` ends the name with NUL,
    so colons in names and text cannot confuse the parse; ``-I`` skips binaries."""
    return ["grep", "-rnHIZ", "-e", pattern, "--", path]


def parse_grep(stdout: str, path: str, *, truncated: bool = False) -> list[GrepMatch]:
    lines = stdout.split("\n")
    if truncated or lines[-1]:
        lines = lines[:-1]  # a cut last line is not a match we can trust
    matches = []
    for line in lines:
        name, sep, rest = line.partition("\0")
        if not sep:  # a grep without -Z: "path:line:text"
            name, _, rest = line.partition(":")
        number, _, text = rest.partition(":")
        if not number.isdigit():
            continue
        matches.append(GrepMatch(path=name, line=int(number), text=text))
    return matches


def grep_result(result: ExecResult, pattern: str, path: str) -> list[GrepMatch]:
    """Exit 1 is "no match" (an empty list); 2 is an error unless something matched."""
    if result.exit_code == 1 and not result.stdout:
        return []
    matches = parse_grep(result.stdout, path, truncated=result.truncated)
    if result.exit_code == 0 or matches:
        return matches
    if "No such file" in result.stderr:
        raise SandboxRequestError(404, f"cannot search {path}: {_reason(result)}", "PATH_NOT_FOUND")
    raise SandboxRequestError(
        400, f"grep {pattern!r} in {path} failed: {_reason(result)}", "GREP_FAILED"
    )


# -- directories (tar) and remote temporaries ------------------------------------


def remote_temp(kind: str) -> str:
    return f"/tmp/.podbay-{kind}-{uuid.uuid4().hex}.tar"


def pack(directory: str, archive: BinaryIO) -> None:
    """A tar of ``directory``'s contents (``.``-relative) into ``archive``, rewound."""
    with tarfile.open(fileobj=archive, mode="w") as tar:
        tar.add(directory, arcname=".")
    archive.seek(0)


def unpack(archive: str, destination: str) -> None:
    os.makedirs(destination, exist_ok=True)
    with tarfile.open(archive) as tar:
        safe_extract(tar, destination)


def safe_extract(tar: tarfile.TarFile, destination: str) -> None:
    """Unpack an archive that came from a sandbox without letting it escape.

    Python's ``data`` filter where available (3.11.4+); otherwise the same
    rules by hand: regular files, directories and in-tree links only.
    """
    if hasattr(tarfile, "data_filter"):
        tar.extractall(destination, filter="data")
        return
    root = os.path.realpath(destination)
    members = tar.getmembers()
    for member in members:
        target = os.path.realpath(os.path.join(root, member.name))
        if os.path.commonpath([root, target]) != root or os.path.isabs(member.name):
            raise tarfile.TarError(f"archive member escapes the destination: {member.name}")
        if member.issym() or member.islnk():
            link = (
                os.path.join(os.path.dirname(target), member.linkname)
                if member.issym()
                else os.path.join(root, member.linkname)
            )
            if os.path.commonpath([root, os.path.realpath(link)]) != root:
                raise tarfile.TarError(f"archive link escapes the destination: {member.name}")
        elif not (member.isfile() or member.isdir()):
            raise tarfile.TarError(f"archive member is not a file or directory: {member.name}")
        member.mode &= 0o755
        member.uid = member.gid = os.getuid()
    tar.extractall(root, members=members)  # noqa: S202 - every member checked above


def upload_mode(st_mode: int) -> int:
    """The permission bits a local file keeps in the sandbox (``docker cp``'s rule: all).

    >>> oct(upload_mode(0o100755))
    '0o755'
    """
    return stat.S_IMODE(st_mode)


def download_mode(mode: int) -> int:
    """The permission bits a sandbox file keeps here: the tar ``data`` filter's
    rule (no set-id or sticky bit, no group or other write), so a file and a
    directory's files come out alike.

    >>> oct(download_mode(0o4777)), oct(download_mode(0o755))
    ('0o755', '0o755')
    """
    return stat.S_IMODE(mode) & ~(stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | 0o022)


def is_dir_command(path: str) -> list[str]:
    return ["test", "-d", path]


def untar_command(archive: str, directory: str) -> list[str]:
    return [
        SH,
        "-c",
        'mkdir -p -- "$2" && tar --no-same-owner -xf "$1" -C "$2"; s=$?; rm -f -- "$1"; exit $s',
        "sh",
        archive,
        directory,
    ]


def tar_command(directory: str, archive: str) -> list[str]:
    return ["tar", "-C", directory, "-cf", archive, "."]


def remove_command(path: str) -> list[str]:
    return ["rm", "-f", "--", path]


def check_ok(result: ExecResult, what: str) -> None:
    if result.exit_code != 0:
        raise SandboxRequestError(400, f"{what} failed: {_reason(result)}", "COMMAND_FAILED")


def _reason(result: ExecResult) -> str:
    text = (result.stderr or result.stdout).strip().splitlines()
    return text[-1] if text else f"exit code {result.exit_code}"


# -- digests -----------------------------------------------------------------------


def remaining_size(source: BinaryIO) -> int:
    """Bytes from a seekable file's current position to its end (position kept)."""
    start = source.tell()
    end = source.seek(0, os.SEEK_END)
    source.seek(start)
    return end - start


class StreamDigest:
    """Hashes an upload as it is read, for a digest sent after the content.

    The content is exactly ``size`` bytes: a source that ends early raises
    (the agent then sees a short body and writes nothing).
    """

    def __init__(self, size: int) -> None:
        self.left = size
        self.size = 0
        self._digest = hashlib.sha256()

    def take(self, chunk: bytes) -> bytes:
        if not chunk:
            raise OSError(f"the file shrank while it was being sent ({self.left} bytes short)")
        chunk = chunk[: self.left]
        self._digest.update(chunk)
        self.left -= len(chunk)
        self.size += len(chunk)
        return chunk

    def trailer(self) -> bytes:
        return self._digest.hexdigest().encode("ascii")


def file_digest(source: BinaryIO) -> tuple[str, int]:
    """(hex SHA-256, size) of a seekable file, read from its current position, which
    is restored afterwards."""
    start = source.tell()
    digest = hashlib.sha256()
    size = 0
    while chunk := source.read(STREAM_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    source.seek(start)
    return digest.hexdigest(), size


#: Request headers of a native read: the digest may come after the bytes (one
#: pass over the file in the agent; older agents ignore it and send it first).
READ_HEADERS = {DIGEST_HEADER: DIGEST_TRAILING}


class DigestCheck:
    """Hashes a native read as it streams; :meth:`verify` refuses a mismatch.

    The agent sends the file's SHA-256 in ``X-Podbay-Sha256`` before the
    bytes, or (``trailing``) as the body's last 64 bytes, which :meth:`update`
    holds back; a read whose bytes do not hash to it (or that has no digest,
    or ends short of ``Content-Length``) raises instead of returning.
    """

    def __init__(self, headers: Mapping[str, str], path: str) -> None:
        self.path = path
        self.expected = (headers.get(DIGEST_HEADER) or "").strip().lower()
        self.trailing = self.expected == DIGEST_TRAILING
        length = headers.get("Content-Length")
        self.total = int(length) if length and length.isdigit() else None
        if self.trailing and self.total is not None:
            self.total -= DIGEST_HEX_LENGTH
        self.size = 0
        self._digest = hashlib.sha256()
        #: The last bytes received, which may yet be the trailing digest.
        self._held = b""

    def update(self, chunk: bytes) -> list[bytes | memoryview]:
        """Take ``chunk``; the content to pass on (less what may be the digest),
        in pieces, without copying ``chunk``."""
        pieces: list[bytes | memoryview] = [chunk]
        if self.trailing:
            if len(chunk) >= DIGEST_HEX_LENGTH:
                pieces = [self._held, memoryview(chunk)[:-DIGEST_HEX_LENGTH]]
                self._held = chunk[-DIGEST_HEX_LENGTH:]
            else:
                joined = self._held + chunk
                pieces = [joined[:-DIGEST_HEX_LENGTH]]
                self._held = joined[-DIGEST_HEX_LENGTH:]
        out: list[bytes | memoryview] = [p for p in pieces if len(p)]
        for piece in out:
            self._digest.update(piece)
            self.size += len(piece)
        return out

    def verify(self) -> None:
        if self.trailing:
            self.expected = self._held.decode("ascii", errors="replace").lower()
        if not self.expected or (self.trailing and len(self._held) < DIGEST_HEX_LENGTH):
            raise SandboxUnavailableError(
                f"reading {self.path}: the agent sent no {DIGEST_HEADER} digest"
            )
        if self.total is not None and self.size != self.total:
            raise SandboxUnavailableError(
                f"reading {self.path}: {self.size} of {self.total} bytes arrived; discarded"
            )
        actual = self._digest.hexdigest()
        if actual != self.expected:
            raise SandboxUnavailableError(
                f"reading {self.path}: SHA-256 mismatch after {self.size} bytes "
                f"(agent {self.expected[:16]}..., received {actual[:16]}...); "
                "the bytes were discarded"
            )


# -- stat, mkdir, chmod, rm, mv through exec (agents without "files-ops") -------

#: ``stat`` fields: type, size, octal mode, uid, gid, owner, mtime (epoch seconds).
_STAT_FORMAT = "%F|%s|%a|%u|%g|%U|%Y"


def stat_command(path: str) -> list[str]:
    return ["stat", "-c", _STAT_FORMAT, "--", path]


def parse_stat(result: ExecResult, path: str) -> FileInfo:
    if result.exit_code != 0:
        missing = "No such file" in result.stderr
        raise SandboxRequestError(
            404 if missing else 400,
            f"stat {path}: {_reason(result)}",
            "PATH_NOT_FOUND" if missing else "COMMAND_FAILED",
        )
    kind, size, mode, uid, gid, owner, mtime = result.stdout.strip().split("|")
    types: dict[str, FileType] = {
        "regular file": "file",
        "regular empty file": "file",
        "directory": "directory",
        "symbolic link": "symlink",
    }
    return FileInfo(
        name=posixpath.basename(path.rstrip("/")) or path,
        path=path,
        type=types.get(kind) or "other",
        size=int(size),
        mode=int(mode, 8),
        mtime=datetime.fromtimestamp(int(mtime), UTC),
        uid=int(uid),
        gid=int(gid),
        owner=None if owner == "UNKNOWN" else owner,
    )


def mkdir_command(path: str, parents: bool, mode: int | None) -> list[str]:
    argv = ["mkdir"]
    if parents:
        argv.append("-p")
    if mode is not None:
        argv += ["-m", f"{mode:o}"]
    return [*argv, "--", path]


def chmod_command(path: str, mode: int) -> list[str]:
    return ["chmod", f"{mode:o}", "--", path]


def remove_path_command(path: str, recursive: bool) -> list[str]:
    if recursive:
        return ["rm", "-rf", "--", path]
    return [
        "sh",
        "-c",
        'if [ -d "$1" ] && [ ! -L "$1" ]; then rmdir -- "$1"; else rm -- "$1"; fi',
        "rm",
        path,
    ]


def move_command(source: str, destination: str, overwrite: bool) -> list[str]:
    script = 'mkdir -p -- "$(dirname -- "$2")" && ' + (
        'mv -T -- "$1" "$2"'
        if overwrite
        else '{ [ ! -e "$2" ] && [ ! -L "$2" ] || { echo EXISTS >&2; exit 17; }; } '
        '&& mv -T -n -- "$1" "$2"'
    )
    return ["sh", "-c", script, "mv", source, destination]


def check_move(result: ExecResult, destination: str) -> None:
    if result.exit_code == 17:
        raise SandboxRequestError(409, f"{destination} already exists", "PATH_EXISTS")
    check_ok(result, f"mv to {destination}")
