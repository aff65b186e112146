"""The base image: a Debian bookworm root filesystem every sandbox shares read-only.

Built once with ``mmdebstrap`` and cached under ``image_dir`` keyed by a hash
of its :class:`Recipe`, so changing the package list builds a new one and
never touches the old. The build is atomic (a temporary directory renamed
into place) and serialised between processes by a lock file. Ownership is
shifted into the sandbox uid range, so that root inside a user namespace
owns the image's files; ``chown`` clears set-uid bits, so modes are restored
afterwards, and symlinks are never followed.

>>> recipe = Recipe()
>>> len(recipe.key())
16
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from podbay.errors import DriverError

log = logging.getLogger("podbay.runtime.image")

#: Bump when the post-processing below changes what an image contains.
#: (5: ``user`` owns /workspace and is no longer in group sudo.)
RECIPE_VERSION = 5

PACKAGES: tuple[str, ...] = (
    "python3",
    "python-is-python3",
    "python3-venv",
    "python3-pip",
    "ca-certificates",
    "bash",
    "coreutils",
    "curl",
    "git",
    "procps",
    "grep",
    "findutils",
    "sed",
    "gawk",
    "diffutils",
    "patch",
    "tar",
    "gzip",
    "bzip2",
    "xz-utils",
    "zstd",
    "unzip",
    "zip",
    "sudo",
    "adduser",
    "less",
    "file",
    "jq",
    "netbase",
    "iproute2",
    "iputils-ping",
    "openssh-client",
)

#: Mount points and placeholders the driver binds over; present in the image so
#: that a sandbox's overlay never needs a copy-up to host them.
PODBAY_DIRS = (".podbay", ".podbay/image", ".podbay/agent", "workspace")
PODBAY_FILES = (".podbay/env.json",)


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the image's contents; its hash names the cache entry."""

    suite: str = "bookworm"
    variant: str = "minbase"
    mirror: str = "http://deb.debian.org/debian"
    security_mirror: str = "http://deb.debian.org/debian-security"
    packages: tuple[str, ...] = PACKAGES
    uid_base: int = 1_000_000
    #: Extra CA certificates trusted inside (file name, PEM text): by default the
    #: host's locally added ones, so that a TLS-inspecting egress proxy the host
    #: trusts is trusted by sandboxes too (see :func:`local_ca_certificates`).
    extra_cas: tuple[tuple[str, str], ...] = ()
    version: int = RECIPE_VERSION

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def sources(self) -> list[str]:
        return [
            f"deb {self.mirror} {self.suite} main",
            f"deb {self.mirror} {self.suite}-updates main",
            f"deb {self.security_mirror} {self.suite}-security main",
        ]


# Alike in shape to control's SigningKey (a frozen record with derived
# properties) by coincidence only: nothing is shared between the two.
@dataclass(frozen=True)
class Image:
    """A built image: ``rootfs`` is the lowest overlay layer and the agent's interpreter."""

    key: str
    root: Path

    @property
    def rootfs(self) -> Path:
        return self.root / "rootfs"


class ImageCache:
    """Finds or builds the image for a recipe under ``directory``."""

    def __init__(self, directory: Path, recipe: Recipe) -> None:
        self.directory = directory
        self.recipe = recipe

    def path(self) -> Path:
        return self.directory / self.recipe.key()

    def cached(self) -> Image | None:
        root = self.path()
        if (root / "complete").is_file():
            return Image(self.recipe.key(), root)
        return None

    async def ensure(self) -> Image:
        """The cached image, building it first (minutes, logged) if missing."""
        image = self.cached()
        if image is not None:
            return image
        return await asyncio.to_thread(self._build_locked)

    def _build_locked(self) -> Image:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            image = self.cached()  # another process may have built it meanwhile
            if image is not None:
                return image
            return self._build()

    def _build(self) -> Image:
        final = self.path()
        tmp = self.directory / f".build-{self.recipe.key()}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        rootfs = tmp / "rootfs"
        started = time.monotonic()
        log.info(
            "building base image %s (Debian %s, %d packages); this runs once",
            self.recipe.key(),
            self.recipe.suite,
            len(self.recipe.packages),
        )
        try:
            _mmdebstrap(self.recipe, rootfs)
            log.info("base image: preparing the root filesystem")
            _finish_rootfs(rootfs)
            if self.recipe.extra_cas:
                log.info(
                    "base image: trusting %d extra CA certificates: %s",
                    len(self.recipe.extra_cas),
                    ", ".join(name for name, _ in self.recipe.extra_cas),
                )
                _add_cas(rootfs, self.recipe.extra_cas)
            log.info("base image: shifting ownership to uid %d+", self.recipe.uid_base)
            shift_ownership(rootfs, self.recipe.uid_base)
            (tmp / "recipe.json").write_text(json.dumps(asdict(self.recipe), indent=2))
            if final.exists():  # a stale half-entry without ``complete``
                shutil.rmtree(final)
            (tmp / "complete").write_text(f"{time.time():.0f}\n")
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("base image %s ready in %.0f s", self.recipe.key(), time.monotonic() - started)
        return Image(self.recipe.key(), final)


def _mmdebstrap(recipe: Recipe, rootfs: Path) -> None:
    import subprocess

    if shutil.which("mmdebstrap") is None:
        raise DriverError("mmdebstrap is not installed (apt-get install mmdebstrap)")
    argv = [
        "mmdebstrap",
        f"--variant={recipe.variant}",
        "--mode=root",
        "--format=directory",
        "--include=" + ",".join(recipe.packages),
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/info/*",
        recipe.suite,
        str(rootfs),
        *recipe.sources(),
    ]
    tail: list[str] = []
    # As a context manager: its output pipe is closed however the loop ends.
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            if line:
                log.info("mmdebstrap: %s", line)
                tail = [*tail[-19:], line]
    if proc.returncode != 0:
        raise DriverError(
            "building the base image failed (mmdebstrap exit "
            f"{proc.returncode}): " + " | ".join(tail[-3:])
        )


def _finish_rootfs(rootfs: Path) -> None:
    for rel in PODBAY_DIRS:
        (rootfs / rel).mkdir(mode=0o755, exist_ok=True)
    for rel in PODBAY_FILES:
        (rootfs / rel).write_text("{}\n")
    (rootfs / "workspace").chmod(0o755)
    for junk in ("var/lib/apt/lists", "var/cache/apt/archives"):
        for entry in (rootfs / junk).glob("*"):
            if entry.is_file() and entry.name != "lock":
                entry.unlink()
    (rootfs / "etc/hostname").write_text("sandbox\n")
    _add_user(rootfs)
    # ``user`` works in /workspace as in its home (E2B's convention: the
    # unprivileged account owns where it works). Root still writes anywhere,
    # and what root writes there (0644 files, 0755 directories) user can read.
    os.chown(rootfs / "workspace", USER_UID, USER_UID)
    # An empty machine-id is what systemd-less containers expect.
    with contextlib.suppress(FileNotFoundError):
        (rootfs / "etc/machine-id").write_text("")


#: The unprivileged account every sandbox has (``user`` on exec, spawn, files).
USER_NAME = "user"
USER_UID = 1000


def _add_user(rootfs: Path) -> None:
    """``user`` (uid/gid 1000, home /home/user owned by it, bash), in no
    privileged group.

    Not in group sudo and no sudoers entry: every sandbox process runs with
    ``no_new_privs`` (the runtime sets it; the isolation probes insist on it),
    so a set-uid sudo cannot raise ``user`` to root in any class, and lifting
    it for sandbox processes would let a set-uid binary written into the
    sandbox run with privileges next to the agent. A command that needs root
    runs as root (the default ``user``). The sudo binary stays for scripts
    that prefix it while running as root.
    """
    import subprocess

    done = subprocess.run(
        [
            "chroot",
            str(rootfs),
            "useradd",
            "--create-home",
            "--uid",
            str(USER_UID),
            "--user-group",
            "--shell",
            "/bin/bash",
            USER_NAME,
        ],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    if done.returncode != 0:
        raise DriverError(
            f"adding the account {USER_NAME!r} to the image failed: {done.stderr.strip()}"
        )


def local_ca_certificates(directory: str) -> tuple[tuple[str, str], ...]:
    """The ``*.crt`` files of ``directory`` (the host's locally added CAs,
    ``/usr/local/share/ca-certificates`` by default) as (name, PEM) pairs."""
    if not directory:
        return ()
    found = []
    for path in sorted(Path(directory).glob("*.crt")):
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if "BEGIN CERTIFICATE" in text:
            found.append((path.name, text))
    return tuple(found)


def _add_cas(rootfs: Path, cas: tuple[tuple[str, str], ...]) -> None:
    import subprocess

    target = rootfs / "usr/local/share/ca-certificates"
    target.mkdir(parents=True, exist_ok=True)
    for name, text in cas:
        (target / f"host-{name}").write_text(text)
    done = subprocess.run(
        ["chroot", str(rootfs), "update-ca-certificates"],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    if done.returncode != 0:
        raise DriverError(f"update-ca-certificates in the image failed: {done.stderr.strip()}")


def shift_ownership(root: Path, base: int) -> None:
    """Add ``base`` to every uid and gid under ``root``, keeping modes and never
    following symlinks (``chown`` drops set-uid/set-gid bits, so they are restored)."""

    def shift(path: str) -> None:
        st = os.lstat(path)
        if st.st_uid >= base and st.st_gid >= base:
            return
        uid = st.st_uid + base if st.st_uid < base else st.st_uid
        gid = st.st_gid + base if st.st_gid < base else st.st_gid
        os.lchown(path, uid, gid)
        if not stat.S_ISLNK(st.st_mode):
            os.chmod(path, stat.S_IMODE(st.st_mode))

    shift(str(root))
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            shift(os.path.join(dirpath, name))
