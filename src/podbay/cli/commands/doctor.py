"""``podbay doctor``: can this host run sandboxes, of which classes? Checks, then proves it.

First the host (root, user namespaces, cgroup controllers, overlayfs and
loop devices, networking tools, free disk and what the sandboxes' sparse disks
may grow to against it (the overcommit), the base image, which it builds
on first run with progress on stderr), one PASS or FAIL line each, a FAIL
saying what to install or change. Then, for each class ``runtime.classes``
enables, in order: its host check (the OCI runtime; for ``vm``, a guest
that boots, under KVM or TCG), two throwaway sandboxes of that class, the
isolation probes against them (the egress policy's bypasses among them,
against a decoy on a documentation address: see docs/network.md), and their
destruction; its lines start with the class's name. Classes not enabled are
listed as such (no FAIL). The end
says which classes work here and what attach's ``default`` means, with
create-to-ready and resume times per class. Exit status 0 only if
everything enabled passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import statistics
import time
import typing
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import click

from podbay.cli.options import data_dir_option, json_option
from podbay.cli.output import Output, fail

if typing.TYPE_CHECKING:
    from podbay.host.storage import DiskCommitment
    from podbay.runtime.agent_client import AgentClient
    from podbay.runtime.base import Driver
    from podbay.settings import Settings

GIB = 1024**3
MIB = 1024**2
MIN_FREE_BYTES = 2 * GIB
#: A name in the egress probes' allow list (``.invalid`` never resolves): the
#: decoy's other address is one no allowed name gave.
DOCTOR_NAME = "doctor.podbay.invalid"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


class Report:
    def __init__(self, out: Output) -> None:
        self.out = out
        self.checks: list[Check] = []
        #: Put before each check's name (the class whose sandboxes are probed).
        self.prefix = ""

    def add(self, name: str, ok: bool, detail: str = "") -> bool:
        name = self.prefix + name
        self.checks.append(Check(name, ok, detail))
        self.out.line(f"{'PASS' if ok else 'FAIL'}  {name}" + (f": {detail}" if detail else ""))
        return ok

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def host_checks(settings: object, report: Report) -> None:
    from podbay.host.cgroups import Cgroups
    from podbay.host.layout import Layout
    from podbay.runtime.network import NetworkManager
    from podbay.settings import Settings

    assert isinstance(settings, Settings)
    rt = settings.runtime
    root = os.geteuid() == 0
    report.add("root", root, "" if root else "run podbay doctor (and podbay serve) as root")
    try:
        userns = int(Path("/proc/sys/user/max_user_namespaces").read_text())
    except OSError:
        userns = 0
    report.add(
        "user namespaces",
        userns > 0,
        f"{userns} allowed" if userns else "enable them: sysctl -w user.max_user_namespaces=15000",
    )
    cgroups = Cgroups()
    missing = cgroups.missing_controllers()
    report.add(
        f"cgroup v{cgroups.version} controllers",
        not missing,
        "memory, pids, cpu, freezer"
        if not missing and cgroups.version == 1
        else "memory, pids, cpu"
        if not missing
        else f"missing {', '.join(missing)}: enable them (kernel command line "
        "cgroup_enable=..., or systemd's delegation)",
    )
    filesystems = Path("/proc/filesystems").read_text()
    report.add(
        "overlayfs",
        "overlay" in filesystems,
        "" if "overlay" in filesystems else "modprobe overlay",
    )
    loop = Path("/dev/loop-control").exists()
    report.add("loop devices", loop, "" if loop else "modprobe loop")
    names = ("mkfs.ext4", "nsenter", "prlimit", "setpriv", "unshare")
    tools = [t for t in names if shutil.which(t) is None]
    report.add(
        "tools",
        not tools,
        ", ".join(names)
        if not tools
        else f"missing {', '.join(tools)}: apt-get install e2fsprogs util-linux",
    )
    layout = Layout.from_settings(settings)
    network = NetworkManager(layout.run_dir, enabled=rt.network)
    if rt.network:
        problems = network.check_host() if root else ["network: needs root"]
        report.add(
            "network",
            not problems,
            "slirp4netns, nftables, network namespaces" if not problems else "; ".join(problems),
        )
    else:
        report.add("network", True, "disabled by runtime.network: sandboxes get loopback only")
    probe_dir = settings.data_dir if settings.data_dir.exists() else settings.data_dir.parent
    while not probe_dir.exists():
        probe_dir = probe_dir.parent
    free = shutil.disk_usage(probe_dir).free
    report.add(
        "free disk",
        free >= MIN_FREE_BYTES,
        f"{free / GIB:.1f} GiB free at {probe_dir}"
        + (
            ""
            if free >= MIN_FREE_BYTES
            else f"; need {MIN_FREE_BYTES // GIB} GiB: free space or set --data-dir"
        ),
    )
    report.add("disk commitment", True, disk_commitment(settings).describe(rt.disk_reserve_bytes))
    report.add("pid space", *pid_space(rt.pids))


def pid_space(pids: int, pid_max: int | None = None) -> tuple[bool, str]:
    """Whether the host's pids hold a gVisor sandbox at its limit: its host
    budget (gVisor's own threads, ``runsc.host_pids``) within what all
    sandboxes may hold together (``cgroups.node_pids``).

    >>> ok, detail = pid_space(256, 32768)
    >>> ok, "at most 28672 together" in detail, "25984 host threads (1 at once)" in detail
    (True, True, True)
    >>> pid_space(256, 16384)[0]
    False
    """
    from podbay.host.cgroups import node_pids
    from podbay.runtime.oci.runsc import host_pids

    if pid_max is None:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    node, budget = node_pids(pid_max), host_pids(pids)
    detail = (
        f"kernel.pid_max {pid_max}: sandboxes hold at most {node} together; a gVisor sandbox "
        f"at pids {pids} may take {budget} host threads ({node // budget} at once)"
    )
    if budget > node:
        detail += ": raise kernel.pid_max (sysctl -w kernel.pid_max=4194304) or lower runtime.pids"
    return budget <= node, detail


def disk_commitment(settings: Settings) -> DiskCommitment:
    """What every class's sandbox disks may grow to, against the host's free disk
    (informational: sparse disks are overcommitted by design)."""
    from podbay.host.layout import Layout
    from podbay.host.storage import disk_commitment as commitment
    from podbay.runtime.classes import CLASSES, class_settings

    return commitment(
        [Layout.from_settings(class_settings(settings, name)).machines for name in CLASSES]
    )


async def base_image(settings: object, report: Report) -> None:
    from podbay.runtime.oci.driver import OciDriver
    from podbay.settings import Settings

    assert isinstance(settings, Settings)
    driver = OciDriver(settings)
    from podbay.host.image import ImageCache

    cache = ImageCache(driver.layout.image_dir, driver.recipe)
    if cache.cached() is None and shutil.which("mmdebstrap") is None:
        report.add(
            "base image", False, "not built and mmdebstrap is missing: apt-get install mmdebstrap"
        )
        return
    started = time.monotonic()
    try:
        await driver.prepare()
    except Exception as e:  # noqa: BLE001 - the doctor reports every failure as a failed check
        report.add("base image", False, str(e))
        return
    took = time.monotonic() - started
    assert driver._image is not None
    report.add(
        "base image",
        True,
        f"{driver._image.rootfs}" + (f" (built in {took:.0f} s)" if took > 5 else ""),
    )


async def sandbox_probes(settings: Settings, name: str, report: Report) -> str:
    """Two throwaway sandboxes of class ``name``, the probes, destroy; the timing."""
    from podbay.host import storage
    from podbay.runtime import classes, probes
    from podbay.runtime.agent_client import AgentClient
    from podbay.runtime.base import Limits, MachineSpec, MachineState
    from podbay.runtime.oci.driver import OciDriver
    from podbay.runtime.oci.runsc import Runsc

    report.prefix = f"{name}: "
    try:
        driver = classes.build_driver(settings, name)
        await driver.prepare()
    except Exception as e:  # noqa: BLE001 - the doctor reports every failure as a failed check
        report.add("driver", False, f"{type(e).__name__}: {e}")
        return "n/a"
    tag = uuid.uuid4().hex[:8]
    # The sandboxes' own pids limit, as they have it (under gVisor it counts the
    # guest's processes, and the host cgroup gets runsc.host_pids of it). Memory
    # and disk stay small so the hog and the quota probes end quickly.
    small = Limits(
        memory_bytes=256 * MIB, cpus=1.0, pids=settings.runtime.pids, disk_bytes=512 * MIB
    )
    specs = [
        MachineSpec(machine_id=f"doctor-{tag}-{i}", hostname=f"doctor-{i}", limits=small)
        for i in range(2)
    ]
    ready: list[float] = []
    resumes: list[float] = []
    try:
        for spec in specs:
            started = time.perf_counter()
            await driver.create(spec)
            await driver.start(spec.machine_id)
            ready.append(time.perf_counter() - started)
        report.add("sandbox start", True, f"{len(specs)} sandboxes answered")
        a, b = (AgentClient(driver.agent_socket(s.machine_id)) for s in specs)

        def probe(name: str, check: object) -> None:
            assert callable(check)
            result = probes.run_probe(name, check)
            report.add(result.name, result.ok, result.detail)

        no_host_env = ("no host environment", lambda: probes.no_host_environment(a))
        own_pids = ("own process namespace", lambda: probes.pid_namespace(a))
        own_kernel = ("own kernel, not the host's", lambda: probes.own_kernel(a))
        apart = (
            "sandboxes see neither files nor processes of each other",
            lambda: probes.neighbours(a, b),
        )
        checks: list[tuple[str, object]] = [
            ("root inside is not root outside", lambda: probes.user_namespace(a)),
            ("no mounts, namespaces or extra capabilities", lambda: probes.hardening(a)),
            no_host_env,
            (
                "agent out of reach (ptrace, pidfd_getfd, /proc/1)",
                lambda: probes.agent_out_of_reach(a),
            ),
            own_pids,
            apart,
        ]
        if driver.name == "vm":
            # Root in a guest is the guest's own root (its kernel is the boundary):
            # the container probes of namespaces and the agent's protection do not apply.
            guest_pids = ("no host processes in sight", lambda: probes.guest_processes(a))
            checks = [own_kernel, no_host_env, guest_pids, apart]
        gvisor = isinstance(getattr(driver, "runc", None), Runsc)
        if gvisor:
            # gVisor is the sandbox's kernel: root inside is its root and user
            # namespaces are its business (as in a VM's guest); the agent guards
            # itself there (podbay.agent.guard).
            guarded = (
                "agent out of reach (ptrace, signals, /proc/1)",
                lambda: probes.agent_out_of_reach(a, own_kernel=True),
            )
            checks = [own_kernel, no_host_env, guarded, own_pids, apart]
        loop = asyncio.get_running_loop()

        def restart_a() -> None:
            asyncio.run_coroutine_threadsafe(driver.start(specs[0].machine_id), loop).result()

        if driver.capabilities.network:
            with probes.host_listeners() as (port, addresses):
                targets = [
                    ("127.0.0.1", port),
                    ("10.0.0.1", 80),
                    ("169.254.169.254", 80),
                    ("10.0.2.2", port),
                ] + [(addr, port) for addr in addresses]
                # Beside the loop, as every probe: it serves the sandbox's
                # resolver (a gVisor sandbox's lookups go through it).
                await asyncio.to_thread(
                    probe,
                    "no path to the host, private ranges or metadata",
                    lambda: probes.unreachable(a, targets),
                )
            await asyncio.to_thread(
                probe,
                "outbound internet",
                lambda: probes.outbound(a, settings.runtime.image_mirror),
            )
            secure = "https://" + urlsplit(settings.runtime.image_mirror).netloc + "/"
            await asyncio.to_thread(
                probe,
                "outbound HTTPS (certificates trusted)",
                lambda: probes.outbound(
                    a,
                    secure,
                    hint="if a TLS-inspecting proxy is in the way, put its CA in "
                    "runtime.image_extra_ca_dir (the image is rebuilt with it)",
                ),
            )
            await egress_bypass_probes(driver, specs[0].machine_id, a, report)
        for name, check in checks:
            await asyncio.to_thread(probe, name, check)
        if gvisor:
            # No OOM killer of its own, and its threads share the pids limit: the
            # whole sandbox may end, never the host or a neighbour.
            bomb = "f(){ f | f & }; f; sleep 5"
            hog = "python3 -c 'a = []\nwhile True: a.append(bytearray(16 << 20))'"
            await asyncio.to_thread(
                probe,
                "fork bomb contained",
                lambda: probes.kernel_contains(
                    lambda: a.sh(bomb, timeout_ms=3000), a, b, restart_a
                ),
            )
            await asyncio.to_thread(
                probe,
                "memory hog contained",
                lambda: probes.kernel_contains(
                    lambda: a.sh(hog, timeout_ms=60_000), a, b, restart_a
                ),
            )
        else:
            await asyncio.to_thread(probe, "fork bomb contained", lambda: probes.fork_bomb(a, b))
            await asyncio.to_thread(
                probe, "memory hog killed inside its sandbox", lambda: probes.memory_hog(a)
            )
        await asyncio.to_thread(probe, "disk quota", lambda: probes.disk_quota(a, 512 * MIB))
        for _ in range(5):
            await driver.suspend(specs[1].machine_id)
            started = time.perf_counter()
            await driver.resume(specs[1].machine_id)
            resumes.append(time.perf_counter() - started)
        alive = await asyncio.to_thread(lambda: b.sh("echo ok").stdout.strip())
        report.add(
            "suspend and resume",
            alive == "ok",
            "" if alive == "ok" else "the agent did not answer after resume",
        )
        await asyncio.to_thread(
            probe, "agent survives python3 removal", lambda: probes.python_removed(a)
        )
    except Exception as e:  # noqa: BLE001 - the doctor reports every failure as a failed check
        report.add("sandbox", False, str(e))
    finally:
        for spec in specs:
            try:
                await driver.destroy(spec.machine_id)
            # Reported; the other machines are still destroyed.
            except Exception as e:  # noqa: BLE001
                report.add("destroy", False, str(e))
        leftovers = [m for m in storage.mountpoints() if any(s.machine_id in m for s in specs)]
        if isinstance(driver, OciDriver):
            leftovers += [
                str(p)
                for s in specs
                for p in (
                    driver.layout.machine(s.machine_id).home,
                    driver.layout.machine(s.machine_id).run,
                )
                if p.exists()
            ]
        for spec in specs:
            with contextlib.suppress(Exception):
                if await driver.state(spec.machine_id) is not MachineState.ABSENT:
                    leftovers.append(f"machine {spec.machine_id}")
        report.add("destroy leaves nothing", not leftovers, ", ".join(leftovers))
        await driver.close()
        report.prefix = ""
    if not ready:
        return "n/a"
    resume = f"{statistics.median(resumes) * 1000:.1f} ms" if resumes else "n/a"
    return f"create-to-ready {statistics.median(ready) * 1000:.0f} ms, resume {resume}"


async def egress_bypass_probes(
    driver: Driver, machine_id: str, agent: AgentClient, report: Report
) -> None:
    """The bypasses of an egress policy (docs/network.md), tried from the
    sandbox under an allow list and under a deny list alone, against a decoy
    this host serves on a documentation address (no internet needed). Each
    bypass is one check: held under both, or what got through."""
    from podbay.domain.egress import EgressPolicy
    from podbay.runtime import probes
    from podbay.runtime.network.decoy import decoy_host

    try:
        with decoy_host() as decoy:
            witness = decoy.witness
            policies = {
                "allow list": EgressPolicy.parse({"allow": [decoy.allowed, DOCTOR_NAME]}),
                "deny list": EgressPolicy.parse({"deny": [decoy.refused]}),
            }
            through: dict[str, list[str]] = {name: [] for name in probes.BYPASSES}
            unanswered: list[str] = []
            try:
                for label, policy in policies.items():
                    await driver.set_egress(machine_id, policy)
                    outcome = await asyncio.to_thread(
                        probes.egress_bypasses,
                        agent,
                        decoy.allowed,
                        decoy.refused,
                        decoy.ipv6,
                        witness.counts,
                        witness.reset,
                    )
                    if outcome.control != "connected":
                        unanswered.append(f"{label}: {outcome.control}")
                    for name, what in outcome.reached.items():
                        if what:
                            through[name].append(f"{label}: {what}")
            finally:
                await driver.set_egress(machine_id, EgressPolicy())
    except Exception as e:  # noqa: BLE001 - the doctor reports every failure as a failed check
        report.add("egress policy probes", False, f"{type(e).__name__}: {e}")
        return
    report.add(
        "egress policy probes reach their decoy where allowed",
        not unanswered,
        f"{decoy.allowed} allowed, {decoy.refused} not"
        if not unanswered
        else "the allowed address did not answer, so no bypass probe proves anything: "
        + "; ".join(unanswered),
    )
    for name, description in probes.BYPASSES.items():
        report.add(
            f"egress policy holds: {description}", not through[name], "; ".join(through[name])
        )


async def class_checks(settings: Settings, report: Report) -> dict[str, object]:
    """Each enabled class: its host check, then its sandboxes and probes. Returns
    what works, why not, and what ``default`` means (for the summary)."""
    from podbay.runtime import classes

    enabled = classes.enabled_classes(settings)
    found: dict[str, classes.HostCheck] = {}
    timing: dict[str, str] = {}
    for name in enabled:
        before = len(report.checks)
        check = await classes.host_check(settings, name)
        report.add(f"{name}: host check", check.works, check.detail)
        if check.works:
            took = await sandbox_probes(settings, name, report)
            if took != "n/a":
                timing[name] = took
        failed = [c for c in report.checks[before:] if not c.ok]
        why = check.detail
        if failed:
            step = failed[0].name.removeprefix(f"{name}: ")
            why = f"{step}: {failed[0].detail}"
        found[name] = classes.HostCheck(not failed, check.fast, why)
    for name in classes.CLASSES:
        if name not in enabled:
            report.out.line(
                f"SKIP  {name}: not enabled (runtime.classes="
                f"{settings.runtime.classes}; add it to run {name} sandboxes)"
            )
    pin = settings.runtime.default_class.strip()
    default = classes.resolve_default(enabled, found, pin)
    why = (
        "pinned by runtime.default_class"
        if pin
        else "the first enabled class that works at useful speed here"
    )
    slow = [n for n in enabled if found[n].works and not found[n].fast]
    return {
        "enabled": list(enabled),
        "working": [n for n in enabled if found[n].works],
        "slow": slow,
        "default": default,
        "default_why": why,
        "timing": timing,
        "why_not": {n: found[n].detail for n in enabled if not found[n].works},
    }


@click.command()
@data_dir_option("Data directory to check (default /var/lib/podbay as root).")
@json_option("Print the checks as JSON.")
def command(data_dir: Path | None, as_json: bool) -> None:
    """Check this host can run sandboxes, then prove it with throwaway ones."""
    from podbay.runtime import classes
    from podbay.settings import Settings

    out = Output(as_json=as_json)
    logging.basicConfig(level=logging.INFO, format="  %(message)s")
    logging.getLogger("podbay.runtime.oci").setLevel(logging.WARNING)  # image progress only
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the probes' every request
    try:
        settings = Settings.load(data_dir=data_dir)
        classes.enabled_classes(settings)
    except ValueError as exc:
        fail(str(exc), 2)
    report = Report(out)
    host_checks(settings, report)
    summary: dict[str, object] = {}
    if report.ok:
        from podbay.cli.progress import build_progress

        with build_progress(enabled=not as_json):
            asyncio.run(base_image(settings, report))
    if report.ok:
        summary = asyncio.run(class_checks(settings, report))
    if as_json:
        out.value({"ok": report.ok, **summary, "checks": [c.__dict__ for c in report.checks]})
    else:
        for line in summary_lines(summary):
            out.line(line)
    raise SystemExit(0 if report.ok else 1)


def summary_lines(summary: dict[str, object]) -> list[str]:
    if not summary:
        return ["classes: not checked (host checks failed)"]
    working = typing.cast(list[str], summary["working"])
    slow = typing.cast(list[str], summary["slow"])
    timing = typing.cast(dict[str, str], summary["timing"])
    lines = [
        "classes that work here: "
        + (", ".join(f"{n} (not at useful speed)" if n in slow else n for n in working) or "none")
    ]
    for name, why in typing.cast(dict[str, str], summary["why_not"]).items():
        lines.append(f"{name} does not work here: {why}")
    default = summary["default"]
    lines.append(
        f"default means {default} ({summary['default_why']})"
        if default
        else "default means nothing: no enabled class works here"
    )
    lines += [f"{name}: {took}" for name, took in timing.items()]
    return lines
