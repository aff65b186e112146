"""The ``vm`` driver: each machine is a QEMU microVM with its own kernel.

create  = sparse ext4 file for the writable layer, record written → stopped
start   = base image and layers as read-only ext4 disks (packed once), this
          boot's configuration appended to the cached initramfs, QEMU started
          (daemonised, so it outlives the node), the relay connected, ``GET
          /v1/info`` answers → running
suspend = QMP ``stop`` (vCPUs halted, memory kept); resume = QMP ``cont``;
          with ``vm`` in ``runtime.checkpoint_classes``, suspend writes the
          guest's memory and devices to the machine's data directory and QEMU
          exits, and resume restores it (``checkpoint.py``)
stop    = QEMU killed (a checkpointed guest restored first, to flush); the
          disk stays → stopped
destroy = all of stop, then the machine's directories → absent
adopt   = every record; a live QEMU (pid file, its command line, QMP status)
          gets a new relay, which says hello to the guest again; a checkpoint
          without a QEMU is a suspended machine

The guest's init (``initramfs.py``) mounts the overlay and hands over to
``guest/init.py``, which execs the agent as PID 1. The agent channel is a
virtio-serial port (no guest network needed), multiplexed by ``relay.py``.

>>> from podbay.settings import Settings
>>> VmDriver(Settings()).name
'vm'
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import resource
import shlex
import shutil
import signal
from collections.abc import Mapping
from pathlib import Path

from podbay.host import records, storage
from podbay.host import volumes as host_volumes
from podbay.host.cgroups import Cgroups
from podbay.host.image import Image, ImageCache, Recipe, local_ca_certificates
from podbay.host.layout import Layout
from podbay.host.tools import check_tool

from ...errors import PodbayError
from ...settings import Settings
from .. import agent_bundle, staging

# The oci driver's header (doctest, these names) reads the same on purpose:
# both drivers implement one interface from the same vocabulary.
from ..base import (
    Capabilities,
    DriverError,
    Limits,
    MachineNotFound,
    MachineSpec,
    MachineState,
    ObservedMachine,
    check_machine_id,
)
from ..classes import VM, checkpointing
from ..machines import RecordKeepingDriver, hosts_file, uts_name
from ..network import NetworkManager, slirp
from ..network.policy import budgets
from ..readiness import wait_ready
from ..usage import Usage, cgroup_cpu_memory
from . import checkpoint, disks, initramfs, qmp, templates
from . import volumes as vm_volumes
from .budget import QEMU_MALLOC_ENV, QemuBudget, guest_cpus, guest_mib, qemu_budget
from .checkpoint import Checkpoint
from .guest_stats import GuestStats
from .qemu import (
    AGENT_OPTIONS,
    BOOTED,
    GUEST_NETWORK,
    KERNEL_DIR,
    QEMU,
    VmPaths,
    kernel_release,
    qemu_argv,
)
from .relay import Relay, RelayLoop
from .template_builder import TemplateBuilder, running

#: How long a metrics sample waits for the guest's figures.
STATS_SECONDS = 2.0
log = logging.getLogger("podbay.runtime.vm")

#: How long stop waits for the guest to write its page cache to its disk.
SYNC_SECONDS = 30.0
GUEST_INIT = (
    "import sys; sys.path.insert(0, '/.podbay/agent'); from podbay_vm.init import main; main()"
)


class VmDriver(RecordKeepingDriver):
    name = "vm"
    log = log

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings
        self.rt = settings.runtime
        self.layout = Layout.from_settings(settings)
        self.accel = self.rt.vm_accel
        #: Restore first starts from a saved, booted guest (see templates.py).
        self.templates_enabled = True
        if self.accel not in ("tcg", "kvm"):
            raise DriverError(f"runtime.vm_accel must be tcg or kvm, not {self.accel!r}")
        self.home = self.layout.data_dir / "vm"
        self.run_root = self.layout.run_dir / "vm"
        self.recipe = Recipe(
            mirror=self.rt.image_mirror,
            uid_base=self.rt.uid_base,
            extra_cas=local_ca_certificates(self.rt.image_extra_ca_dir),
        )
        # The guest's NIC is QEMU's user-mode network, and QEMU runs inside the
        # machine's host-owned namespace: every packet the guest sends leaves as
        # QEMU's own socket there, under the same nftables policy as a container's.
        # Its slirp4netns has the OCI classes' budget; QEMU has one of its own
        # (:meth:`_confined`): both run on the host, outside any guest limit.
        self.network = NetworkManager(
            self.run_root / "net",
            enabled=self.rt.network,
            slirp_limits=slirp.budget(f"{self.layout.cgroup_parent}-vm-net", self.rt.slirp_max_fds),
            budgets=budgets(
                self.rt.egress_bandwidth_mbit, self.rt.egress_new_connections_per_second
            ),
        )
        self.cgroups = Cgroups()
        #: ``<this>/<machine id>``: the cgroup of a machine's QEMU.
        self.cgroup_parent = f"{self.layout.cgroup_parent}-vm"
        #: The guests' own figures for metrics, over one kept connection each.
        self.guest_stats = GuestStats()
        # A stopped machine's disk is a sparse ext4 file as the OCI driver's
        # is: it moves with the same stream (RecordKeepingDriver.export_disk).
        self.capabilities = Capabilities(
            suspend=True,
            stop_keeps_files=True,
            network=self.network.enabled,
            move=True,
            fork=True,
        )
        self._image: Image | None = None
        self._base_disk: Path | None = None
        self._initramfs: Path | None = None
        self._kernel: Path | None = None
        self._init_argv: list[str] = []
        self._relays: dict[str, Relay] = {}
        self.relay_loop = RelayLoop()
        self.template_builder = TemplateBuilder(self)
        #: Suspend writes the guest to disk and ends its QEMU (see checkpoint.py).
        self.checkpoints = VM in checkpointing(settings)

    @property
    def machines(self) -> Path:
        return self.home / "machines"

    # -- set-up ---------------------------------------------------------------
    async def prepare(self) -> None:
        if self._initramfs is not None:
            return
        if os.geteuid() != 0:
            raise DriverError("the vm driver needs root (it builds disk images as root)")
        if shutil.which(QEMU) is None:
            raise DriverError(f"{QEMU} not found (apt-get install qemu-system-x86)")
        release = kernel_release()
        image = await ImageCache(self.layout.image_dir, self.recipe).ensure()
        agent_dir = await asyncio.to_thread(
            staging.stage,
            self.layout.data_dir / "agent",
            python=agent_bundle.image_python(image.rootfs),
        )
        base_disk = await disks.pack(image.rootfs, image.root / "guest.ext4", self.rt.uid_base)
        built = await asyncio.to_thread(
            initramfs.build, self.home, kernel_release=release, agent_dir=agent_dir
        )
        for d in (self.machines, self.run_root):
            d.mkdir(parents=True, exist_ok=True)
        await self.template_builder.clear_leftovers()
        os.chmod(self.layout.run_dir, 0o711)  # noqa: S103 - traverse only
        # The guest's root owns everything in it, so the agent needs no
        # execute-only loader (a container's defence against its own root). The
        # init becomes the agent in the same interpreter (see guest/init.py).
        python = agent_bundle.image_python(image.rootfs, inside=True)
        self._init_argv = [*python, "-I", "-S", "-c", GUEST_INIT]
        self._image, self._base_disk, self._kernel = (
            image,
            base_disk,
            KERNEL_DIR / f"vmlinuz-{release}",
        )
        self._initramfs = built
        # A guest must not reach an address the host gains after it started
        # (QEMU's sockets meet the same per-namespace rules as a container's).
        self.network.watch_addresses()
        if self.templates_enabled and self.rt.warm_pool > 0:
            # The shape a default attach asks for, ready before the first one.
            self.template_builder.ensure(
                self.template_builder.shape(
                    MachineSpec(
                        machine_id="default",
                        hostname="sandbox",
                        limits=Limits(
                            memory_bytes=self.rt.memory_bytes,
                            cpus=self.rt.cpus,
                            pids=self.rt.pids,
                            disk_bytes=self.rt.disk_bytes,
                        ),
                    )
                ),
                [],
            )

    async def wait_templates(self, within: float = templates.BUILD_SECONDS) -> None:
        """Until every template being built is ready (or failed): for benchmarks."""
        await self.template_builder.wait(within)

    def _paths(self, machine_id: str) -> VmPaths:
        check_machine_id(machine_id)
        return VmPaths(self.machines / machine_id, self.run_root / machine_id)

    def _record(self, machine_id: str) -> records.MachineRecord:
        record = records.read(self._paths(machine_id).home)
        if record is None:
            raise MachineNotFound(f"no machine {machine_id}")
        return record

    def _save(self, record: records.MachineRecord) -> None:
        records.write(self._paths(record.spec.machine_id).home, record)

    # -- lifecycle ------------------------------------------------------------
    def argv(
        self,
        spec: MachineSpec,
        paths: VmPaths,
        layers: list[Path],
        *,
        network: bool,
        initrd: Path | None = None,
        volume_sockets: list[Path] | None = None,
    ) -> list[str]:
        assert self._kernel is not None
        assert self._base_disk is not None
        return qemu_argv(
            machine_id=spec.machine_id,
            memory_mib=guest_mib(spec),
            cpus=guest_cpus(spec),
            accel=self.accel,
            kernel=self._kernel,
            initrd=initrd or paths.initrd,
            disks=[self._base_disk, *layers],
            paths=paths,
            network=network,
            volume_sockets=volume_sockets,
        )

    async def _layer_disks(self, spec: MachineSpec) -> list[Path]:
        out = []
        for layer in spec.layers:
            if not layer.is_dir():
                raise DriverError(f"layer {layer} is missing")
            target = self.home / "layers" / f"{disks.layer_key(layer)}.ext4"
            out.append(await disks.pack(layer, target, self.rt.uid_base))
        return out

    def boot_inputs(self, layers: list[Path]) -> list[Path]:
        """The files a guest of ``layers`` boots from (a template's key and its
        ``complete`` list: see templates.stale)."""
        assert self._initramfs is not None
        assert self._base_disk is not None
        assert self._kernel is not None
        return [self._kernel, self._initramfs, self._base_disk, *layers]

    async def _boot(self, record: records.MachineRecord) -> None:
        spec = record.spec
        paths = self._paths(spec.machine_id)
        assert self._initramfs is not None
        if len(str(paths.socket)) > 107:
            raise DriverError(
                f"socket path {paths.socket} is too long; set a shorter runtime.run_dir"
            )
        paths.run.mkdir(parents=True, exist_ok=True)
        os.chmod(paths.run, 0o700)
        # A save a crash cut short (a whole checkpoint makes the machine
        # suspended: it is restored, never booted, and stays).
        shutil.rmtree(Checkpoint(paths.home).partial, ignore_errors=True)
        layers = await self._layer_disks(spec)
        template = None
        builder = self.template_builder
        # A guest with volumes shares its memory with their daemons: it boots cold.
        fits = builder.fits(spec) and not spec.volumes
        if self.templates_enabled and not paths.booted.exists() and fits:
            template = builder.ensure(builder.shape(spec), layers)
        handle = await self.network.setup(spec.machine_id, egress=spec.egress)
        paths.booted.touch()
        if template is not None:
            await builder.restore(spec, paths, layers, template, network=handle.enabled)
        else:
            await self._cold_boot(spec, paths, layers, handle.resolv_conf, network=handle.enabled)
        within = max(self.rt.start_timeout_seconds, 120.0 if self.accel == "tcg" else 30.0)
        try:
            await wait_ready(paths.socket, within)
        except DriverError as e:
            raise DriverError(f"{e}; guest console: {await self._console(paths)}") from None

    def boot_files(
        self,
        paths: VmPaths,
        config: dict[str, object],
        env: Mapping[str, str],
        hostname: str,
        resolv_conf: str,
        layers: int,
        network: bool,
        volumes: str = "",
    ) -> None:
        assert self._initramfs is not None
        run_files = {
            "config.json": json.dumps(config),
            "env.json": json.dumps(dict(env)),
            "hostname": hostname + "\n",
            "hosts": hosts_file(hostname),
            "resolv.conf": resolv_conf,
        }
        initramfs.boot_archive(
            self._initramfs,
            paths.initrd,
            variables={
                "LAYERS": str(layers),
                "NETWORK": "1" if network else "",
                "VOLUMES": volumes,
                "INIT_ENV": shlex.join(f"{k}={v}" for k, v in staging.AGENT_ENV.items()),
            },
            init_argv=self._init_argv,
            network_script=GUEST_NETWORK,
            run_files=run_files,
        )

    async def launch(self, spec: MachineSpec, argv: list[str]) -> None:
        machine_id = spec.machine_id
        confined = await asyncio.to_thread(self._confined, spec)
        await check_tool(
            *confined,
            *self.network.enter_argv(machine_id),
            *argv,
            failed="qemu failed",
            new_session=True,
        )

    # -- QEMU's host budget ---------------------------------------------------
    def cgroup(self, machine_id: str) -> str:
        """The cgroup of the machine's QEMU (made at each start, removed at stop)."""
        return f"{self.cgroup_parent}/{machine_id}"

    def qemu_budget(self, spec: MachineSpec) -> QemuBudget:
        """What QEMU may use on the host: the guest's RAM and CPUs, and its own share."""
        return qemu_budget(spec, self.rt.slirp_max_fds if self.network.enabled else 0)

    def _confined(self, spec: MachineSpec) -> list[str]:
        """A command prefix: what follows starts in the QEMU cgroup (made first,
        so every page QEMU touches is charged there, a restored guest's RAM
        included), under its descriptor cap and malloc setting."""
        budget = self.qemu_budget(spec)
        procs = self.cgroups.limit(
            self.cgroup(spec.machine_id),
            memory_bytes=budget.memory_bytes,
            pids=budget.pids,
            cpus=budget.cpus,
        )
        moves = "".join(f"echo $$ > {shlex.quote(str(p))} && " for p in procs)
        script = f'{moves}ulimit -n {budget.max_fds} && export {QEMU_MALLOC_ENV} && exec "$@"'
        return ["sh", "-c", script, "podbay-qemu"]

    def _reconfine(self, spec: MachineSpec, pid: int) -> None:
        """An adopted QEMU keeps its budget (one started before budgets existed
        gets it now; what it touched before stays charged where it was)."""
        budget = self.qemu_budget(spec)
        self.cgroups.confine(
            self.cgroup(spec.machine_id),
            pid,
            memory_bytes=budget.memory_bytes,
            pids=budget.pids,
            cpus=budget.cpus,
        )
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (budget.max_fds, budget.max_fds))

    async def drop_cgroup(self, machine_id: str) -> None:
        """Remove the QEMU cgroup once its QEMU has gone (a killed one leaves
        within milliseconds; one still there keeps it, and ``podbay gc`` retries)."""
        for _ in range(200):
            if not await asyncio.to_thread(self.cgroups.remove, self.cgroup(machine_id)):
                return
            await asyncio.sleep(0.01)
        log.warning("machine %s: its QEMU cgroup is still in use", machine_id)

    async def _cold_boot(
        self,
        spec: MachineSpec,
        paths: VmPaths,
        layers: list[Path],
        resolv_conf: str,
        *,
        network: bool,
    ) -> None:
        name = uts_name(spec.hostname)
        config: dict[str, object] = {
            "hostname": name,
            "pids": spec.limits.pids,
            "agent_options": AGENT_OPTIONS,
        }
        await asyncio.to_thread(
            self.boot_files,
            paths,
            config,
            spec.env,
            name,
            resolv_conf,
            len(layers),
            network,
            vm_volumes.guest_spec(spec.volumes),
        )
        for bind in spec.volumes:
            await asyncio.to_thread(host_volumes.remount, bind, self.rt.uid_base)
        sockets = await vm_volumes.serve(spec.volumes, paths.run, self.rt.uid_base)
        argv = self.argv(spec, paths, layers, network=network, volume_sockets=sockets)
        await self.launch(spec, argv)
        await self.start_relay(spec.machine_id, paths)

    async def start_relay(self, machine_id: str, paths: VmPaths) -> Relay:
        """The relay of a guest QEMU has just started (booting or restoring)."""
        relay = Relay(machine_id, paths.socket, paths.mux, fresh=True)
        self._relays[machine_id] = relay
        await self.relay_loop.call(relay.start())
        return relay

    async def _console(self, paths: VmPaths) -> str:
        try:
            text = await qmp.execute(
                paths.qmp, "ringbuf-read", {"device": "console", "size": 65536}, within=3
            )
        except (OSError, TimeoutError, DriverError):
            return "(unavailable)"
        lines = str(text).strip().splitlines()
        return " | ".join(lines[-8:]) or "(empty)"

    async def _freeze(self, machine_id: str) -> None:
        if self.checkpoints:
            await self._checkpoint(machine_id)
        else:
            await qmp.execute(self._paths(machine_id).qmp, "stop")

    async def _thaw(self, machine_id: str) -> None:
        paths = self._paths(machine_id)
        saved = Checkpoint(paths.home)
        if self._qemu_pid(paths) is None and saved.exists():
            await self._restore(machine_id)
            return
        await qmp.execute(paths.qmp, "cont")
        if saved.exists():
            # Beside a live QEMU: a node ended between writing it and killing
            # that QEMU. The guest runs on from its memory; the file is stale.
            await asyncio.to_thread(saved.discard)
        await self._set_clock(machine_id)

    async def _checkpoint(self, machine_id: str) -> None:
        """Suspend to disk: the guest's memory and devices into its checkpoint,
        then QEMU, its relay and its network end (no host memory is left)."""
        paths = self._paths(machine_id)
        saved = Checkpoint(paths.home)
        self.guest_stats.forget(machine_id)
        # The agent channel closed first, as a template's: the guest saved sees
        # its host end gone, and the relay of the restore opens it anew.
        relay = self._relays.pop(machine_id, None)
        if relay is not None:
            await self.relay_loop.call(relay.close())
        try:
            await checkpoint.save(paths.qmp, saved, self._started_initrd(paths))
            # Sealed before QEMU is killed: once the migration completed QEMU
            # writes the disk no more, and a node ended here leaves a paused
            # QEMU (resumed with ``cont``), never a machine with neither.
            await asyncio.to_thread(checkpoint.seal, saved, paths.disk_image)
        except DriverError as e:
            # The guest is stopped in QEMU: suspended the freezer's way.
            log.warning("machine %s: no checkpoint, kept in memory: %s", machine_id, e)
            await asyncio.to_thread(saved.discard)
            await self._adopt_live(machine_id)  # its relay again
            return
        except BaseException:
            await asyncio.to_thread(saved.discard)
            raise
        await self.release(machine_id)

    async def _restore(self, machine_id: str) -> None:
        """Start QEMU from the machine's checkpoint; the guest runs on where it
        stood. A checkpoint that fails its check, or a QEMU that cannot load
        it, raises :class:`DriverError` with the machine left suspended."""
        spec = self._record(machine_id).spec
        paths = self._paths(machine_id)
        saved = Checkpoint(paths.home)
        await asyncio.to_thread(checkpoint.verify, saved, paths.disk_image)
        await self.prepare()
        paths.run.mkdir(parents=True, exist_ok=True)
        os.chmod(paths.run, 0o700)
        layers = await self._layer_disks(spec)
        try:
            handle = await self.network.setup(machine_id, egress=spec.egress)
            # Back in the run directory, where the next checkpoint takes it from.
            await asyncio.to_thread(checkpoint.copy_private, saved.initrd, paths.initrd)
            argv = self.argv(spec, paths, layers, network=handle.enabled)
            await self.launch(spec, [*argv, *checkpoint.incoming(saved)])
            await checkpoint.wait_loaded(paths.qmp, lambda: self._qemu_pid(paths) is not None)
            relay = await self.start_relay(machine_id, paths)
            await qmp.execute(paths.qmp, "cont")
        except BaseException as e:
            console = await self._console(paths)
            await self.release(machine_id)
            if isinstance(e, DriverError | OSError | TimeoutError):
                raise DriverError(
                    f"machine {machine_id}: restoring its checkpoint failed: {e};"
                    f" guest console: {console}"
                ) from None
            raise
        # The guest runs and writes its disk from here: the checkpoint is stale.
        await asyncio.to_thread(saved.discard)
        await self.relay_loop.call(relay.set_clock())
        # A name given while it was on disk (assign recorded it only).
        await self.relay_loop.call(relay.set_hostname(uts_name(spec.hostname)))

    async def _set_clock(self, machine_id: str) -> None:
        """The guest's wall clock stood still while QEMU was stopped: set it to
        the host's (every start of a stopped guest: resume, a template's restore)."""
        relay = self._relays.get(machine_id)
        if relay is not None:
            await self.relay_loop.call(relay.set_clock())

    async def stop(self, machine_id: str) -> None:
        self.guest_stats.forget(machine_id)
        async with self._lock(machine_id):
            record = self._record(machine_id)
            await self.release(machine_id, flush=True)
            await asyncio.to_thread(Checkpoint(self._paths(machine_id).home).discard)
            if record.commanded is not MachineState.STOPPED:
                self._save(record.with_state(MachineState.STOPPED))

    def _imported(self, home: Path) -> None:
        # Its disk has been used (it holds the sandbox's files): its next start
        # boots it, where a first start would copy a template's disk over it.
        (home / BOOTED).touch()

    async def destroy(self, machine_id: str) -> None:
        self.guest_stats.forget(machine_id)
        async with self._lock(machine_id):
            paths = self._paths(machine_id)
            await self.release(machine_id)
            await asyncio.to_thread(shutil.rmtree, paths.home, True)
            await asyncio.to_thread(shutil.rmtree, paths.run, True)
        self._locks.pop(machine_id, None)

    async def _hold_still(self, machine_id: str, observed: MachineState) -> None:
        """The guest writes its page cache to its disk (a suspended one is let
        run for that, as :meth:`stop` does), then QEMU stops it, which also
        flushes QEMU's own writes to the disk file."""
        await self._flush(machine_id)
        await qmp.execute(self._paths(machine_id).qmp, "stop")

    async def _let_go(self, machine_id: str, observed: MachineState) -> None:
        if observed is MachineState.RUNNING:
            await self._thaw(machine_id)
        # A suspended source stays stopped, as it was found.

    async def _flush(self, machine_id: str) -> None:
        """Before QEMU is killed: the guest writes its page cache to its disk (a
        suspended guest is resumed for that), so stop keeps every file."""
        paths = self._paths(machine_id)
        if self._qemu_pid(paths) is None and Checkpoint(paths.home).exists():
            # Its page cache is in the checkpoint: restored, it writes it out.
            try:
                await self._restore(machine_id)
            except DriverError as e:
                log.warning(
                    "machine %s stops with its disk as its checkpoint left it: %s", machine_id, e
                )
                return
        relay = self._relays.get(machine_id)
        observed = await self._observe(machine_id)
        if relay is None or observed is MachineState.STOPPED:
            return
        if observed is MachineState.SUSPENDED:
            await qmp.execute(paths.qmp, "cont")
        if not await self.relay_loop.call(relay.sync(SYNC_SECONDS)):
            log.warning("machine %s did not flush its disk before stopping", machine_id)

    async def release(self, machine_id: str, *, flush: bool = False) -> None:
        """End the incarnation (QEMU, relay, volatile files); the disk stays
        (with ``flush``, everything the guest wrote to it)."""
        paths = self._paths(machine_id)
        if flush:
            await self._flush(machine_id)
        relay = self._relays.pop(machine_id, None)
        if relay is not None:
            await self.relay_loop.call(relay.close())
        pid = self._qemu_pid(paths)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            for _ in range(500):
                if not running(pid):
                    break
                await asyncio.sleep(0.01)
        await self.drop_cgroup(machine_id)
        await self.network.teardown(machine_id)
        for path in (paths.socket, paths.mux, paths.qmp, paths.pidfile, paths.initrd):
            path.unlink(missing_ok=True)
        record = records.read(paths.home)
        binds = record.spec.volumes if record is not None else ()
        await asyncio.to_thread(vm_volumes.release, paths.run, binds)

    def _started_initrd(self, paths: VmPaths) -> Path:
        """The boot archive the machine's QEMU was started with: its own, or
        for a machine restored from a template, the template's."""
        pid = self._qemu_pid(paths)
        if pid is not None:
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if b"-initrd" in argv[:-1]:
                    return Path(os.fsdecode(argv[argv.index(b"-initrd") + 1]))
        return paths.initrd

    def qemu_pid(self, machine_id: str) -> int | None:
        """The live QEMU of a machine (it holds the guest's memory), if any."""
        return self._qemu_pid(self._paths(machine_id))

    def _qemu_pid(self, paths: VmPaths) -> int | None:
        """QEMU's pid, when the pid file names a live QEMU of this machine."""
        try:
            pid = int(paths.pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        if f"unix:{paths.qmp},".encode() not in cmdline:
            return None  # the pid was reused
        return pid

    async def export_layer(self, machine_id: str, dest: Path) -> None:
        """Copy a stopped machine's writable layer to ``dest``, in the shifted
        ownership every class's layers use. The guest could have written anything
        to its disk, so the file system is checked (``e2fsck``, in user space)
        before the host kernel mounts it read-only."""
        async with self._lock(machine_id):
            await self._release_stopped(machine_id)
            paths = self._paths(machine_id)
            # e2fsck: 1 and 2 mean "errors corrected".
            await check_tool(
                "e2fsck",
                "-f",
                "-y",
                str(paths.disk_image),
                failed="the machine's disk is damaged",
                ok=(0, 1, 2),
            )
            mount = paths.run / "export"
            paths.run.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(storage.mount_disk, paths.disk_image, mount, readonly=True)
            try:
                await storage.copy_layer(mount / "upper", dest)
            finally:
                await asyncio.to_thread(storage.unmount_machine, paths.run / "no-rootfs", mount)
            await asyncio.to_thread(disks.shift_up, dest, self.rt.uid_base)

    async def assign(self, machine_id: str, *, hostname: str, labels: Mapping[str, str]) -> None:
        async with self._lock(machine_id):
            record = self._record(machine_id)
            spec = record.spec
            self._save(
                dataclasses.replace(
                    record, spec=dataclasses.replace(spec, hostname=hostname, labels=dict(labels))
                )
            )
            relay = self._relays.get(machine_id)
            if relay is not None and await self._observe(machine_id) is not MachineState.STOPPED:
                # Delivered in order before any later request on the channel, so
                # the next command sees it (a suspended guest takes it on resume).
                await self.relay_loop.call(relay.set_hostname(uts_name(hostname)))

    # -- observation ----------------------------------------------------------
    async def usage(self, machine_id: str) -> Usage | None:
        """CPU: the host's reading of QEMU's cgroup (what the machine costs the
        host). Memory, disk, network: the guest's own figures through its agent
        (QEMU keeps the pages a guest frees; :mod:`podbay.agent.stats`)."""
        try:
            record = self._record(machine_id)
        except MachineNotFound:
            return None
        read = cgroup_cpu_memory(self.cgroups, self.cgroup(machine_id))
        if read is None:
            return None
        try:
            guest = await self.guest_stats.read(
                machine_id, self.agent_socket(machine_id), STATS_SECONDS
            )
        except (PodbayError, OSError):  # busy, frozen or gone: no reading this time
            return None
        return Usage(
            cpu_seconds=read[0],
            memory_bytes=max(0, guest.memory_bytes),
            memory_limit_bytes=record.spec.limits.memory_bytes,
            disk_bytes=max(0, guest.disk_bytes),
            net_rx_bytes=max(0, guest.net_rx_bytes),
            net_tx_bytes=max(0, guest.net_tx_bytes),
            oom_kills=max(0, guest.oom_kills),
        )

    async def _observe(self, machine_id: str) -> MachineState:
        paths = self._paths(machine_id)
        if self._qemu_pid(paths) is None:
            # On disk, no QEMU: suspended (after a node's or the host's restart too).
            if Checkpoint(paths.home).exists():
                return MachineState.SUSPENDED
            return MachineState.STOPPED
        try:
            status = await qmp.execute(paths.qmp, "query-status", within=10)
        except (OSError, TimeoutError, DriverError):
            return MachineState.STOPPED
        state = status.get("status")
        if state == "running":
            return MachineState.RUNNING
        # postmigrate: a checkpoint written, QEMU not yet killed (see _thaw).
        if state in ("paused", "suspended", "prelaunch", "postmigrate"):
            return MachineState.SUSPENDED
        return MachineState.STOPPED  # shut down, panicked, internal error

    async def adopt(self) -> list[ObservedMachine]:
        await self.template_builder.clear_leftovers()  # a killed node's half-built templates
        return await self._adopt_records()

    async def _adopt_network(self, machine_id: str) -> bool:
        paths = self._paths(machine_id)
        if self._qemu_pid(paths) is None and Checkpoint(paths.home).exists():
            return True  # checkpointed: its network is made again at restore
        return await super()._adopt_network(machine_id)

    async def _adopt_live(self, machine_id: str) -> None:
        paths = self._paths(machine_id)
        pid = self._qemu_pid(paths)
        if pid is None:
            return  # checkpointed: nothing runs to reconnect to
        await asyncio.to_thread(self._reconfine, self._record(machine_id).spec, pid)
        if machine_id not in self._relays:
            relay = Relay(machine_id, paths.socket, paths.mux, fresh=False)
            self._relays[machine_id] = relay
            await self.relay_loop.call(relay.start())

    async def close(self) -> None:
        await self.guest_stats.close()
        await self._writes_done()
        # A template still building is abandoned: its guest is killed.
        await self.template_builder.cancel()
        await self.template_builder.clear_leftovers()
        for relay in list(self._relays.values()):
            await self.relay_loop.call(relay.close())
        self._relays.clear()
        self.relay_loop.stop()
        await self.network.close()
