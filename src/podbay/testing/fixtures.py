"""Pytest fixtures for real sandboxes, shared by every test suite that needs them.

Import the ones you use into a ``conftest.py``::

    from podbay.testing.fixtures import oci_driver, oci_session, oci_settings  # noqa: F401

- ``oci_settings`` (session): :class:`~podbay.settings.Settings` for a
  throwaway data directory whose base image comes from one cache shared by
  every test session (``$PODBAY_TEST_IMAGE_DIR``, default
  ``/var/tmp/podbay-test-images``), so the image is built once per machine.
- ``oci_session`` (session): a prepared :class:`OciDriver` on its own event
  loop, for synchronous tests (``session.run(driver.start(id))``).
- ``oci_driver`` (function): a fresh, unprepared driver on the same settings,
  for tests that run their own event loop; machines it left are destroyed.

Every fixture skips (with the reason) when the host cannot run sandboxes:
not root, or no runc. At session end every machine of the data directory is
destroyed and its leftovers collected.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import pytest

from podbay.runtime.base import Limits, MachineSpec
from podbay.settings import GIB, Settings

if TYPE_CHECKING:
    from podbay.runtime.oci.driver import OciDriver
    from podbay.runtime.vm.driver import VmDriver
    from podbay.wire.data import ExecResult

T = TypeVar("T")
log = logging.getLogger("podbay.testing")

DEFAULT_IMAGE_DIR = "/var/tmp/podbay-test-images"
#: Environment layers shared by test sessions (see :func:`shared_layer_dir`).
DEFAULT_LAYER_DIR = "/var/tmp/podbay-test-layers"
#: Test sessions' run directories (short paths, see ``runtime.run_dir``).
RUN_ROOT = "/run/podbay-test"


def host_problem() -> str | None:
    """Why this host cannot run real sandboxes, or ``None``."""
    if os.geteuid() != 0:
        return "needs root (real namespaces, mounts and cgroups)"
    if shutil.which("runc") is None:
        return "needs runc (apt-get install runc)"
    if shutil.which("mkfs.ext4") is None:
        return "needs e2fsprogs"
    return None


def require_host() -> None:
    """Skip a test where this host cannot run sandboxes, naming why; under
    ``./run test`` (``PODBAY_TEST_REQUIRE_SANDBOXES=1``, as CI runs it) fail
    instead, because a suite that quietly skipped its real sandboxes proves nothing."""
    problem = host_problem()
    if problem is not None:
        host_cannot(problem)


def host_cannot(problem: str) -> NoReturn:
    """Skip the test because this host lacks what it needs (``problem`` says
    what); under ``PODBAY_TEST_REQUIRE_SANDBOXES=1`` fail it instead."""
    if os.environ.get("PODBAY_TEST_REQUIRE_SANDBOXES") == "1":
        pytest.fail(f"this host cannot run sandboxes: {problem}")
    pytest.skip(problem)


def shared_layer_dir() -> str:
    """A layer cache every test session shares (``$PODBAY_TEST_LAYER_DIR``), for
    suites whose declared environment is what their sandboxes need, not what
    they test: its layer is built once per machine, like the base image. Suites
    that test building keep their data directory's own cache."""
    return os.environ.get("PODBAY_TEST_LAYER_DIR", DEFAULT_LAYER_DIR)


def sandbox_settings(data_dir: Path, **runtime: Any) -> Settings:
    """Settings for tests: the shared image cache and a short run directory."""
    settings = Settings.load(environ={}, data_dir=data_dir)
    settings.runtime.image_dir = os.environ.get("PODBAY_TEST_IMAGE_DIR", DEFAULT_IMAGE_DIR)
    settings.runtime.run_dir = f"{RUN_ROOT}/{uuid.uuid4().hex[:8]}"
    settings.runtime.warm_pool = 0
    for key, value in runtime.items():
        setattr(settings.runtime, key, value)
    return settings


def small_spec(
    machine_id: str | None = None,
    *,
    hostname: str = "sandbox",
    memory_bytes: int = 512 * 1024 * 1024,
    pids: int = 256,
    disk_bytes: int = 2 * GIB,
    env: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    layers: tuple[Path, ...] = (),
    named_later: bool = False,
) -> MachineSpec:
    return MachineSpec(
        machine_id=machine_id or f"t-{uuid.uuid4().hex[:12]}",
        hostname=hostname,
        limits=Limits(memory_bytes=memory_bytes, cpus=1.0, pids=pids, disk_bytes=disk_bytes),
        env=env or {},
        labels=labels or {},
        layers=layers,
        named_later=named_later,
    )


class DriverSession:
    """A driver and the event loop it lives on, for synchronous tests."""

    def __init__(self, settings: Settings) -> None:
        from podbay.runtime.oci.driver import OciDriver

        self.settings = settings
        self.runner = asyncio.Runner()
        self.driver = OciDriver(settings)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    def close(self) -> None:
        from podbay.runtime.oci import gc

        try:
            self.run(gc.collect(self.driver, everything=True))
            self.run(self.driver.close())
        finally:
            self.runner.close()


def cleanup(settings: Settings) -> None:
    """Destroy every machine of the data directory, in each class that has data
    there (``gvisor`` and ``vm`` keep their own), and collect the leftovers."""
    from podbay.runtime.classes import CONTAINER, GVISOR, VM, class_settings

    # Each class is cleaned even when another's cleanup fails: one failure
    # used to leave the next class's machines running after the test.
    failures: list[Exception] = []
    if (settings.data_dir / VM / "machines").is_dir():
        try:
            _destroy_vms(settings)
        except Exception as exc:  # noqa: BLE001 - raised below with the others' as a group
            failures.append(exc)
    for name in (CONTAINER, GVISOR):
        derived = class_settings(settings, name)
        if name == CONTAINER or _has_machines(derived):
            try:
                DriverSession(derived).close()
            except Exception as exc:  # noqa: BLE001 - raised below with the others' as a group
                failures.append(exc)
    # The volumes' loop mounts last: no machine binds them any more.
    try:
        from podbay.host.volumes import VolumeStore

        VolumeStore.from_settings(settings).unmount_all()
    except Exception as exc:  # noqa: BLE001 - raised below with the others' as a group
        failures.append(exc)
    if failures:
        raise ExceptionGroup(f"cleaning up {settings.data_dir}", failures)


def _has_machines(settings: Settings) -> bool:
    """Whether a class may have left machines: its data directory, or, that
    gone (a killed session's, removed by pytest's tmp_path retention), its run
    directory or cgroups, where its sandboxes may still run, suspended too."""
    from podbay.host.cgroups import Cgroups
    from podbay.host.layout import Layout

    layout = Layout.from_settings(settings)
    return (
        settings.data_dir.exists()
        or layout.run_dir.exists()
        or bool(Cgroups().existing(layout.cgroup_parent))
    )


def _destroy_vms(settings: Settings) -> None:
    from podbay.runtime.vm.driver import VmDriver

    async def destroy_all() -> None:
        driver = VmDriver(settings)
        try:
            for machine_id in driver.machine_ids():
                await driver.destroy(machine_id)
        finally:
            await driver.close()

    asyncio.run(destroy_all())


async def end_vm_driver(driver: VmDriver) -> None:
    """Destroy every machine ``driver`` knows, close it, and remove its
    session's cgroups (empty once all are gone)."""
    for machine_id in driver.machine_ids():
        await driver.destroy(machine_id)
    await driver.close()
    limits = driver.network.slirps.limits
    for parent in [driver.cgroup_parent] + ([limits.cgroup_parent] if limits else []):
        driver.cgroups.remove(parent)


def forget_run_dir(settings: Settings) -> None:
    """Remove a test session's run directory and its owner mark."""
    run_dir = Path(settings.runtime.run_dir)
    (run_dir / "test-session.json").unlink(missing_ok=True)
    shutil.rmtree(run_dir, ignore_errors=True)


def destroy_vm_machines(settings: Settings) -> None:
    """Every ``vm`` machine of a data directory (a killed test session's): their
    QEMUs, networks and files."""
    from podbay.runtime.vm.driver import VmDriver

    async def adopt_and_end() -> None:
        driver = VmDriver(settings)
        await driver.adopt()
        try:
            await end_vm_driver(driver)
        finally:
            forget_run_dir(settings)

    asyncio.run(adopt_and_end())


#: The OCI runtimes a suite can run its sandboxes under (see :func:`settings_for`).
OCI_RUNTIMES = ("runc", "runsc")


def settings_for(
    tmp_path_factory: pytest.TempPathFactory, oci_runtime: str = "runc", **runtime: Any
) -> Iterator[Settings]:
    """The body of ``oci_settings``, for a module that runs under several runtimes
    or with other ``runtime`` settings::

    @pytest.fixture(scope="module", params=OCI_RUNTIMES)
    def oci_settings(request, tmp_path_factory):
        yield from settings_for(tmp_path_factory, request.param)

    @pytest.fixture(scope="module")
    def oci_session(oci_settings):
        yield from session_for(oci_settings)
    """
    require_host()
    if shutil.which(oci_runtime) is None:
        host_cannot(f"needs {oci_runtime} (apt-get install {oci_runtime})")
    sweep_dead_sessions()
    settings = sandbox_settings(
        tmp_path_factory.mktemp(f"podbay-data-{oci_runtime}"), oci_runtime=oci_runtime, **runtime
    )
    mark_owner(settings)
    yield settings
    cleanup(settings)
    Path(settings.runtime.run_dir, OWNER_FILE).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        Path(settings.runtime.run_dir).rmdir()


@pytest.fixture(scope="session")
def oci_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    yield from settings_for(tmp_path_factory)


OWNER_FILE = "test-session.json"


def mark_owner(settings: Settings) -> None:
    """Record which process and data directory a test run directory belongs to."""
    run_dir = Path(settings.runtime.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / OWNER_FILE).write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "data_dir": str(settings.data_dir),
                "image_dir": settings.runtime.image_dir,
            }
        )
    )


def sweep_dead_sessions() -> None:
    """Destroy what test sessions that were killed left (their machines, mounts,
    cgroups, networks): each test run directory names its owner."""
    for owner in Path(RUN_ROOT).glob(f"*/{OWNER_FILE}"):
        try:
            info = json.loads(owner.read_text())
            os.kill(int(info["pid"]), 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except (OSError, ValueError, KeyError):
            continue
        settings = Settings.load(environ={}, data_dir=Path(info["data_dir"]))
        settings.runtime.image_dir = info["image_dir"]
        settings.runtime.run_dir = str(owner.parent)
        try:
            cleanup(settings)
        except Exception as exc:  # noqa: BLE001 - said; the other dead sessions are still swept
            log.warning("sweeping %s left by a killed session failed: %r", info["data_dir"], exc)
        if (owner.parent / "vm").is_dir():
            with contextlib.suppress(Exception):
                destroy_vm_machines(settings)
        owner.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            owner.parent.rmdir()


def session_for(settings: Settings) -> Iterator[DriverSession]:
    """The body of ``oci_session``: a prepared driver on ``settings``."""
    session = DriverSession(settings)
    # The loop is closed however the driver's prepare or close ends: a loop
    # left open is a ResourceWarning in whichever later test collects it.
    try:
        session.run(session.driver.prepare())
        yield session
        session.run(session.driver.close())
    finally:
        session.runner.close()


@pytest.fixture(scope="session")
def oci_session(oci_settings: Settings) -> Iterator[DriverSession]:
    yield from session_for(oci_settings)


@pytest.fixture
def oci_driver(oci_session: DriverSession) -> Iterator[OciDriver]:
    from podbay.runtime.oci.driver import OciDriver

    driver = OciDriver(oci_session.settings)
    before = set(driver.machine_ids())
    yield driver
    for machine_id in set(driver.machine_ids()) - before:
        oci_session.run(oci_session.driver.destroy(machine_id))


class Machines:
    """Start real machines in a test; every one is destroyed afterwards.

    >>> # m = oci_machines.up(memory_bytes=256 << 20); m.agent.sh("id -u").stdout
    """

    def __init__(self, session: DriverSession) -> None:
        self.session = session
        self.ids: list[str] = []

    def up(self, **spec: Any) -> Machine:
        made = small_spec(**spec)
        self.ids.append(made.machine_id)
        self.session.run(self.session.driver.create(made))
        self.session.run(self.session.driver.start(made.machine_id))
        return Machine(made.machine_id, self.session)

    def destroy_all(self) -> None:
        for machine_id in self.ids:
            self.session.run(self.session.driver.destroy(machine_id))


class Machine:
    def __init__(self, machine_id: str, session: DriverSession) -> None:
        from podbay.runtime.agent_client import AgentClient

        self.id = machine_id
        self.session = session
        self.agent = AgentClient(session.driver.agent_socket(machine_id))

    def sh(self, script: str, *, timeout_ms: int = 60_000) -> ExecResult:
        return self.agent.sh(script, timeout_ms=timeout_ms)

    def init_pid(self) -> int:
        state = self.session.driver.runc.state(self.id)
        assert state is not None
        return int(state.pid)


@pytest.fixture
def oci_machines(oci_session: DriverSession) -> Iterator[Machines]:
    machines = Machines(oci_session)
    yield machines
    machines.destroy_all()
