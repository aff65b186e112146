"""The ``oci`` driver: each machine is an OCI bundle run by runc (or crun, runsc).

create  = sparse ext4 file for the writable layer, record written → stopped
start   = loop-mount + overlay, bundle, host-made agent socket, ``runc run -d``,
          ``GET /v1/info`` answers → running
suspend = cgroup freezer (memory and files intact; runsc's too); resume = thaw;
          or, for gVisor with ``runtime.checkpoint_classes`` naming ``gvisor``:
          checkpoint to the machine's data area, nothing left running, and
          resume = restore (:mod:`.checkpoint`)
stop    = ``runc delete --force``, unmount; the ext4 file stays → stopped
destroy = all of stop, then the machine's directories → absent

Independent steps of ``start`` run concurrently (storage in a thread while
the bundle, the socket and the network are prepared). Each machine has an
asyncio lock, so concurrent calls for one machine serialise and calls for
different machines overlap. Every call is idempotent.

>>> from podbay.settings import Settings
>>> OciDriver(Settings()).name
'oci'
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from podbay.host import records, storage, userns, volumes
from podbay.host.cgroups import Cgroups, node_pids
from podbay.host.image import Image, ImageCache, Recipe, local_ca_certificates
from podbay.host.layout import NODE_CGROUP, RUN_MODE, Layout, MachinePaths
from podbay.host.tools import check_tool

from ...settings import Settings
from .. import agent_bundle, staging

# The vm driver's header (doctest, these names) reads the same on purpose:
# both drivers implement one interface from the same vocabulary.
from ..base import (
    Capabilities,
    DriverError,
    MachineNotFound,
    MachineSpec,
    MachineState,
    ObservedMachine,
    check_machine_id,
)
from ..classes import GVISOR, checkpointing
from ..machines import RecordKeepingDriver, hosts_file, uts_name
from ..network import NetworkHandle, NetworkManager, slirp
from ..network.manager import until_set
from ..network.policy import budgets
from ..readiness import wait_ready
from ..usage import Usage, cgroup_cpu_memory, filesystem_used, netns_bytes
from . import bundle, checkpoint, runsc
from .namer import Namer
from .runc import Runc

log = logging.getLogger("podbay.runtime.oci")

SOCKET_PATH_MAX = 107


class OciDriver(RecordKeepingDriver):
    name = "oci"
    log = log

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings
        self.rt = settings.runtime
        self.layout = Layout.from_settings(settings)
        self.network = NetworkManager(
            self.layout.run_dir,
            enabled=self.rt.network,
            slirp_limits=slirp.budget(f"{self.layout.cgroup_parent}-net", self.rt.slirp_max_fds),
            budgets=budgets(
                self.rt.egress_bandwidth_mbit, self.rt.egress_new_connections_per_second
            ),
        )
        self.runc: Runc = (
            runsc.Runsc(
                self.rt.oci_runtime,
                self.layout.runc_root,
                platform=self.rt.runsc_platform or "ptrace",
                netns=self.network.netns_path,
            )
            if Path(self.rt.oci_runtime).name == "runsc"
            else Runc(self.rt.oci_runtime, self.layout.runc_root)
        )
        #: Suspend checkpoints to disk (runsc, when the operator asks it for gvisor).
        self.checkpoints = isinstance(self.runc, runsc.Runsc) and GVISOR in checkpointing(settings)
        self.cgroups = Cgroups()
        self.recipe = Recipe(
            mirror=self.rt.image_mirror,
            uid_base=self.rt.uid_base,
            extra_cas=local_ca_certificates(self.rt.image_extra_ca_dir),
        )
        self.capabilities = Capabilities(
            suspend=True,
            stop_keeps_files=True,
            network=self.network.enabled,
            move=True,
            fork=True,
        )
        self._image: Image | None = None
        self._agent_dir: Path | None = None
        #: runsc only: the statx shim preloaded in its sandboxes (runsc.stage_statx_shim).
        self._statx_shim: Path | None = None
        self._argv: list[str] | None = None
        self._records: dict[str, records.MachineRecord] = {}
        #: runsc only: hostnames assigned while suspended, set when resumed.
        self._hostname_on_resume: dict[str, str] = {}
        #: runsc only: a process waiting in each machine named later (:mod:`.namer`).
        self._namers: dict[str, Namer] = {}
        #: A process in each machine's network namespace, for its counters (usage).
        self._net_pid: dict[str, list[int]] = {}

    # -- set-up ---------------------------------------------------------------
    async def prepare(self) -> None:
        if self._argv is not None:
            return
        if os.geteuid() != 0:
            raise DriverError("the oci driver needs root (user namespaces are set up by root)")
        if self.runc.available() is None:
            raise DriverError(
                f"OCI runtime {self.rt.oci_runtime!r} not found (apt-get install runc)"
            )
        # All sandboxes of the node together leave the host pids of its own (a
        # gVisor sandbox's host budget is large: runsc.host_pids).
        try:
            await asyncio.to_thread(self.cgroups.cap_pids, NODE_CGROUP, node_pids())
        except (OSError, DriverError) as exc:
            log.warning("no pids limit over all sandboxes (%s): %s", NODE_CGROUP, exc)
        if isinstance(self.runc, runsc.Runsc):
            self.runc.platform = await asyncio.to_thread(
                runsc.choose_platform, self.runc.binary, self.rt.runsc_platform
            )
        image = await ImageCache(self.layout.image_dir, self.recipe).ensure()
        agent_dir = await asyncio.to_thread(
            staging.stage,
            self.layout.data_dir / "agent",
            python=agent_bundle.image_python(image.rootfs),
        )
        for d in (self.layout.machines, self.layout.runc_root):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.layout.run_dir, RUN_MODE)  # traverse only
        if isinstance(self.runc, runsc.Runsc):
            if not runsc.reachable(image.rootfs):
                raise DriverError(
                    f"runsc's sandbox runs as nobody and cannot reach the base image at "
                    f"{image.rootfs}: let others traverse its parent directories "
                    "(chmod o+x) or set runtime.image_dir elsewhere"
                )
            agent_dir = await asyncio.to_thread(
                runsc.reachable_agent, agent_dir, self.layout.run_dir
            )
            self._statx_shim = await asyncio.to_thread(runsc.stage_statx_shim, self.layout.run_dir)
            if self._statx_shim is not None and (self._statx_shim / "runsc-enter").exists():
                self.runc.enter = self._statx_shim / "runsc-enter"
        self._image, self._agent_dir = image, agent_dir
        await asyncio.to_thread(self._views, image)
        self.network.watch_addresses()
        self._argv = self._agent_argv(image)

    def _views(self, image: Image) -> tuple[Path, Path]:
        """The image's directory and the agent's, as the sources of the sandbox's
        binds: read-only views in the run directory, so its mountinfo names no
        path of the host's (:func:`storage.neutral_view`). Made once each."""
        assert self._agent_dir is not None
        views = self.layout.neutral
        return (
            storage.neutral_view(image.root, views / f"image-{image.key}"),
            storage.neutral_view(self._agent_dir, views / f"agent-{self._agent_dir.name}"),
        )

    def _agent_argv(self, image: Image) -> list[str]:
        private = self.runc.shares_host_kernel
        if private:
            agent_bundle.stage_loader(image.rootfs)
        socket = None if self.runc.passes_fds else f"{runsc.SOCKET_DIR}/{runsc.SOCKET_NAME}"
        shim = self._statx_shim
        launcher = runsc.LAUNCHER_IN_SANDBOX if shim and (shim / "launcher").exists() else None
        waiter = runsc.WAITER_IN_SANDBOX if shim and (shim / "waiter").exists() else None
        return agent_bundle.sandbox_argv(
            image.rootfs, private_loader=private, socket=socket, launcher=launcher, waiter=waiter
        )

    @property
    def machines(self) -> Path:
        return self.layout.machines

    def _paths(self, machine_id: str) -> MachinePaths:
        return self.layout.machine(check_machine_id(machine_id))

    def _record(self, machine_id: str) -> records.MachineRecord:
        record = self._records.get(machine_id)
        home = self._paths(machine_id).home
        if record is not None and not (home / records.RECORD).exists():
            # Destroyed by another process on this data directory (``podbay gc --all``).
            self._records.pop(machine_id, None)
            record = None
        if record is None:
            record = records.read(self._paths(machine_id).home)
            if record is None:
                raise MachineNotFound(f"no machine {machine_id}")
            self._records[machine_id] = record
        return record

    def _save(self, record: records.MachineRecord) -> None:
        records.write(self._paths(record.spec.machine_id).home, record)
        self._records[record.spec.machine_id] = record

    # -- lifecycle ------------------------------------------------------------
    async def _boot(self, record: records.MachineRecord, image: Path | None = None) -> None:
        """Start the machine; ``image``: restored from that checkpoint (runsc)."""
        owned = None
        if self.runc.shares_host_kernel:
            owned = self._owned_userns(self._paths(record.spec.machine_id))
        try:
            await self._boot_in(record, owned, image)
        finally:
            if owned is not None:
                await owned.close()  # the sandbox (and the netns file) hold both now
        machine_id = record.spec.machine_id
        if record.spec.named_later and isinstance(self.runc, runsc.Runsc):
            shim = self._statx_shim
            program = runsc.NAMER_IN_SANDBOX if shim and (shim / "namer").exists() else None
            self._namers[machine_id] = await self.runc.namer(machine_id, program)

    async def _boot_in(
        self,
        record: records.MachineRecord,
        owned: userns.OwnedUserNamespace | None,
        image_path: Path | None = None,
    ) -> None:
        spec = record.spec
        paths = self._paths(spec.machine_id)
        assert self._image is not None
        assert self._agent_dir is not None
        assert self._argv
        image, argv = self._image_for(record)
        if len(str(paths.socket)) > SOCKET_PATH_MAX:
            raise DriverError(
                f"socket path {paths.socket} is too long; set a shorter runtime.run_dir"
            )
        paths.make_run()
        lowers = [*reversed(spec.layers), image.rootfs]

        def storage_and_files() -> None:
            for bind in spec.volumes:
                volumes.remount(bind, self.rt.uid_base)
            _mount_storage(paths, lowers, self.rt.uid_base)
            self._write_files(spec, paths)

        mounted = asyncio.create_task(asyncio.to_thread(storage_and_files))
        # A runc container's packets all pass its namespace's own kernel stack, so
        # it may start once the inet policy is loaded, while slirp4netns brings
        # tap0 up: the network is complete before this returns, and nothing but
        # the agent runs in the sandbox until then. runsc's netstack takes tap0
        # over when it starts: it starts once tap0 is up with its rules, while
        # slirp4netns's budget is still being applied (complete before this
        # returns too).
        early = self.runc.passes_fds
        filtered, tapped = asyncio.Event(), asyncio.Event()
        netns = self.network.netns_path(spec.machine_id)
        socket_dir = paths.run / "agent"

        def write_config() -> None:
            # Needs only paths (and the holder's namespace): written while the
            # disk mounts, so runc starts the moment the rootfs and the policy are.
            image_view, agent_view = self._views(image)
            facts = bundle.BundleFacts(
                machine_id=spec.machine_id,
                hostname=uts_name(spec.hostname),
                rootfs=paths.rootfs,
                image_rootfs=image_view / image.rootfs.name,
                agent_dir=agent_view,
                files_dir=paths.files,
                argv=argv,
                uid_base=self.rt.uid_base,
                memory_bytes=spec.limits.memory_bytes,
                cpus=spec.limits.cpus,
                pids=spec.limits.pids,
                cgroup_path=paths.cgroup,
                netns=netns,
                resolv_conf=True,
                limit_swap=self.cgroups.swap_accounting(),
                loader=(
                    image_view / agent_bundle.LOADER_COPY if self.runc.shares_host_kernel else None
                ),
                # A parked agent (checkpoint) and a hibernated one hold the
                # socket each its own way; a checkpointing class releases the
                # whole sandbox's memory at suspend instead.
                hibernate_seconds=0 if self.checkpoints else self.rt.agent_hibernate_seconds,
                userns=None if owned is None else owned.userns_path,
                volumes=spec.volumes,
            )
            config = bundle.config(facts)
            if not self.runc.passes_fds:
                config = runsc.adapt_config(
                    config,
                    socket_dir,
                    self._statx_shim,
                    volumes=frozenset(v.destination for v in spec.volumes),
                )
            (paths.run / "config.json").write_text(json.dumps(config))

        async def make_network() -> NetworkHandle:
            if owned is None:
                write_config()
                return await self.network.setup(
                    spec.machine_id,
                    filtered=filtered,
                    tapped=tapped,
                    egress=spec.egress,
                    # runsc's --network=sandbox: gVisor's netstack sends its
                    # lookups on tap0, to slirp's forwarder.
                    own_stack=not self.runc.passes_fds,
                )
            await owned.open()
            write_config()
            return await self.network.setup(
                spec.machine_id,
                netns_source=owned.netns_path,
                filtered=filtered,
                egress=spec.egress,
            )

        netns_task = asyncio.create_task(make_network())
        try:
            listener = _listen(paths.socket) if self.runc.passes_fds else None
            if listener is None:
                paths.socket.unlink(missing_ok=True)
                await asyncio.to_thread(storage.remove_tree, socket_dir)
                socket_dir.mkdir(mode=0o700)
                os.chown(socket_dir, self.rt.uid_base, self.rt.uid_base)  # sandbox root
                if image_path is not None:  # the restored agent, parked, binds again
                    (socket_dir / checkpoint.RESUMED).touch(mode=0o444)
        except BaseException:
            await _settle(mounted, netns_task)
            raise
        try:
            # Both settle before anything is judged: a failure (or cancellation) must
            # not leave the other still mounting while the caller cleans up.
            network_up = until_set(filtered if early else tapped, netns_task)
            try:
                results = await asyncio.gather(mounted, network_up, return_exceptions=True)
            except BaseException:
                await _settle(mounted, netns_task)
                raise
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            if listener is None:
                await self.runc.run_detached(
                    spec.machine_id, paths.run, None, paths.console, netns=netns, image=image_path
                )
                ready = asyncio.create_task(
                    runsc.wait_bound(
                        socket_dir / runsc.SOCKET_NAME,
                        paths.socket,
                        self.rt.start_timeout_seconds,
                        alive=lambda: self._observe_alive(spec.machine_id),
                    )
                )
            else:
                # The request waits in the socket's backlog until the agent serves it, so
                # asking now overlaps runc's own exit with the agent's start-up.
                ready = asyncio.create_task(wait_ready(paths.socket, self.rt.start_timeout_seconds))
                try:
                    await self.runc.run_detached(
                        spec.machine_id,
                        paths.run,
                        listener.fileno(),
                        paths.console,
                        inherit_rlimits=bundle.rlimits() if owned is not None else None,
                    )
                    if owned is not None:
                        await owned.close()  # the sandbox's init holds both namespaces now
                except BaseException:
                    ready.cancel()
                    await asyncio.gather(ready, return_exceptions=True)
                    raise
        except BaseException:
            await _settle(netns_task)
            raise
        finally:
            if listener is not None:
                listener.close()
        try:
            await ready
        except BaseException as e:
            await _settle(netns_task)
            if isinstance(e, DriverError):
                raise DriverError(f"{e}; agent output: {_tail(paths.console)}") from None
            raise
        await netns_task  # complete (slirp4netns and tap0's rules) before a command runs

    def _owned_userns(self, paths: MachinePaths) -> userns.OwnedUserNamespace:
        """A user namespace of the machine's own host owner (per-user kernel
        counters are then the machine's own, see :mod:`.userns`)."""
        runs = [p.parent for p in self.layout.run_dir.glob(f"*/{userns.OWNER_FILE}")]
        owner = userns.pick_owner(runs)
        paths.make_run()
        (paths.run / userns.OWNER_FILE).write_text(str(owner))
        return userns.OwnedUserNamespace(owner, self.rt.uid_base, bundle.ID_RANGE)

    def _image_for(self, record: records.MachineRecord) -> tuple[Image, list[str]]:
        """The image the machine's files were made on, while it is cached; else the
        current one (the writable layer then sits on a newer base)."""
        assert self._image is not None
        assert self._argv is not None
        if not record.image or record.image == self._image.key:
            return self._image, self._argv
        old = Image(record.image, self.layout.image_dir / record.image)
        if not (old.root / "complete").is_file():
            log.warning(
                "machine %s: its base image %s is gone; starting on %s",
                record.spec.machine_id,
                record.image,
                self._image.key,
            )
            return self._image, self._argv
        return old, self._agent_argv(old)

    def _write_files(self, spec: MachineSpec, paths: MachinePaths) -> None:
        """The files bound into the sandbox, on its own disk (so what the sandbox
        writes to them counts against its quota) but outside its upper layer."""
        paths.files.mkdir(mode=0o755, exist_ok=True)
        (paths.files / "env.json").write_text(json.dumps(dict(spec.env)))
        name = uts_name(spec.hostname)
        owned = {
            "hostname": name + "\n",
            "hosts": hosts_file(name),
            "resolv.conf": self.network.resolv_conf(),
        }
        for name, text in owned.items():
            path = paths.files / name
            path.write_text(text)
            os.chown(path, self.rt.uid_base, self.rt.uid_base)

    async def stop(self, machine_id: str) -> None:
        async with self._lock(machine_id):
            record = self._record(machine_id)
            await self.release(machine_id)
            # Its processes end with the stop: a checkpoint of them is stale now.
            await asyncio.to_thread(checkpoint.discard, self._paths(machine_id).home)
            if record.commanded is not MachineState.STOPPED:
                self._save(record.with_state(MachineState.STOPPED))
                log.info("machine %s stopped", machine_id)

    async def destroy(self, machine_id: str) -> None:
        self._net_pid.pop(machine_id, None)
        async with self._lock(machine_id):
            paths = self._paths(machine_id)
            await self.release(machine_id, discard=True)
            self._records.pop(machine_id, None)
            existed = paths.home.exists()
            await asyncio.to_thread(storage.remove_tree, paths.home)
            await asyncio.to_thread(storage.remove_tree, paths.run)
            if existed:
                log.info("machine %s destroyed", machine_id)
        self._locks.pop(machine_id, None)

    async def release(self, machine_id: str, *, discard: bool = False) -> None:
        """End the incarnation: container, mounts, network, volatile files; the
        machine's record and disk stay (``discard``: the disk is removed next, so
        what the sandbox last wrote need not reach it). Idempotent; ``podbay gc``
        uses it too."""
        paths = self._paths(machine_id)
        if isinstance(self.runc, runsc.Runsc):
            # Thawed first: every runsc command waits for the sentry, which a
            # frozen cgroup never lets answer. Then whatever its state (see
            # Runsc.delete).
            self.cgroups.thaw_if_frozen(paths.cgroup)
            await self.runc.delete(machine_id, discard=discard)
            await self._end_namer(machine_id)  # its runsc exec ends with the sandbox
        elif (state := await self.runc.query(machine_id)) is not None:
            frozen = state.status == "paused" or self.cgroups.frozen(paths.cgroup)
            if self.runc.is_runc:
                await self.runc.kill_init(
                    machine_id, thaw=lambda: self._thaw_if(frozen, machine_id)
                )
            elif frozen:
                await self._kill_frozen(machine_id)
            await self.runc.delete(machine_id)
        leftover = self.cgroups.remove(paths.cgroup)
        for _ in range(40):
            # runsc's delete returns while gVisor's processes may still be exiting
            # (slowly after an OOM kill); a new start must not inherit the old
            # cgroup and its charges. What is left in it is this machine's own.
            if not leftover or self.runc.is_runc:
                break
            self.cgroups.kill(paths.cgroup)  # thawed first, should it be frozen again
            await asyncio.sleep(0.05)
            leftover = self.cgroups.remove(paths.cgroup)
        if leftover:
            log.warning("machine %s: cgroup dirs stayed: %s", machine_id, leftover)
        if storage.holds_own_mount(paths.rootfs) or storage.holds_own_mount(paths.disk_mount):
            await asyncio.to_thread(storage.unmount_machine, paths.rootfs, paths.disk_mount)
        else:  # a fresh machine's start: nothing to wait for in a thread
            for target in (paths.rootfs, paths.disk_mount):
                with contextlib.suppress(OSError):
                    target.rmdir()
        await self.network.teardown(machine_id)
        for path in (paths.socket, paths.run / "config.json", paths.run / userns.OWNER_FILE):
            path.unlink(missing_ok=True)

    async def _kill_frozen(self, machine_id: str) -> None:
        # Killed while frozen, a process dies as it thaws without running user code.
        await self.runc.call("kill", "--all", machine_id, "KILL", check=False)
        await self._thaw(machine_id)

    async def _thaw_if(self, frozen: bool, machine_id: str) -> None:
        if frozen:
            await self._thaw(machine_id)

    @property
    def _freezes_cgroup(self) -> bool:
        """Suspend is the cgroup freezer (runc, and runsc: gVisor's sentry, gofer
        and stubs are host processes of that cgroup; see :mod:`.runsc`);
        other runtimes are asked to pause."""
        return self.runc.is_runc or isinstance(self.runc, runsc.Runsc)

    async def _freeze(self, machine_id: str) -> None:
        if self.checkpoints and await self._checkpoint(machine_id):
            return
        await self._freeze_in_memory(machine_id)

    async def _freeze_in_memory(self, machine_id: str) -> None:
        if self._freezes_cgroup:
            await self.cgroups.freeze(self._paths(machine_id).cgroup)
        else:
            await self.runc.call("pause", machine_id)

    async def _thaw(self, machine_id: str) -> None:
        if self._checkpointed(machine_id):
            await self._restore(machine_id)
            return
        cgroup = self._paths(machine_id).cgroup
        if self.runc.is_runc:
            self.cgroups.thaw(cgroup)
            return
        if not (self._freezes_cgroup and self.cgroups.thaw_if_frozen(cgroup)):
            # Paused by the runtime (crun, or runsc under an older podbay).
            await self.runc.call("resume", machine_id, check=False)
        hostname = self._hostname_on_resume.pop(machine_id, None)
        if hostname is not None:
            with contextlib.suppress(DriverError):  # e.g. thawed only to be killed
                await self._name_runsc(machine_id, hostname)

    # -- checkpoint to disk (runsc) ------------------------------------------
    def _checkpointed(self, machine_id: str) -> bool:
        """A complete checkpoint image is kept for the machine (then, with no
        container running, it is suspended)."""
        return checkpoint.sealed(self._paths(machine_id).home)

    async def _checkpoint(self, machine_id: str) -> bool:
        """Write the machine's memory and processes to its data area and end
        everything of it on the host (sentry, gofer, stubs, slirp4netns, cgroup,
        mounts, network namespace). ``False`` when runsc could not checkpoint
        it: the machine then runs on as it was (the caller freezes it)."""
        assert isinstance(self.runc, runsc.Runsc)
        paths = self._paths(machine_id)
        started = time.perf_counter()
        socket_dir = paths.run / "agent"
        # The pooled machine's naming process is a runsc exec, with host pipes
        # gVisor cannot save: ended now, the name comes by runsc exec on restore.
        await self._end_namer(machine_id)
        image = await asyncio.to_thread(checkpoint.fresh_image_dir, paths.home)
        (socket_dir / checkpoint.RESUMED).unlink(missing_ok=True)
        try:
            await checkpoint.park_agent(paths.socket, socket_dir)
            parked = time.perf_counter()
        except DriverError as exc:
            log.warning("machine %s: no checkpoint, freezing instead: %s", machine_id, exc)
            await asyncio.to_thread(checkpoint.discard, paths.home)
            if not isinstance(exc, checkpoint.ParkRefused):
                await self._unpark(machine_id)  # it took the park, maybe late
            return False
        # Once: this runsc ends the sandbox after a failed save.
        code, text = await self.runc.call(
            "checkpoint", "--image-path", str(image), machine_id, check=False
        )
        if code != 0:
            first = text.strip().splitlines()[0][:300] if text.strip() else f"exit {code}"
            await asyncio.to_thread(checkpoint.discard, paths.home)
            try:
                await self._unpark(machine_id)
            except DriverError:
                # This runsc ends the sandbox after a failed save (a TCP
                # connection the agent's watch missed, say): its files stay.
                if await self._observe_alive(machine_id):
                    raise
                await self.release(machine_id)
                raise DriverError(
                    f"runsc checkpoint failed and ended the sandbox (its files are kept): {first}"
                ) from None
            log.warning(
                "machine %s: runsc checkpoint failed, freezing instead: %s", machine_id, first
            )
            return False
        saved = time.perf_counter()
        sealed = await asyncio.to_thread(checkpoint.seal, paths.home)
        # Its state is on disk and its sentry exits: the fast end (runsc delete
        # polls for the exit, a second and more), then the rest of the release.
        await self.runc.delete(machine_id, discard=True)
        await self.release(machine_id)
        log.info(
            "machine %s checkpointed in %.0f ms (park %.0f, runsc %.0f, digest and release"
            " %.0f): %d bytes",
            machine_id,
            (time.perf_counter() - started) * 1000,
            (parked - started) * 1000,
            (saved - parked) * 1000,
            (time.perf_counter() - saved) * 1000,
            sealed.bytes,
        )
        return True

    async def _unpark(self, machine_id: str) -> None:
        """A parked agent of a machine still running binds its socket again."""
        paths = self._paths(machine_id)
        socket_dir = paths.run / "agent"
        (socket_dir / checkpoint.RESUMED).touch(mode=0o444)
        await runsc.wait_bound(
            socket_dir / runsc.SOCKET_NAME,
            paths.socket,
            self.rt.start_timeout_seconds,
            alive=lambda: self._observe_alive(machine_id),
        )

    async def _restore(self, machine_id: str) -> None:
        """Start the machine from its checkpoint, once its digest holds; returns
        when the agent answers. A failure leaves it suspended, image kept."""
        paths = self._paths(machine_id)
        started = time.perf_counter()
        await asyncio.to_thread(checkpoint.verify, paths.home)
        verified = time.perf_counter()
        await self.prepare()
        record = self._record(machine_id)
        await self.release(machine_id)  # whatever a dead incarnation left
        try:
            await self._boot(record, checkpoint.image_dir(paths.home))
        except BaseException as e:
            log.warning("machine %s: restore failed, still suspended: %s", machine_id, e)
            await self.release(machine_id)
            raise
        await asyncio.to_thread(checkpoint.discard, paths.home)
        hostname = self._hostname_on_resume.pop(machine_id, None)
        if hostname is not None:
            await self._name_runsc(machine_id, hostname)
        log.info(
            "machine %s restored in %.0f ms (digest check %.0f)",
            machine_id,
            (time.perf_counter() - started) * 1000,
            (verified - started) * 1000,
        )

    async def _adopt_network(self, machine_id: str) -> bool:
        # A checkpointed machine has no network until it is restored.
        if self._checkpointed(machine_id) and await self._observe(machine_id) is not (
            MachineState.RUNNING
        ):
            return True
        return await super()._adopt_network(machine_id)

    async def _hold_still(self, machine_id: str, observed: MachineState) -> None:
        """Frozen, then the host's cache of its disk's filesystem written into
        the disk file: a copy of the file then holds every write the sandbox
        made (the ext4 journal replays on the copy's first mount)."""
        # In memory even where suspend checkpoints: a fork copies files only
        # (its memory hook is empty), and a freeze is milliseconds.
        if observed is MachineState.RUNNING:
            await self._freeze_in_memory(machine_id)
        mount = self._paths(machine_id).disk_mount
        if storage.holds_own_mount(mount):
            await asyncio.to_thread(storage.syncfs, mount)

    async def _name_runsc(self, machine_id: str, hostname: str) -> None:
        """Through the process waiting for it when there is one, else ``runsc exec``."""
        assert isinstance(self.runc, runsc.Runsc)
        namer = self._namers.pop(machine_id, None)
        if namer is None or not await namer.name(hostname):
            await self.runc.set_hostname(machine_id, hostname)

    async def _end_namer(self, machine_id: str) -> None:
        namer = self._namers.pop(machine_id, None)
        if namer is not None:
            await namer.close()

    async def export_layer(self, machine_id: str, dest: Path) -> None:
        """Copy a stopped machine's writable layer (deletions included, as overlay
        whiteouts) to ``dest``, for :attr:`MachineSpec.layers` of other machines."""
        async with self._lock(machine_id):
            await self._release_stopped(machine_id)
            paths = self._paths(machine_id)
            paths.make_run()
            await asyncio.to_thread(
                storage.mount_disk, paths.disk_image, paths.disk_mount, readonly=True
            )
            try:
                await storage.copy_layer(paths.disk_mount / "upper", dest)
            finally:
                await asyncio.to_thread(storage.unmount_machine, paths.rootfs, paths.disk_mount)

    async def assign(self, machine_id: str, *, hostname: str, labels: Mapping[str, str]) -> None:
        async with self._lock(machine_id):
            record = self._record(machine_id)
            spec = record.spec
            new = dataclasses.replace(
                record,
                spec=dataclasses.replace(
                    spec, hostname=hostname, labels=dict(labels), named_later=False
                ),
            )
            # Written (fsync'd: a restart must not take the sandbox for a pool's
            # machine) in a thread while the name is set, not on the loop after it.
            saving = asyncio.ensure_future(asyncio.to_thread(self._save, new))
            try:
                await self._rename(machine_id, uts_name(hostname))
            finally:
                await _settle(saving)
            await saving

    async def _rename(self, machine_id: str, name: str) -> None:
        state = await self.runc.query(machine_id)
        if state is None or state.status not in ("running", "paused"):
            if self._checkpointed(machine_id):
                # Its kernel's name is in the image: set once it is restored.
                self._hostname_on_resume[machine_id] = name
            return
        paths = self._paths(machine_id)
        suspended = state.status == "paused" or self.cgroups.frozen(paths.cgroup)
        for file, text in (("hostname", name + "\n"), ("hosts", hosts_file(name))):
            _rewrite_in_place(paths.files / file, text)
        if isinstance(self.runc, runsc.Runsc):
            if suspended:  # nothing runs in it: set on resume
                self._hostname_on_resume[machine_id] = name
            else:
                await self._name_runsc(machine_id, name)
        else:
            await _set_hostname(state.pid, name)

    # -- observation ----------------------------------------------------------
    async def usage(self, machine_id: str) -> Usage | None:
        """The machine's cgroup (runc's container; runsc's sentry, gofer and
        stubs), its disk and its network namespace (:mod:`..usage`)."""
        try:
            record = self._record(machine_id)
        except MachineNotFound:
            return None
        paths = self._paths(machine_id)
        read = cgroup_cpu_memory(self.cgroups, paths.cgroup)
        if read is None:
            return None
        hint = self._net_pid.setdefault(machine_id, [])
        procs = functools.partial(self.cgroups.procs, paths.cgroup)
        net = netns_bytes(procs, self.network.netns_path(machine_id), hint)
        return Usage(
            cpu_seconds=read[0],
            memory_bytes=read[1],
            memory_limit_bytes=record.spec.limits.memory_bytes,
            disk_bytes=filesystem_used(paths.disk_mount),
            net_rx_bytes=net[0],
            net_tx_bytes=net[1],
            oom_kills=read[2],
        )

    async def _observe_alive(self, machine_id: str) -> bool:
        return await self._observe(machine_id) is not MachineState.STOPPED

    async def _observe(self, machine_id: str) -> MachineState:
        state = await self.runc.query(machine_id)
        if state is None or state.status not in ("running", "paused"):
            if self._checkpointed(machine_id):
                return MachineState.SUSPENDED
            return MachineState.STOPPED
        if state.status == "paused" or self.cgroups.frozen(self._paths(machine_id).cgroup):
            return MachineState.SUSPENDED
        return MachineState.RUNNING

    async def adopt(self) -> list[ObservedMachine]:
        """Every machine of this data directory, as it is now; dead incarnations
        (agent gone, mounts without a container) are cleaned up to ``stopped``."""
        self._records.clear()  # read again from disk, as adopted
        found = await self._adopt_records()
        known = {machine.machine_id for machine in found}
        for orphan in set(self.runc.container_ids()) - known:
            # Under its lock, read again: a create and start that ran beside
            # this adopt (a control plane reconciling a node it is already
            # placing sandboxes on) made the record after the listing above,
            # and its container is no orphan.
            async with self._lock(orphan):
                if records.read(self._paths(orphan).home) is not None:
                    continue
                log.warning("removing container %s, which has no machine record", orphan)
                if self._freezes_cgroup:  # a frozen sentry would never answer runsc's delete
                    with contextlib.suppress(ValueError, DriverError):
                        self.cgroups.thaw_if_frozen(self._paths(orphan).cgroup)
                await self.runc.delete(orphan)
        return found

    async def close(self) -> None:
        for machine_id in list(self._namers):
            await self._end_namer(machine_id)
        await self._writes_done()
        self._records.clear()
        await self.network.close()


# -- helpers that serve only this module -----------------------------------------------


def _mount_storage(paths: MachinePaths, lowers: list[Path], uid_base: int) -> None:
    storage.mount_disk(paths.disk_image, paths.disk_mount)
    upper, work = storage.prepare_upper(paths.disk_mount, uid_base)
    storage.mount_overlay(paths.rootfs, lowers, upper, work)


async def _settle(*tasks: asyncio.Future[Any]) -> None:
    """Wait for ``tasks`` to finish whatever happens to the caller (a thread
    running a mount cannot be cancelled, only waited for)."""
    pending = [t for t in tasks if not t.done()]
    while pending:
        with contextlib.suppress(BaseException):
            await asyncio.shield(asyncio.gather(*pending, return_exceptions=True))
        pending = [t for t in pending if not t.done()]
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: no "never retrieved" warning


def _listen(path: Path) -> socket.socket:
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o660)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def _rewrite_in_place(path: Path, text: str) -> None:
    # Bind-mounted into the sandbox: the inode must stay. The file lives in a
    # host-only directory, so its type cannot have been changed from inside.
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


async def _set_hostname(pid: int, hostname: str) -> None:
    await check_tool(
        "nsenter",
        "--target",
        str(pid),
        "--uts",
        "--",
        "hostname",
        hostname,
        failed="setting hostname failed",
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "(none)"
    return " | ".join(text[-lines:]) or "(none)"
