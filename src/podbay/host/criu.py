"""The CRIU that runc checkpoints and restores ``container`` machines with.

Debian 12's own criu (3.17) cannot run on the kernels podbay meets today:
``criu check`` stops at ``vdso: Unexpected rt vDSO area bounds``. Debian 13's
criu binary needs a newer libc than Debian 12's. So ``./run`` builds Debian 13's
criu source with Debian 12's libraries, once, into a private prefix under
:data:`CRIU_HOME` (:mod:`.criu_build`, which the daemon never imports: it never
runs a compiler); nothing of the host's packages changes. This module only
finds that build.

How runc is to call it: ``runc --criu PATH checkpoint|restore ...`` with
:func:`criu_env` in the environment. That names a CRIU configuration file of
the build that locks the sandbox's network with nftables while it is dumped:
CRIU's default lock runs ``iptables-restore``, which podbay's hosts need not
have (the dump fails with ``execvp("iptables-restore", ...) failed``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

#: The Debian source package built (Debian 13's criu).
CRIU_VERSION = "4.1.1"
#: Its upstream tarball in Debian's pool, and the digest it must have.
SOURCE_NAME = f"criu_{CRIU_VERSION}.orig.tar.xz"
SOURCE_POOL_PATH = f"pool/main/c/criu/{SOURCE_NAME}"
SOURCE_SHA256 = "f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe"

#: Where builds live: outside the checkout, so a fresh clone (CI's) finds the
#: one made before and does not build again.
CRIU_HOME = Path("/var/lib/podbay/criu")
#: A build's CRIU configuration file (see the module's docstring).
CONFIG_NAME = "runc.conf"
CONFIG_TEXT = "network-lock nftables\n"

#: The one source change the build makes. criu 4.1.1 dereferences a NULL argv
#: when a configuration file read in its RPC mode (the mode runc drives it in)
#: sets ``network-lock``: without this it segfaults at the first checkpoint.
SOURCE_FIXES: tuple[tuple[str, str, str], ...] = (
    (
        "criu/config.c",
        'if (has_network_lock_opt && !strcmp(argv[optind], "restore")) {',
        'if (has_network_lock_opt && argv && optind < argc && !strcmp(argv[optind], "restore")) {',
    ),
)


def recipe_digest() -> str:
    """What a build is named by: the source's digest, the fixes and the configuration.
    A change to any of them makes a new build beside the old one."""
    digest = hashlib.sha256()
    digest.update(f"{SOURCE_SHA256}\0{CONFIG_TEXT}\0".encode())
    for path, old, new in SOURCE_FIXES:
        digest.update(f"{path}\0{old}\0{new}\0".encode())
    return digest.hexdigest()[:16]


def build_dir(home: Path = CRIU_HOME) -> Path:
    """The directory a complete build of the current recipe is renamed to."""
    return home / f"{CRIU_VERSION}-{recipe_digest()}"


def criu_path(home: Path = CRIU_HOME) -> Path | None:
    """The built ``criu`` binary for ``runc --criu``, or ``None`` when ``./run``
    has not built it on this host (the build directory appears whole, by rename)."""
    binary = build_dir(home) / "sbin" / "criu"
    return binary if os.access(binary, os.X_OK) else None


def config_path(home: Path = CRIU_HOME) -> Path:
    return build_dir(home) / CONFIG_NAME


def criu_env(home: Path = CRIU_HOME) -> dict[str, str]:
    """The environment entries runc's checkpoint and restore need for this CRIU
    (runc passes its environment on to ``criu swrk``)."""
    return {"CRIU_CONFIG_FILE": str(config_path(home))}
