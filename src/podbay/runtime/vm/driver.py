"""The ``vm`` driver: each machine is a QEMU microVM with its own kernel.

create  = sparse ext4 file for the writable layer, record written → stopped
start   = base image and layers as read-only ext4 disks (packed once), this
          boot's configuration appended to the cached initramfs, QEMU started
          (daemonised, so it outlives the node), the relay connected, ``GET
          /v1/info`` answers → running
suspend = QMP ``stop`` (vCPUs halted, memory kept); resume = QMP ``cont``
stop    = QEMU killed; the disk stays → stopped
destroy = all of stop, then the machine's directories → absent
adopt   = every record; a live QEMU (pid file, its command line, QMP status)
          gets a new relay, which says hello to the guest again

The guest's init (``initramfs.py``) mounts the overlay and hands over to
``guest/init.py``, which execs the agent as PID 1. The agent channel is a
virtio-serial port (no guest network needed), multiplexed by ``relay.py``.

>>> from podbay.settings import Settings
>>> VmDriver(Settings()).name
'vm'
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import math
import os
import resource
import shlex
import shutil
import signal
from collections.abc import Mapping
from pathlib import Path

from ...agent import staging
from ...settings import Settings

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
from ..machines import RecordKeepingDriver, hosts_file, uts_name
from ..network import NetworkManager, slirp
from ..oci import agent_bundle, records, storage
from ..oci.cgroups import Cgroups
from ..oci.image import Image, ImageCache, Recipe, local_ca_certificates
from ..oci.layout import Layout, MachineDirs
from ..oci.readiness import wait_ready
from ..tools import check_tool
from . import disks, initramfs, qmp, templates
from .relay import Relay, RelayLoop

log = logging.getLogger("podbay.runtime.vm")

QEMU = "qemu-system-x86_64"
#: Nothing QEMU would add on its own: no default devices, no user config file,
#: no display, and an exit (not a reboot) when the guest ends.
QEMU_BARE = ("-nodefaults", "-no-user-config", "-display", "none", "-no-reboot")
KERNEL_DIR = Path("/boot")
#: Guest RAM below this cannot hold the kernel, page cache and the agent.
MIN_MEMORY_MIB = 192
#: How long stop waits for the guest to write its page cache to its disk.
SYNC_SECONDS = 30.0
#: A file in a machine's directory once its disk has been used (no template restore then).
BOOTED = "booted"
#: The guest's side of QEMU's user-mode network. Its resolv.conf names the
#: namespace's DNS forwarder (10.0.2.3), reached through QEMU like any address.
GUEST_NET = "10.0.5.0/24"
GUEST_ADDRESS = "10.0.5.15/24"
GUEST_GATEWAY = "10.0.5.2"
GUEST_DNS_ALIAS = "10.0.5.3"
GUEST_NETWORK = f"""\
for m in $($B cat /net-modules); do $B insmod /lib/modules/$m.ko; done
$B ip link set eth0 up
$B ip addr add {GUEST_ADDRESS} dev eth0
$B ip route add default via {GUEST_GATEWAY}"""
AGENT_OPTIONS = ["--env-file", "/.podbay/run/env.json"]
GUEST_INIT = (
    "import sys; sys.path.insert(0, '/.podbay/agent'); from podbay_vm.init import main; main()"
)
#: QEMU's own host memory beside the guest's RAM: its code and heap, TCG's
#: translation cache (``tb-size=64``), libslirp's state per guest connection
#: (about 15 KiB each with MALLOC_MMAP_THRESHOLD below). See docs/runtime.md.
QEMU_OVERHEAD_MIB = 256
#: QEMU's threads beside one per vCPU: its main loop, RCU, and the block layer's
#: worker pool (at most 64); ``exec:`` migrations add a shell and ``cat``.
QEMU_PIDS = 96
#: Descriptors QEMU holds for itself (disks, chardevs, QMP, event fds: 16 seen);
#: beyond these each guest connection is one of libslirp's sockets, capped like
#: slirp4netns's (``runtime.slirp_max_fds``).
QEMU_OWN_FDS = 64
#: glibc adjusts its mmap threshold upwards once a large block is freed; from then
#: on libslirp's two 128 KiB buffers per connection came from the heap and stayed
#: resident: 1,000 idle guest connections took QEMU's RSS from 257 to 512 MiB.
#: A fixed threshold keeps them mapped on demand (272 MiB).
QEMU_MALLOC_ENV = "MALLOC_MMAP_THRESHOLD_=131072"


def kernel_release() -> str:
    """The newest Debian cloud kernel installed for guests."""
    found = sorted(KERNEL_DIR.glob("vmlinuz-*-cloud-amd64"))
    if not found:
        raise DriverError("no guest kernel: apt-get install linux-image-cloud-amd64")
    return found[-1].name.removeprefix("vmlinuz-")


def host_tsc_khz() -> int | None:
    """The host TSC frequency. Under TCG the guest reads the host's TSC, and its
    kernel's calibration against the emulated PIT fails on a busy host (seen:
    the boot then hangs), so the guest is told the frequency instead."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    if "constant_tsc" not in text:
        return None
    for line in text.splitlines():
        if line.startswith("cpu MHz"):
            return int(float(line.split(":")[1]) * 1000)
    return None


@dataclasses.dataclass(frozen=True)
class QemuBudget:
    """A machine's QEMU on the host: its cgroup's limits and RLIMIT_NOFILE."""

    memory_bytes: int
    pids: int
    cpus: float
    max_fds: int


# Alike in shape to oci's MachinePaths and to templates.Template on purpose:
# one named property per file of a machine, so each path has one home.
@dataclasses.dataclass(frozen=True)
class VmPaths(MachineDirs):
    @property
    def mux(self) -> Path:
        return self.run / "mux.sock"

    @property
    def qmp(self) -> Path:
        return self.run / "qmp.sock"

    @property
    def pidfile(self) -> Path:
        return self.run / "qemu.pid"

    @property
    def initrd(self) -> Path:
        return self.run / "initrd"

    @property
    def booted(self) -> Path:
        """Present once the machine's disk has been used (no template restore then)."""
        return self.home / BOOTED


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
        )
        self.cgroups = Cgroups()
        #: ``<this>/<machine id>``: the cgroup of a machine's QEMU.
        self.cgroup_parent = f"{self.layout.cgroup_parent}-vm"
        # A stopped machine's disk is a sparse ext4 file as the OCI driver's
        # is: it moves with the same stream (RecordKeepingDriver.export_disk).
        self.capabilities = Capabilities(
            suspend=True, stop_keeps_files=True, network=self.network.enabled, move=True
        )
        self._image: Image | None = None
        self._base_disk: Path | None = None
        self._initramfs: Path | None = None
        self._kernel: Path | None = None
        self._init_argv: list[str] = []
        self._relays: dict[str, Relay] = {}
        self._relay_loop = RelayLoop()
        self._building: set[str] = set()
        self._builds: list[concurrent.futures.Future[None]] = []

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
        await self._clear_template_leftovers()
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
        if self.templates_enabled and self.rt.warm_pool > 0:
            # The shape a default attach asks for, ready before the first one.
            self._ensure_template(
                self._shape(
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

    def _ensure_template(
        self, shape: templates.Shape, layers: list[Path]
    ) -> templates.Template | None:
        """The template of this shape and these layer disks if it is ready; else
        start building it (once)."""
        key = self._template_key(shape, layers)
        template = templates.find(self.home / "templates", key)
        if template is None and key not in self._building:
            self._building.add(key)
            self._builds.append(self._relay_loop.submit(self._build_template(key, shape, layers)))
        return template

    async def wait_templates(self, within: float = templates.BUILD_SECONDS) -> None:
        """Until every template being built is ready (or failed): for benchmarks."""
        pending = [asyncio.wrap_future(b) for b in self._builds if not b.done()]
        if pending:
            await asyncio.wait(pending, timeout=within)

    async def _clear_template_leftovers(self) -> None:
        """Template guests a killed node was building (their QEMU, network, files).
        Builds of a live process on this data directory (this one, or a node
        beside ``podbay gc``) are left alone: a partial is ``.<key>.<builder pid>``."""
        # Listed before the builds: a build's partial comes before its network
        # and outlives it, so one listed here whose build lives is seen live.
        networks = [m for m in self.network.machines() if m.startswith("tpl-")]
        partials = list((self.home / "templates").glob(".*"))
        live = set(self._building)
        for partial in partials:
            key, _, pid = partial.name[1:].rpartition(".")
            if pid.isdigit() and int(pid) != os.getpid() and _running(int(pid)):
                live.add(key)

        def dead(machine_id: str) -> bool:
            return not any(key.startswith(machine_id[4:]) for key in live)

        for pidfile in (self.run_root / "templates").glob("*/qemu.pid"):
            run = pidfile.parent
            if not dead(f"tpl-{run.name}"):
                continue
            templates.kill(pidfile, f"unix:{run / 'qmp.sock'},")
            await self._drop_cgroup(f"tpl-{run.name}")
            with contextlib.suppress(Exception):
                await self.network.teardown(f"tpl-{run.name}")
            shutil.rmtree(run, ignore_errors=True)
        # A build killed before its QEMU wrote a pid file left its cgroup, and
        # its network if it had set that up.
        for directory in self.cgroups.existing(self.cgroup_parent):
            for child in directory.glob("tpl-*"):
                if dead(child.name):
                    await self._drop_cgroup(child.name)
        for machine_id in filter(dead, networks):
            with contextlib.suppress(Exception):
                await self.network.teardown(machine_id)
        for partial in partials:
            if partial.name[1:].rpartition(".")[0] not in live:
                shutil.rmtree(partial, ignore_errors=True)

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
    async def _layer_disks(self, spec: MachineSpec) -> list[Path]:
        out = []
        for layer in spec.layers:
            if not layer.is_dir():
                raise DriverError(f"layer {layer} is missing")
            target = self.home / "layers" / f"{disks.layer_key(layer)}.ext4"
            out.append(await disks.pack(layer, target, self.rt.uid_base))
        return out

    def _argv(
        self,
        spec: MachineSpec,
        paths: VmPaths,
        layers: list[Path],
        *,
        network: bool,
        initrd: Path | None = None,
    ) -> list[str]:
        assert self._kernel is not None and self._base_disk is not None
        memory = _guest_mib(spec)
        cpus = _guest_cpus(spec)
        append = [
            "console=ttyS0",
            "quiet",
            "panic=-1",
            "reboot=t",
            "tsc=reliable",
            "8250.nr_uarts=1",
            "cryptomgr.notests",
            "random.trust_cpu=on",
        ]
        if self.accel == "tcg":
            khz = host_tsc_khz()
            if khz:
                append.append(f"tsc_early_khz={khz}")
        accel = "kvm" if self.accel == "kvm" else "tcg,tb-size=64"
        # Under TCG the "max" model (every feature QEMU emulates) made exec in the
        # guest ~40 % faster than the default qemu64 (fewer full TLB flushes).
        cpu = "host" if self.accel == "kvm" else "max"
        argv = [
            QEMU,
            "-name",
            f"podbay-{spec.machine_id}",
            "-M",
            "microvm,x-option-roms=off",
            "-accel",
            accel,
            "-cpu",
            cpu,
            "-m",
            f"{memory}M",
            "-smp",
            str(cpus),
            *QEMU_BARE,
            "-chardev",
            "ringbuf,id=console,size=65536",
            "-serial",
            "chardev:console",
            "-kernel",
            str(self._kernel),
            "-initrd",
            str(initrd or paths.initrd),
            "-append",
            " ".join(append),
        ]
        drives = [("base", self._base_disk, True)]
        drives += [(f"layer{i}", path, True) for i, path in enumerate(layers)]
        drives.append(("disk", paths.disk_image, False))
        for serial, path, readonly in drives:
            options = f"id={serial},file={path},format=raw,if=none"
            if readonly:
                options += ",readonly=on,cache=unsafe"
            else:
                options += ",discard=unmap"
            argv += [
                "-drive",
                options,
                "-device",
                f"virtio-blk-device,drive={serial},serial={serial}",
            ]
        if network:
            argv += [
                "-netdev",
                f"user,id=net,ipv6=off,net={GUEST_NET},host={GUEST_GATEWAY},dns={GUEST_DNS_ALIAS}",
                "-device",
                "virtio-net-device,netdev=net",
            ]
        argv += [
            "-device",
            "virtio-serial-device",
            "-chardev",
            f"socket,id=agent,path={paths.mux},server=on,wait=off",
            "-device",
            "virtserialport,chardev=agent,name=podbay",
            "-qmp",
            f"unix:{paths.qmp},server=on,wait=off",
            "-pidfile",
            str(paths.pidfile),
            "-daemonize",
        ]
        return argv

    def _shape(self, spec: MachineSpec) -> templates.Shape:
        return templates.Shape(
            memory_mib=_guest_mib(spec),
            cpus=_guest_cpus(spec),
            disk_bytes=spec.limits.disk_bytes,
            network=self.network.enabled,
        )

    def _templated(self, spec: MachineSpec) -> bool:
        """Whether the machine has the server's own CPUs and memory: only that
        shape restores from a template. One of attach's own (cpus, memory_mib)
        boots cold: a template is a guest's saved memory on disk, and sandboxes
        could ask for as many shapes as the bounds allow."""
        limits = spec.limits
        return limits.memory_bytes == self.rt.memory_bytes and limits.cpus == self.rt.cpus

    def _template_key(self, shape: templates.Shape, layers: list[Path]) -> str:
        return shape.key(self.accel, *map(str, self._template_inputs(layers)))

    def _template_inputs(self, layers: list[Path]) -> list[Path]:
        """The files a template of ``layers`` is made from (see templates.stale)."""
        assert self._initramfs is not None and self._base_disk is not None
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
        layers = await self._layer_disks(spec)
        template = None
        if self.templates_enabled and not paths.booted.exists() and self._templated(spec):
            template = self._ensure_template(self._shape(spec), layers)
        handle = await self.network.setup(spec.machine_id)
        paths.booted.touch()
        if template is not None:
            await self._restore(spec, paths, layers, template, network=handle.enabled)
        else:
            await self._cold_boot(spec, paths, layers, handle.resolv_conf, network=handle.enabled)
        within = max(self.rt.start_timeout_seconds, 120.0 if self.accel == "tcg" else 30.0)
        try:
            await wait_ready(paths.socket, within)
        except DriverError as e:
            raise DriverError(f"{e}; guest console: {await self._console(paths)}") from None

    def _boot_files(
        self,
        paths: VmPaths,
        config: dict[str, object],
        env: Mapping[str, str],
        hostname: str,
        resolv_conf: str,
        layers: int,
        network: bool,
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
                "INIT_ENV": shlex.join(f"{k}={v}" for k, v in staging.AGENT_ENV.items()),
            },
            init_argv=self._init_argv,
            network_script=GUEST_NETWORK,
            run_files=run_files,
        )

    async def _launch(self, spec: MachineSpec, argv: list[str]) -> None:
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
        return QemuBudget(
            memory_bytes=(_guest_mib(spec) + QEMU_OVERHEAD_MIB) << 20,
            pids=QEMU_PIDS + _guest_cpus(spec),
            cpus=spec.limits.cpus,
            max_fds=QEMU_OWN_FDS + (self.rt.slirp_max_fds if self.network.enabled else 0),
        )

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

    async def _drop_cgroup(self, machine_id: str) -> None:
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
            self._boot_files, paths, config, spec.env, name, resolv_conf, len(layers), network
        )
        await self._launch(spec, self._argv(spec, paths, layers, network=network))
        relay = Relay(spec.machine_id, paths.socket, paths.mux, fresh=True)
        self._relays[spec.machine_id] = relay
        await self._relay_loop.call(relay.start())

    async def _restore(
        self,
        spec: MachineSpec,
        paths: VmPaths,
        layers: list[Path],
        template: templates.Template,
        *,
        network: bool,
    ) -> None:
        """Start the machine from a template's saved state (see templates.py)."""
        await _copy_sparse(template.disk, paths.disk_image)
        argv = [
            *self._argv(spec, paths, layers, network=network, initrd=template.initrd),
            "-incoming",
            f"exec:cat {shlex.quote(str(template.state))}",
        ]
        await self._launch(spec, argv)
        await templates.wait_incoming(paths.qmp, 120.0)
        relay = Relay(spec.machine_id, paths.socket, paths.mux, fresh=True)
        self._relays[spec.machine_id] = relay
        await self._relay_loop.call(relay.start())
        await qmp.execute(paths.qmp, "cont")
        await self._relay_loop.call(relay.set_clock())  # the template's is its build's
        config = {
            "hostname": uts_name(spec.hostname),
            "pids": spec.limits.pids,
            "env": dict(spec.env),
        }
        await self._relay_loop.call(relay.configure(json.dumps(config).encode(), 30.0))

    async def _build_template(self, key: str, shape: templates.Shape, layers: list[Path]) -> None:
        """Boot a template guest, save it, and keep it under ``templates/<key>``
        (runs on the relay loop, beside whatever the caller's loop does)."""
        root = self.home / "templates" / key
        tmp = root.with_name(f".{key}.{os.getpid()}")
        machine_id = f"tpl-{key[:12]}"
        paths = VmPaths(tmp, self.run_root / "templates" / key[:12])
        spec = MachineSpec(
            machine_id=machine_id,
            hostname="sandbox",
            limits=Limits(
                memory_bytes=shape.memory_mib << 20,
                cpus=float(shape.cpus),
                pids=1 << 16,
                disk_bytes=shape.disk_bytes,
            ),
        )
        relay: Relay | None = None
        try:
            async with asyncio.timeout(templates.BUILD_SECONDS):
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                paths.run.mkdir(parents=True, exist_ok=True)
                await storage.make_disk(
                    paths.disk_image, shape.disk_bytes, self.layout.data_dir / "disks"
                )
                handle = await self.network.setup(machine_id)
                config: dict[str, object] = {
                    "hostname": "sandbox",
                    "pids": 1 << 16,
                    "agent_options": AGENT_OPTIONS,
                    "template": True,
                }
                await asyncio.to_thread(
                    self._boot_files,
                    paths,
                    config,
                    {},
                    "sandbox",
                    handle.resolv_conf,
                    len(layers),
                    handle.enabled,
                )
                await self._launch(spec, self._argv(spec, paths, layers, network=handle.enabled))
                relay = Relay(machine_id, paths.socket, paths.mux, fresh=True)
                await relay.start()
                await relay.waiting.wait()
                await relay.close()
                relay = None
                await templates.save(paths.qmp, tmp / "state")
                templates.kill(paths.pidfile, f"unix:{paths.qmp},")
                shutil.copyfile(paths.initrd, tmp / "initrd")
                templates.mark_complete(tmp, self._template_inputs(layers))
                os.rename(tmp, root)
                log.info(
                    "vm template %s ready (%d MiB, %d cpus)", key, shape.memory_mib, shape.cpus
                )
        except BaseException as e:  # a template is an optimisation: log and go on
            log.warning("vm template %s not built: %s", key, e or type(e).__name__)
        finally:
            if relay is not None:
                await relay.close()
            templates.kill(paths.pidfile, f"unix:{paths.qmp},")
            await self._drop_cgroup(machine_id)
            with contextlib.suppress(Exception):
                await self.network.teardown(machine_id)
            shutil.rmtree(paths.run, ignore_errors=True)
            templates.discard(tmp)
            self._building.discard(key)

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
        await qmp.execute(self._paths(machine_id).qmp, "stop")

    async def _thaw(self, machine_id: str) -> None:
        await qmp.execute(self._paths(machine_id).qmp, "cont")
        await self._set_clock(machine_id)

    async def _set_clock(self, machine_id: str) -> None:
        """The guest's wall clock stood still while QEMU was stopped: set it to
        the host's (every start of a stopped guest: resume, a template's restore)."""
        relay = self._relays.get(machine_id)
        if relay is not None:
            await self._relay_loop.call(relay.set_clock())

    async def stop(self, machine_id: str) -> None:
        async with self._lock(machine_id):
            record = self._record(machine_id)
            await self.release(machine_id, flush=True)
            if record.commanded is not MachineState.STOPPED:
                self._save(record.with_state(MachineState.STOPPED))

    def _imported(self, home: Path) -> None:
        # Its disk has been used (it holds the sandbox's files): its next start
        # boots it, where a first start would copy a template's disk over it.
        (home / BOOTED).touch()

    async def destroy(self, machine_id: str) -> None:
        async with self._lock(machine_id):
            paths = self._paths(machine_id)
            await self.release(machine_id)
            await asyncio.to_thread(shutil.rmtree, paths.home, True)
            await asyncio.to_thread(shutil.rmtree, paths.run, True)
        self._locks.pop(machine_id, None)

    async def _flush(self, machine_id: str) -> None:
        """Before QEMU is killed: the guest writes its page cache to its disk (a
        suspended guest is resumed for that), so stop keeps every file."""
        relay = self._relays.get(machine_id)
        observed = await self._observe(machine_id)
        if relay is None or observed is MachineState.STOPPED:
            return
        paths = self._paths(machine_id)
        if observed is MachineState.SUSPENDED:
            await qmp.execute(paths.qmp, "cont")
        if not await self._relay_loop.call(relay.sync(SYNC_SECONDS)):
            log.warning("machine %s did not flush its disk before stopping", machine_id)

    async def release(self, machine_id: str, *, flush: bool = False) -> None:
        """End the incarnation (QEMU, relay, volatile files); the disk stays
        (with ``flush``, everything the guest wrote to it)."""
        paths = self._paths(machine_id)
        if flush:
            await self._flush(machine_id)
        relay = self._relays.pop(machine_id, None)
        if relay is not None:
            await self._relay_loop.call(relay.close())
        pid = self._qemu_pid(paths)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            for _ in range(500):
                if not _running(pid):
                    break
                await asyncio.sleep(0.01)
        await self._drop_cgroup(machine_id)
        await self.network.teardown(machine_id)
        for path in (paths.socket, paths.mux, paths.qmp, paths.pidfile, paths.initrd):
            path.unlink(missing_ok=True)

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
                await self._relay_loop.call(relay.set_hostname(uts_name(hostname)))

    # -- observation ----------------------------------------------------------
    async def _observe(self, machine_id: str) -> MachineState:
        paths = self._paths(machine_id)
        if self._qemu_pid(paths) is None:
            return MachineState.STOPPED
        try:
            status = await qmp.execute(paths.qmp, "query-status", within=10)
        except (OSError, TimeoutError, DriverError):
            return MachineState.STOPPED
        state = status.get("status")
        if state == "running":
            return MachineState.RUNNING
        if state in ("paused", "suspended", "prelaunch"):
            return MachineState.SUSPENDED
        return MachineState.STOPPED  # shut down, panicked, internal error

    async def adopt(self) -> list[ObservedMachine]:
        await self._clear_template_leftovers()  # a killed node's half-built templates
        return await self._adopt_records()

    async def _adopt_live(self, machine_id: str) -> None:
        paths = self._paths(machine_id)
        pid = self._qemu_pid(paths)
        if pid is not None:
            await asyncio.to_thread(self._reconfine, self._record(machine_id).spec, pid)
        if machine_id not in self._relays:
            relay = Relay(machine_id, paths.socket, paths.mux, fresh=False)
            self._relays[machine_id] = relay
            await self._relay_loop.call(relay.start())

    async def close(self) -> None:
        await self._writes_done()
        # A template still building is abandoned: its guest is killed.
        for build in self._builds:
            build.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.wrap_future(build), 30)
        self._builds.clear()
        await self._clear_template_leftovers()
        for relay in list(self._relays.values()):
            await self._relay_loop.call(relay.close())
        self._relays.clear()
        self._relay_loop.stop()
        await self.network.close()


def _guest_cpus(spec: MachineSpec) -> int:
    """The guest's vCPUs: its CPU limit, rounded up, at least one."""
    return max(1, math.ceil(spec.limits.cpus))


def _guest_mib(spec: MachineSpec) -> int:
    return max(MIN_MEMORY_MIB, spec.limits.memory_bytes >> 20)


async def _copy_sparse(source: Path, target: Path) -> None:
    await check_tool(
        "cp",
        "--sparse=always",
        "--reflink=auto",
        str(source),
        str(target),
        failed="copying the template's disk failed",
    )


def _running(pid: int) -> bool:
    """Alive and not a zombie: a daemonised QEMU's parent is the host's init,
    which may take seconds to reap it (its files and memory are released at
    exit already)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")
