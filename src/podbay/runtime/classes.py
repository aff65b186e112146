"""Sandbox classes: the isolation levels attach's ``class`` names.

=============  ==========================================  ======================
class          what runs a sandbox                         kernel
=============  ==========================================  ======================
``vm``         a QEMU microVM (:mod:`podbay.runtime.vm`)   its own
``gvisor``     the OCI driver with gVisor's ``runsc``      gVisor's, in user space
``container``  the OCI driver with ``runc``                the host's, shared
=============  ==========================================  ======================

``runtime.classes`` enables classes in order of preference (strongest
first by default); ``default`` means ``runtime.default_class`` when pinned,
else the first enabled class that works *at useful speed* on this host. A
class works when its host check passes and a throwaway machine of it
answers (:func:`prove_class`): a binary or a device node is not proof (``/dev/kvm``
exists on hosts where KVM guests hang). ``vm`` is at useful speed only where
KVM boots a guest; under TCG it works when asked for by name but is never
what ``default`` means.

Each class has its own driver instance and data: ``container`` keeps the
data directory's historical layout (``machines/``), ``gvisor`` lives under
``<data_dir>/gvisor/`` with its own run directory, cgroup parent and network
state, so the two never meet on machine ids, cgroups or namespaces. The
base image is shared: both mount the same read-only directory.

>>> enabled_classes(Settings.load(environ={}))
('gvisor', 'container')
>>> resolve_default(("gvisor", "container"), {"gvisor": HostCheck(True, True, ""),
...                                           "container": HostCheck(True, True, "")})
'gvisor'
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import inspect
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from podbay.host.tools import run_tool

from ..settings import Settings
from ..wire.limits import DEFAULT_SANDBOX_CLASS, SANDBOX_CLASS_NAMES
from .base import Driver, Limits, MachineSpec

VM, GVISOR, CONTAINER = "vm", "gvisor", "container"
assert (VM, GVISOR, CONTAINER) == SANDBOX_CLASS_NAMES  # strongest first

#: How long a host check may take (the vm check boots a guest, under TCG too).
CHECK_TIMEOUT_S = 180.0
#: How long the first machine of a class may take to answer (a loaded host
#: boots a guest under TCG slowly).
PROOF_TIMEOUT_S = 600.0


class HostCheck(NamedTuple):
    """Whether a class runs on this host, and whether at useful speed."""

    works: bool
    #: Useful speed: for ``vm``, a KVM guest boots (TCG works, slowly).
    fast: bool
    #: One line for ``podbay doctor`` and the 409 message: what runs, or why not.
    detail: str


@dataclass(frozen=True)
class SandboxClass:
    name: str
    #: "module:attribute" of a driver class or function taking ``Settings``.
    factory: str
    #: What isolates a sandbox of this class, for people.
    summary: str


CLASSES: dict[str, SandboxClass] = {
    VM: SandboxClass(VM, "podbay.runtime.vm.driver:VmDriver", "QEMU microVM with its own kernel"),
    GVISOR: SandboxClass(
        GVISOR,
        "podbay.runtime.oci.driver:OciDriver",
        "gVisor (runsc): an application kernel in user space",
    ),
    CONTAINER: SandboxClass(
        CONTAINER, "podbay.runtime.oci.driver:OciDriver", "runc container on the host's kernel"
    ),
}
#: The vm host check: boots a guest to tell KVM from TCG.
VM_PROBE = "podbay.runtime.vm.probe:probe"
#: What ``runtime.classes`` enables unless the operator says otherwise: ``vm``
#: only when listed (a guest per sandbox is costly under TCG, and most hosts
#: here have no working KVM).
DEFAULT_ENABLED = (GVISOR, CONTAINER)


def enabled_classes(settings: Settings) -> tuple[str, ...]:
    """``runtime.classes`` as a tuple in order of preference; ``ValueError``
    naming the problem when it lists an unknown class, a repeat or nothing,
    or when ``runtime.default_class`` pins a class it does not enable."""
    raw = [part.strip() for part in settings.runtime.classes.split(",") if part.strip()]
    unknown = [name for name in raw if name not in CLASSES]
    if unknown:
        raise ValueError(
            f"runtime.classes: unknown class {unknown[0]!r} (known: {', '.join(CLASSES)})"
        )
    if not raw:
        raise ValueError(f"runtime.classes enables no class (known: {', '.join(CLASSES)})")
    if len(set(raw)) != len(raw):
        raise ValueError(f"runtime.classes lists a class twice: {settings.runtime.classes!r}")
    pin = settings.runtime.default_class.strip()
    if pin and pin not in raw:
        raise ValueError(
            f"runtime.default_class={pin!r} is not enabled by runtime.classes ({', '.join(raw)})"
        )
    checkpointing(settings)
    return tuple(raw)


def checkpointing(settings: Settings) -> frozenset[str]:
    """``runtime.checkpoint_classes``: the classes whose suspend checkpoints to
    disk; ``ValueError`` naming an unknown class."""
    raw = {part.strip() for part in settings.runtime.checkpoint_classes.split(",")}
    raw.discard("")
    unknown = sorted(raw - set(CLASSES))
    if unknown:
        raise ValueError(
            f"runtime.checkpoint_classes: unknown class {unknown[0]!r}"
            f" (known: {', '.join(CLASSES)})"
        )
    return frozenset(raw)


def resolve_default(
    enabled: Sequence[str], checks: Mapping[str, HostCheck], pin: str = ""
) -> str | None:
    """What ``default`` means: the pin if set (even when it cannot run here: a
    pin is the operator's word); else the first enabled class that works at
    useful speed; else the first that works at all; else ``None``."""
    if pin:
        return pin
    for want_fast in (True, False):
        for name in enabled:
            check = checks.get(name)
            if check is not None and check.works and (check.fast or not want_fast):
                return name
    return None


def is_class_name(name: str) -> bool:
    """A name attach accepts: ``default`` or a class (whether or not it runs here)."""
    return name == DEFAULT_SANDBOX_CLASS or name in CLASSES


# -- each class's settings and driver ----------------------------------------------------
def class_settings(settings: Settings, name: str) -> Settings:
    """The settings the class's driver is built with. ``gvisor`` gets its own data
    and run directories (and so cgroup parent and network state), over the
    same base image cache as ``container``."""
    if name != GVISOR:
        return settings
    derived = copy.deepcopy(settings)
    rt = derived.runtime
    data_dir = settings.data_dir.resolve()
    rt.image_dir = rt.image_dir or str(data_dir / "images")
    if rt.run_dir:
        # A sibling, not a child: the container driver owns its run directory's entries.
        rt.run_dir = f"{rt.run_dir.rstrip('/')}-{GVISOR}"
    rt.oci_runtime = rt.gvisor_runtime
    derived.data_dir = data_dir / GVISOR
    return derived


def _load(target: str) -> Any:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def build_driver(settings: Settings, name: str) -> Driver:
    """A class's driver (not prepared). ``ImportError`` when its module is absent."""
    factory: Callable[[Settings], Driver] = _load(CLASSES[name].factory)
    return factory(class_settings(settings, name))


# -- host checks --------------------------------------------------------------------------
async def host_check(settings: Settings, name: str) -> HostCheck:
    """Can this host run ``name`` at all (binaries, root, for ``vm`` a guest that
    boots)? Cheap for the OCI classes; :func:`smoke` proves it with a machine."""
    try:
        return await asyncio.wait_for(_host_check(settings, name), CHECK_TIMEOUT_S)
    except TimeoutError:
        return HostCheck(False, False, f"the {name} host check took over {CHECK_TIMEOUT_S:.0f} s")
    # A check that breaks says so; it never takes serve down.
    except Exception as exc:  # noqa: BLE001
        return HostCheck(False, False, f"the {name} host check failed: {type(exc).__name__}: {exc}")


async def _host_check(settings: Settings, name: str) -> HostCheck:
    if name == VM:
        return await _vm_check(settings)
    if os.geteuid() != 0:
        return HostCheck(False, False, "needs root")
    binary = class_settings(settings, name).runtime.oci_runtime
    path = shutil.which(binary)
    if path is None:
        package = "runsc" if name == GVISOR else "runc"
        return HostCheck(False, False, f"{binary} not found: apt-get install {package}")
    version = await _first_line(path, "--version")
    if name == CONTAINER:
        return HostCheck(True, True, f"{path} ({version})")
    return await _runsc_check(path, version)


async def _first_line(*argv: str) -> str:
    _, out = await run_tool(*argv)
    return (out.splitlines() or [""])[0].strip()


async def _runsc_check(path: str, version: str) -> HostCheck:
    """``runsc do uname -r`` answers with gVisor's kernel release, not the host's."""
    with tempfile.TemporaryDirectory(prefix="podbay-runsc-") as state:
        proc = await asyncio.create_subprocess_exec(
            path,
            "--root",
            state,
            "--network=none",
            "do",
            "uname",
            "-r",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=state,
        )
        out, err = await proc.communicate()
    release = out.decode(errors="replace").strip()
    if proc.returncode != 0:
        why = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        return HostCheck(False, False, f"{path} ({version}) cannot run a sandbox: {why}")
    if release == os.uname().release:
        return HostCheck(False, False, f"{path}: the sandboxed kernel is the host's")
    return HostCheck(True, True, f"{path} ({version}); gVisor kernel {release}")


async def _vm_check(settings: Settings) -> HostCheck:
    try:
        probe = _load(VM_PROBE)
    except (ImportError, AttributeError) as exc:
        return HostCheck(False, False, f"the vm driver is not installed ({exc})")
    if inspect.iscoroutinefunction(probe):
        result = await probe(settings)
    else:
        result = await asyncio.to_thread(probe, settings)
    check = as_host_check(result)
    accel = settings.runtime.vm_accel
    if check.fast and accel != "kvm":
        # KVM boots guests here, but the operator runs them under TCG.
        return HostCheck(
            True,
            False,
            f"{check.detail}; guests run under {accel} (runtime.vm_accel=kvm for useful speed)",
        )
    if accel == "kvm" and check.works and not check.fast:
        return HostCheck(False, False, f"{check.detail}; but runtime.vm_accel=kvm")
    return check


def as_host_check(result: Any) -> HostCheck:
    """A probe's answer as a :class:`HostCheck`: one already, a
    ``(works, accelerated, detail)`` triple, or an object with those attributes."""
    if isinstance(result, HostCheck):
        return result
    if isinstance(result, tuple) and len(result) == 3:
        works, fast, detail = result
        return HostCheck(bool(works), bool(works) and bool(fast), str(detail))
    works = bool(getattr(result, "works", getattr(result, "ok", False)))
    fast = bool(getattr(result, "fast", getattr(result, "accelerated", False)))
    return HostCheck(works, works and fast, str(getattr(result, "detail", result)))


async def check_class(settings: Settings, name: str, driver: Driver) -> HostCheck:
    """Whether ``name`` can run here: the host check, then the driver prepared
    (the base image). :func:`prove_class` then runs a machine."""
    host = await host_check(settings, name)
    if host.works:
        await driver.prepare()
    return host


async def prove_class(settings: Settings, name: str, driver: Driver) -> str:
    """A throwaway machine of ``name`` answers; raises with the driver's reason
    when none does. Returns what it took, for the class's detail."""
    # The sandboxes' own limits (gVisor's kernel needs threads a tiny pids limit
    # would starve) and disk: what the machine prepares then serves the first
    # sandboxes (the disk size's mkfs; the vm class's template of that shape,
    # which warm pools build anyway), not a shape no sandbox has (a smaller disk
    # made the vm class boot one more template guest for the probe alone).
    limits = Limits.of(settings.runtime)
    took = await asyncio.wait_for(smoke(driver, limits), PROOF_TIMEOUT_S)
    return f"a sandbox answered in {took * 1000:.0f} ms"


async def smoke(driver: Driver, limits: Limits) -> float:
    """Start a throwaway machine, see its agent answer, destroy it; seconds to
    ready. Raises with the driver's reason when the class cannot run here."""
    import time

    from .agent_client import AgentClient

    machine_id = f"probe-{uuid.uuid4().hex[:12]}"
    started = time.perf_counter()
    await driver.create(
        MachineSpec(
            machine_id=machine_id, hostname="probe", limits=limits, labels={"podbay.role": "probe"}
        )
    )
    try:
        await driver.start(machine_id)
        took = time.perf_counter() - started
        socket = driver.agent_socket(machine_id)
        result = await asyncio.to_thread(lambda: AgentClient(Path(socket)).exec(["true"]))
        if result.exit_code != 0:
            raise RuntimeError(f"`true` exited {result.exit_code} in the probe machine")
        return took
    finally:
        await driver.destroy(machine_id)
