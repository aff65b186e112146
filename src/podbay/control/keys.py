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

import asyncio
import os
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from podbay.errors import KeyRingError as KeyRingError  # re-exported: defined in the one tree

if TYPE_CHECKING:
    from podbay.settings import Settings
    from podbay.store.base import Store
    from podbay.store.cluster_queries import ClusterQueries


def new_kid(existing: Iterable[str]) -> str:
    """A kid after every one in ``existing`` (they sort by creation time)."""
    newest = max(
        (int(k.split("-", 1)[0]) for k in existing if k.split("-", 1)[0].isdigit()), default=0
    )
    return f"{max(int(time.time() * 1000), newest + 1):013d}-{secrets.token_hex(2)}"


def _pem(private: Ed25519PrivateKey) -> bytes:
    return private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


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
        kid = new_kid(self._keys)
        pem = _pem(private)
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


class StoreKeyRing:
    """The signing keys in the shared store (PostgreSQL), so that every
    control-plane replica signs and verifies with the same ones.

    Read into memory (signing and verifying never wait on the database);
    :meth:`refresh` re-reads them: each lifecycle pass, and when a token names
    a kid not seen yet (another replica or the CLI rotated), at most once a
    second. Rotation is a store operation (``podbay deployment keys rotate``
    with ``PODBAY_STORE_URL``); the newest kid signs.
    """

    REFRESH_INTERVAL = 1.0

    def __init__(self, store: ClusterQueries) -> None:
        self.store = store
        self._keys: dict[str, SigningKey] = {}
        self._refreshed_at = 0.0
        self._refreshing: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, store: ClusterQueries, *, create: bool = True, adopt: Path | None = None
    ) -> StoreKeyRing:
        """The store's keys. When it has none yet: the keys of the data directory
        ``adopt`` if it holds any (a ``serve`` moving to shared keys keeps its
        tokens valid), else a new one (``create``)."""
        ring = cls(store)
        await ring.refresh()
        if not ring._keys and adopt is not None:
            local = KeyRing.open(adopt, create=False)
            for kid in local.kids():
                pem = _pem(local._keys[kid].private).decode()
                await store.add_signing_key(kid, pem, datetime.now(UTC))
            await ring.refresh()
        if not ring._keys and create:
            await ring.rotate()
        return ring

    async def refresh(self) -> None:
        keys: dict[str, SigningKey] = {}
        for kid, pem in await self.store.signing_keys():
            try:
                private = serialization.load_pem_private_key(pem.encode(), None)
            except ValueError:
                continue
            if isinstance(private, Ed25519PrivateKey):
                keys[kid] = SigningKey(kid, private)
        self._keys = keys
        self._refreshed_at = time.monotonic()

    async def refresh_if_stale(self) -> bool:
        """Re-read the keys unless that was done within the last second;
        True when it read them."""
        if time.monotonic() - self._refreshed_at < self.REFRESH_INTERVAL:
            return False
        await self.refresh()
        return True

    def reload(self) -> None:
        """Refresh in the background (the lifecycle loop calls this each pass)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self.refresh())

    def kids(self) -> list[str]:
        return sorted(self._keys)

    def active(self) -> SigningKey:
        keys = self._keys
        if not keys:
            raise KeyRingError("no signing key in the store")
        return keys[max(keys)]

    def public_key(self, kid: str) -> Ed25519PublicKey | None:
        key = self._keys.get(kid)
        return None if key is None else key.public

    async def rotate(self) -> str:
        private = Ed25519PrivateKey.generate()
        kid = new_kid(self._keys)
        await self.store.add_signing_key(kid, _pem(private).decode(), datetime.now(UTC))
        await self.refresh()
        return kid

    async def remove(self, kid: str) -> None:
        await self.refresh()
        if kid not in self._keys:
            raise KeyRingError(f"no key {kid}")
        if kid == self.active().kid:
            raise KeyRingError(f"{kid} is the active key; rotate first")
        await self.store.remove_signing_key(kid)
        await self.refresh()


def keys_in_store(settings: Settings) -> bool:
    """Whether signing keys live in the store (a shared PostgreSQL one) rather
    than in the data directory (one host)."""
    return bool(settings.store.url.strip())


async def open_keys(settings: Settings, store: Store) -> KeyRing | StoreKeyRing:
    """The key ring ``settings`` name: the shared store's, or the data directory's."""
    if keys_in_store(settings):
        from podbay.store.cluster_queries import ClusterQueries

        if not isinstance(store, ClusterQueries):
            raise KeyRingError("this store keeps no signing keys")
        return await StoreKeyRing.open(store, adopt=settings.data_dir / "keys")
    return KeyRing.open(settings.data_dir / "keys")
