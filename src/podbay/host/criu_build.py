"""Build :mod:`.criu`'s CRIU: Debian 13's criu source, Debian 12's libraries.

``python -m podbay.host.criu_build`` (``./run`` calls it before ``serve`` and
``test``) builds once; later runs see the build in place and return at once
(``--check``: only say by the exit status whether a build is due). The source
tarball comes from the Debian archive this host's apt already uses (its
``pool/``), is checked against :data:`.criu.SOURCE_SHA256` before it is
unpacked, and is kept beside the builds so a new recipe does not download again.
The build needs Debian 12's development packages for criu (./run's list);
only ``criu/criu`` is made, not its docs or Python tools.

Never imported by the daemon: it runs a compiler and the network.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from podbay.errors import DriverError

from .criu import (
    CONFIG_NAME,
    CONFIG_TEXT,
    CRIU_HOME,
    CRIU_VERSION,
    SOURCE_FIXES,
    SOURCE_NAME,
    SOURCE_POOL_PATH,
    SOURCE_SHA256,
    build_dir,
    criu_path,
)

APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
#: How much of a failed build's output the error quotes.
QUOTED_CHARS = 3000


def archive_uris(sources: tuple[Path, ...] = APT_SOURCES) -> list[str]:
    """The Debian archives apt is configured with (one-line and deb822 formats),
    security archives left out: they carry no criu source."""
    found: list[str] = []
    files: list[Path] = []
    for source in sources:
        if source.is_dir():
            files += sorted(p for p in source.iterdir() if p.suffix in (".list", ".sources"))
        elif source.is_file():
            files.append(source)
    for file in files:
        for line in file.read_text(errors="replace").splitlines():
            line = line.split("#", 1)[0].strip()
            uris: list[str] = []
            if line.startswith("URIs:"):
                uris = line.removeprefix("URIs:").split()
            elif re.match(r"deb(-src)?\s", line):
                words = [w for w in line.split()[1:] if not w.startswith("[")]
                # A one-line entry's options may be one bracketed word or several.
                words = [w for w in words if "=" not in w and not w.endswith("]")]
                uris = words[:1]
            for uri in uris:
                uri = uri.rstrip("/")
                if uri.startswith(("http://", "https://")) and not uri.endswith("-security"):
                    found.append(uri)
    return list(dict.fromkeys(found))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_source(home: Path) -> Path:
    """The verified source tarball, downloaded unless a verified copy is kept."""
    kept = home / "src" / SOURCE_NAME
    if kept.is_file() and sha256_of(kept) == SOURCE_SHA256:
        return kept
    kept.parent.mkdir(parents=True, exist_ok=True)
    uris = archive_uris()
    if not uris:
        raise DriverError("no Debian archive in apt's sources to download criu's source from")
    errors: list[str] = []
    for uri in uris:
        url = f"{uri}/{SOURCE_POOL_PATH}"
        partial = kept.with_name(f".{SOURCE_NAME}.{os.getpid()}")
        try:
            with urllib.request.urlopen(url, timeout=60) as answer, partial.open("wb") as out:  # noqa: S310 (apt's own archive URI)
                shutil.copyfileobj(answer, out)
        except OSError as exc:
            errors.append(f"{url}: {exc}")
            partial.unlink(missing_ok=True)
            continue
        got = sha256_of(partial)
        if got != SOURCE_SHA256:
            partial.unlink(missing_ok=True)
            errors.append(f"{url}: sha256 {got}, expected {SOURCE_SHA256}")
            continue
        os.rename(partial, kept)
        return kept
    raise DriverError("could not download criu's source: " + "; ".join(errors))


def apply_fixes(tree: Path) -> None:
    for relative, old, new in SOURCE_FIXES:
        path = tree / relative
        text = path.read_text()
        if text.count(old) != 1:
            raise DriverError(f"criu source fix does not apply to {relative}")
        path.write_text(text.replace(old, new))


def build(home: Path = CRIU_HOME, *, jobs: int | None = None) -> Path:
    """Build into a scratch directory renamed to :func:`.criu.build_dir` at the
    end, so a build cut short leaves nothing :func:`.criu.criu_path` would find."""
    tarball = fetch_source(home)
    target = build_dir(home)
    scratch = home / f".build.{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        # tar, not tarfile: Debian 12's Python has no extraction filters (and the
        # tarball is the one whose digest was checked).
        subprocess.run(["tar", "-xJf", str(tarball), "-C", str(scratch)], check=True)
        tree = scratch / f"criu-{CRIU_VERSION}"
        apply_fixes(tree)
        made = subprocess.run(
            ["make", f"-j{jobs or os.cpu_count() or 1}", "criu"],
            cwd=tree,
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            output = (made.stdout + made.stderr)[-QUOTED_CHARS:]
            raise DriverError(f"building criu {CRIU_VERSION} failed: {output}")
        prefix = scratch / "prefix"
        (prefix / "sbin").mkdir(parents=True)
        shutil.copy2(tree / "criu" / "criu", prefix / "sbin" / "criu")
        # Only root runs it (runc's checkpoint and restore are root's).
        os.chmod(prefix / "sbin" / "criu", 0o700)
        (prefix / CONFIG_NAME).write_text(CONFIG_TEXT)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(prefix, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m podbay.host.criu_build")
    parser.add_argument("--check", action="store_true", help="exit 1 if a build is due")
    parser.add_argument("--home", type=Path, default=CRIU_HOME, help="where builds live")
    args = parser.parse_args(argv)
    if criu_path(args.home) is not None:
        return 0
    if args.check:
        return 1
    started = time.monotonic()
    try:
        target = build(args.home)
    except DriverError as exc:
        print(f"podbay: {exc}", file=sys.stderr)
        return 1
    print(
        f"podbay: criu {CRIU_VERSION} built in {target} ({time.monotonic() - started:.0f} s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
