"""A deployment's volumes: the API's calls, and attach's ``volumes`` checked.

The volumes themselves live on the host that keeps them
(:class:`podbay.host.volumes.VolumeStore`): ``podbay serve`` hands its node's
store here; ``podbay control`` (a cluster) has none yet, and every volume
call is then 501 ``VOLUMES_UNAVAILABLE`` (docs/volumes.md says why).

Which sandboxes mount a volume is read from their records (attach's
``volumes`` is kept in the sandbox's options): delete is refused (409
``VOLUME_IN_USE``) while any sandbox of the deployment names it, running
or not, since a stopped one would mount it again when resumed.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Mapping

from podbay.domain import Deployment
from podbay.domain.options import SandboxOptions, VolumeMount
from podbay.errors import ApiError
from podbay.host import volume_files
from podbay.host.volumes import MIB, VolumeInfo, VolumeStore, check_volume_name
from podbay.runtime.classes import CONTAINER, GVISOR, VM
from podbay.store.base import Store
from podbay.wire.codes import ErrorCode
from podbay.wire.control import Volume, VolumeCreate, VolumeEntry, VolumeEntryList
from podbay.wire.control import VolumeMount as WireVolumeMount

#: The classes whose machines mount volumes (all of them: docs/volumes.md).
VOLUME_CLASSES = frozenset({CONTAINER, GVISOR, VM})
MAX_MOUNTS = 16
MAX_PATH = 256
#: Where no volume may go: the sandbox's own system mounts and podbay's files
#: live there (a volume over ``/etc`` would get runc's mount points for
#: ``/etc/hosts`` made inside it).
RESERVED = ("/proc", "/sys", "/dev", "/etc", "/.podbay")


def _mount_invalid(message: str) -> ApiError:
    return ApiError(ErrorCode.VOLUME_MOUNT_INVALID, message)


def check_mount_path(path: str) -> str:
    if not path.startswith("/") or len(path) > MAX_PATH:
        raise _mount_invalid(f"mount path {path[:80]!r} must be absolute, at most {MAX_PATH} bytes")
    if any(ord(c) <= 0x20 or c in "\x7f,\"'\\$`" for c in path):
        # A vm guest's init reads the mounts as words of a shell variable.
        raise _mount_invalid(
            f"mount path {path[:80]!r} holds whitespace, a control character, a comma, "
            "a quote, a backslash, '$' or '`'"
        )
    if posixpath.normpath(path) != path or path.startswith("//"):
        raise _mount_invalid(
            f"mount path {path!r} is not normal (no '..', '.', '//', trailing '/')"
        )
    if path == "/" or any(path == r or path.startswith(r + "/") for r in RESERVED):
        raise _mount_invalid(
            f"mount path {path!r} is reserved: not /, nor under {', '.join(RESERVED)}"
        )
    return path


def mounts_of(asked: Mapping[str, str | WireVolumeMount]) -> tuple[VolumeMount, ...]:
    """Attach's ``volumes``, checked, sorted by path (so a parent mounts first)."""
    if len(asked) > MAX_MOUNTS:
        raise _mount_invalid(f"at most {MAX_MOUNTS} volumes")
    found: list[VolumeMount] = []
    names: set[str] = set()
    for path, target in asked.items():
        check_mount_path(path)
        name, read_only = (
            (target, False) if isinstance(target, str) else (target.name, target.read_only)
        )
        check_volume_name(name)
        if name in names:
            # One volume twice in one sandbox: two views of one filesystem, of
            # no use, and a read-only one would not be (the other writes).
            raise _mount_invalid(f"volume {name!r} is named twice")
        names.add(name)
        found.append(VolumeMount(path, name, read_only))
    return tuple(sorted(found, key=lambda m: m.path))


def wire_mounts(mounts: tuple[VolumeMount, ...]) -> dict[str, WireVolumeMount] | None:
    if not mounts:
        return None
    return {m.path: WireVolumeMount(name=m.name, read_only=m.read_only) for m in mounts}


def size_of(body: VolumeCreate) -> int:
    if (body.size_bytes is None) == (body.size_mib is None):
        raise ApiError(ErrorCode.VOLUME_SIZE_INVALID, "give size_bytes or size_mib (one of them)")
    if body.size_mib is not None:
        if not 0 < body.size_mib <= (1 << 30):
            raise ApiError(
                ErrorCode.VOLUME_SIZE_INVALID, f"size_mib {body.size_mib} is out of range"
            )
        return body.size_mib * MIB
    assert body.size_bytes is not None
    return body.size_bytes


class VolumeService:
    def __init__(self, store: Store, volumes: VolumeStore | None) -> None:
        self.store = store
        self.volumes = volumes

    def _host(self) -> VolumeStore:
        if self.volumes is None:
            raise ApiError(
                ErrorCode.VOLUMES_UNAVAILABLE,
                "this server keeps no volumes (a cluster's control plane does not yet: "
                "docs/volumes.md)",
            )
        return self.volumes

    async def _users(self, deployment: Deployment) -> dict[str, list[str]]:
        """Volume name → the names of the deployment's sandboxes that mount it."""
        users: dict[str, list[str]] = {}
        for row in await self.store.list_sandboxes(deployment_id=deployment.id):
            for mount in row.options.volumes:
                users.setdefault(mount.name, []).append(row.name)
        return users

    @staticmethod
    def _wire(info: VolumeInfo, users: Mapping[str, list[str]]) -> Volume:
        return Volume(
            name=info.name,
            size_bytes=info.size_bytes,
            used_bytes=info.used_bytes,
            created_at=info.created_at,
            mounted_by=sorted(users.get(info.name, [])),
        )

    async def create(self, deployment: Deployment, body: VolumeCreate) -> Volume:
        host = self._host()
        check_volume_name(body.name)
        info = await host.create(deployment.id, body.name, size_of(body))
        return self._wire(info, {})

    async def list(self, deployment: Deployment) -> list[Volume]:
        host = self._host()
        users = await self._users(deployment)
        return [self._wire(info, users) for info in host.list(deployment.id)]

    async def get(self, deployment: Deployment, name: str) -> Volume:
        host = self._host()
        info = host.get(deployment.id, name)
        return self._wire(info, await self._users(deployment))

    async def delete(self, deployment: Deployment, name: str) -> None:
        host = self._host()
        host.get(deployment.id, name)
        users = (await self._users(deployment)).get(name)
        if users:
            raise ApiError(
                ErrorCode.VOLUME_IN_USE,
                f"volume {name!r} is mounted by sandbox(es) {', '.join(sorted(users))}: "
                "delete them first",
            )
        await host.delete(deployment.id, name)

    # -- files without a sandbox (E2B's volume content calls) -------------------------
    async def read_file(self, deployment: Deployment, name: str, path: str) -> bytes:
        data = await self._host().mounted_data(deployment.id, name)
        return await asyncio.to_thread(volume_files.read, data, path)

    async def write_file(self, deployment: Deployment, name: str, path: str, body: bytes) -> None:
        host = self._host()
        data = await host.mounted_data(deployment.id, name)
        await asyncio.to_thread(volume_files.write, data, path, body, uid=host.uid_base)

    async def delete_path(self, deployment: Deployment, name: str, path: str) -> None:
        data = await self._host().mounted_data(deployment.id, name)
        await asyncio.to_thread(volume_files.delete, data, path)

    async def list_dir(self, deployment: Deployment, name: str, path: str) -> VolumeEntryList:
        data = await self._host().mounted_data(deployment.id, name)
        entries = await asyncio.to_thread(volume_files.listing, data, path)
        return VolumeEntryList(
            entries=[VolumeEntry(name=e.name, type=e.type, size=e.size) for e in entries]
        )

    def check_attach(self, deployment: Deployment, class_: str, options: SandboxOptions) -> None:
        """A new sandbox's volumes exist and its class can mount them."""
        if not options.volumes:
            return
        host = self._host()
        if class_ not in VOLUME_CLASSES:
            raise ApiError(
                ErrorCode.VOLUME_CLASS_UNSUPPORTED,
                f"class {class_!r} cannot mount volumes here; "
                f"{', '.join(sorted(VOLUME_CLASSES))} can (docs/volumes.md)",
            )
        for mount in options.volumes:
            host.get(deployment.id, mount.name)
