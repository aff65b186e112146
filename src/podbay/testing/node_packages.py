"""npm packages for tests that drive a JavaScript SDK (E2B's ``e2b``): installed
with ``npm ci`` from a directory's ``package-lock.json`` into a cache shared by
every test session (``$PODBAY_TEST_NODE_DIR``, default
``/var/tmp/podbay-test-node``), once per lock file. A later session finds them
there and runs no npm at all, so it needs no network."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

DEFAULT_NODE_DIR = "/var/tmp/podbay-test-node"


def installed_node_packages(package_dir: Path) -> Path:
    """The ``node_modules`` of ``package_dir``'s pinned packages (skips the test
    when node or npm is missing: ``./run setup`` installs both)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed (./run setup installs Debian's)")
    manifest = (package_dir / "package.json").read_bytes()
    lock = (package_dir / "package-lock.json").read_bytes()
    digest = hashlib.sha256(manifest + b"\0" + lock).hexdigest()[:16]
    cache = Path(os.environ.get("PODBAY_TEST_NODE_DIR", DEFAULT_NODE_DIR))
    home = cache / f"{json.loads(manifest)['name']}-{digest}"
    if (home / "node_modules").is_dir():
        return home / "node_modules"
    cache.mkdir(parents=True, exist_ok=True)
    # Installed aside and renamed into place: a session that stops halfway, or
    # two that install at once, never leave a half-filled directory under the name.
    staging = Path(tempfile.mkdtemp(dir=cache, prefix=".install-"))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide it from a session of another user
    try:
        (staging / "package.json").write_bytes(manifest)
        (staging / "package-lock.json").write_bytes(lock)
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error", "--prefer-offline"],
            cwd=staging,
            check=True,
            capture_output=True,
        )
        try:
            staging.rename(home)
        except OSError:  # another session installed the same lock first
            if not (home / "node_modules").is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return home / "node_modules"
