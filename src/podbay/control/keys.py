"""Signing keys: Ed25519, created on first start, stored 0600 in the data dir.

``<data_dir>/keys/<kid>.pem`` holds one private key each. The newest kid
signs; every key present verifies, so rotating (:meth:`KeyRing.rotate`)
keeps old tokens working until the old file is removed
(:meth:`KeyRing.remove`). Ed25519 so that a gateway or node on another
machine can verify with public keys alone.

kids sort by creation time (``<unix milliseconds, 13 digits>-<4 hex>``,
strictly increasing), which
is how "newest" is decided without a separate pointer file.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from podbay.errors import KeyRingError as KeyRingError  # re-exported: defined in the one tree


# Alike in shape to runtime's Image (a frozen record with derived properties)
# by coincidence only: nothing is shared between a signing key and an image.
@dataclass(frozen=True)
class SigningKey:
    kid: str
    private: Ed25519PrivateKey

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()


class KeyRing:
    """Every signing key in one directory, reloaded from disk on demand."""

    #: The directory is looked at (one ``stat``) at most this often on a known
    #: kid, so a removed key stops verifying within about this long.
    RELOAD_INTERVAL = 1.0

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._keys: dict[str, SigningKey] = {}
        self._lock = threading.Lock()
        self._checked_at = 0.0
        self._mtime = -1

    @classmethod
    def open(cls, directory: Path, *, create: bool = True) -> KeyRing:
        ring = cls(directory)
        ring.reload()
        if not ring._keys and create:
            ring.rotate()
        return ring

    # -- reading ---------------------------------------------------------------
    def _dir_mtime(self) -> int:
        try:
            return os.stat(self.directory).st_mtime_ns
        except OSError:
            return -1

    def _reload_if_changed(self) -> None:
        """Reload when the directory changed (a key added or removed); a
        forged kid costs one ``stat``, never a directory scan."""
        self._checked_at = time.monotonic()
        if self._dir_mtime() != self._mtime:
            self.reload()

    def reload(self) -> None:
        mtime = self._dir_mtime()
        keys: dict[str, SigningKey] = {}
        if self.directory.is_dir():
            for path in self.directory.glob("*.pem"):
                try:
                    private = serialization.load_pem_private_key(path.read_bytes(), None)
                except (OSError, ValueError):
                    continue  # half-written by a concurrent rotate; next reload sees it
                if isinstance(private, Ed25519PrivateKey):
                    keys[path.stem] = SigningKey(path.stem, private)
        with self._lock:
            self._keys = keys
            self._mtime = mtime

    def kids(self) -> list[str]:
        return sorted(self._keys)

    def active(self) -> SigningKey:
        keys = self._keys
        if not keys:
            raise KeyRingError(f"no signing key in {self.directory}")
        return keys[max(keys)]

    def public_key(self, kid: str) -> Ed25519PublicKey | None:
        """The verifying key for ``kid``, noticing keys added or removed on disk."""
        key = self._keys.get(kid)
        if key is None or time.monotonic() - self._checked_at >= self.RELOAD_INTERVAL:
            self._reload_if_changed()
            key = self._keys.get(kid)
        return None if key is None else key.public

    # -- changing --------------------------------------------------------------
    def rotate(self) -> str:
        """Create a new key, which signs from now on; returns its kid."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.directory, 0o700)
        private = Ed25519PrivateKey.generate()
        newest = max(
            (int(k.split("-", 1)[0]) for k in self._keys if k.split("-", 1)[0].isdigit()), default=0
        )
        kid = f"{max(int(time.time() * 1000), newest + 1):013d}-{secrets.token_hex(2)}"
        pem = private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        tmp = self.directory / f".{kid}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.directory / f"{kid}.pem")
        self.reload()
        return kid

    def remove(self, kid: str) -> None:
        """Delete a key: tokens it signed stop verifying. The active key stays."""
        if kid not in self._keys:
            raise KeyRingError(f"no key {kid}")
        if kid == self.active().kid:
            raise KeyRingError(f"{kid} is the active key; rotate first")
        (self.directory / f"{kid}.pem").unlink(missing_ok=True)
        self.reload()
