"""Installed environments: built once per layer key, cached, shared.

A sandbox section's installed result is a read-only *layer* over the base
image. :class:`Environments` answers, for a section, whether its layer is
ready (use it), being built (tell the client to come back: 202), or failed
(409 ``SANDBOX_PREPARE_FAILED`` with the failing step and its output), and
starts a build when none runs. Concurrent first attaches share one build.

Where things live (one fact, one home): a built layer is the directory
``<layers>/<key>/`` holding ``rootfs/`` and ``layer.json``; the directory
appears by an atomic rename only when complete, so its presence *is* the
cache. Builds in flight and recent failures are this process's memory.

A build is a throwaway machine from the base image: the plan's steps run
through its agent, it is stopped, its own changes are exported as the
layer, and it is destroyed whatever happened.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from podbay.dataplane.environment_seam import Building
from podbay.errors import PrepareFailed as PrepareFailed  # re-exported: defined in the one tree
from podbay.errors import SetupFailed as SetupFailed
from podbay.runtime.agent_client import AgentClient, AgentError
from podbay.runtime.base import Driver, Limits, MachineSpec
from podbay.wire.control import BuildStep

from .plan import Step, plan
from .spec import SandboxSection

log = logging.getLogger("podbay.environment")

#: A single build step may take this long before it is killed.
STEP_TIMEOUT_S = 30 * 60
#: A failed build is reported for this long before an attach may try again.
FAILURE_MEMORY_S = 30.0
#: Suggested ``Retry-After`` while a layer builds.
RETRY_AFTER_S = 2
#: A staging directory untouched this long is a crashed build's, not one under way
#: in another server sharing the cache (``runtime.layer_dir``).
STALE_STAGING_S = 60 * 60


async def agent_exec(
    socket: Path,
    argv: tuple[str, ...],
    *,
    cwd: str,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> tuple[int, str]:
    """Run ``argv`` through the agent at ``socket``: (exit code, stdout + stderr).
    Builds and setup are platform work, so they talk to the agent directly."""
    client = AgentClient(socket, timeout=timeout_s + 30)
    try:
        result = await asyncio.to_thread(
            client.exec,
            list(argv),
            cwd=cwd,
            timeout_ms=int(timeout_s * 1000),
            env=dict(env) if env else None,
        )
    except AgentError as exc:  # nothing ran (e.g. COMMAND_START_FAILED)
        return 127, str(exc.body)
    return result.exit_code, (result.stdout + result.stderr).strip()


def tail(text: str, lines: int = 20) -> str:
    """The last ``lines`` lines of some output, for an error message."""
    return "\n".join(text.rstrip().splitlines()[-lines:])


@dataclass(frozen=True)
class Ready:
    layers: tuple[Path, ...]


@dataclass(frozen=True)
class Failed:
    error: PrepareFailed


class LayerCache:
    """Built layers on disk, one directory per layer key."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def rootfs(self, key: str) -> Path:
        return self.root / key / "rootfs"

    def is_ready(self, key: str) -> bool:
        return (self.root / key / "layer.json").is_file()

    def staging(self, key: str) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f".{key}.{secrets.token_hex(4)}.partial"
        path.mkdir()
        return path

    def publish(self, key: str, staged: Path, info: Mapping[str, object]) -> None:
        (staged / "layer.json").write_text(json.dumps(dict(info), indent=2))
        try:
            staged.rename(self.root / key)
        except OSError:
            # Someone published the same key first: theirs is as good as ours.
            shutil.rmtree(staged, ignore_errors=True)

    def sweep(self) -> None:
        """Remove staging directories a crashed build left behind: those untouched
        for :data:`STALE_STAGING_S` (younger ones may be another server's builds)."""
        if not self.root.is_dir():
            return
        for leftover in self.root.glob(".*.partial"):
            try:
                touched = max(p.stat().st_mtime for p in (leftover, *leftover.iterdir()))
            except OSError:
                continue  # gone meanwhile: published or swept by its owner
            if time.time() - touched > STALE_STAGING_S:
                shutil.rmtree(leftover, ignore_errors=True)


class LayerBuilder:
    """Builds one layer in a throwaway machine."""

    def __init__(self, driver: Driver, cache: LayerCache, limits: Limits) -> None:
        self.driver = driver
        self.cache = cache
        self.limits = limits
        #: Builds under way: layer key -> (started, step number, steps, what it does).
        self._at: dict[str, tuple[float, int, int, str]] = {}

    def begin(self, key: str, section: SandboxSection) -> None:
        """Mark the build of ``key`` as begun (step 1 of the plan's steps and two
        more: starting the build machine, saving the layer), so that the 202
        answered as it is started already shows it."""
        self._at.setdefault(
            key, (time.monotonic(), 1, len(plan(section)) + 2, "start the build machine")
        )

    def _step(self, key: str, number: int, doing: str) -> None:
        started, _, steps, _ = self._at[key]
        self._at[key] = (started, number, steps, doing)

    def progress(self, key: str) -> BuildStep | None:
        """Where the build of ``key`` stands, while this builder runs it."""
        at = self._at.get(key)
        if at is None:
            return None
        started, step, steps, doing = at
        return BuildStep(
            step=step,
            steps=steps,
            doing=doing,
            elapsed_seconds=round(time.monotonic() - started, 1),
        )

    def key(self, section: SandboxSection) -> str:
        """The cache key of ``section``'s layer: what it installs, over which base."""
        return f"{self.driver.base_image[:16]}-{section.layer_key()[:40]}"

    async def build(self, section: SandboxSection) -> Path:
        key = self.key(section)
        self.begin(key, section)
        try:
            return await self._build(section, key)
        finally:
            self._at.pop(key, None)

    async def _build(self, section: SandboxSection, key: str) -> Path:
        machine_id = f"build-{key[:12]}-{secrets.token_hex(3)}"
        spec = MachineSpec(
            machine_id=machine_id,
            hostname="podbay-build",
            limits=self.limits,
            labels={"podbay.role": "builder", "podbay.layer": key},
        )
        started = time.monotonic()
        steps = plan(section)
        log.info("building environment layer %s (%d steps)", key[:12], len(steps))
        self._step(key, 1, "start the build machine")
        await self.driver.create(spec)
        try:
            await self.driver.start(machine_id)
            socket = self.driver.agent_socket(machine_id)
            for number, step in enumerate(steps, 2):
                self._step(key, number, step.name)
                await self._run(socket, step, key)
            self._step(key, len(steps) + 2, "save the layer")
            await self.driver.stop(machine_id)
            staged = self.cache.staging(key)
            try:
                await self.driver.export_layer(machine_id, staged / "rootfs")
                self.cache.publish(
                    key,
                    staged,
                    {
                        "key": key,
                        "section": section.canonical(),
                        "built_in_seconds": round(time.monotonic() - started, 3),
                        "built_at": time.time(),
                    },
                )
            except BaseException:
                shutil.rmtree(staged, ignore_errors=True)
                raise
        finally:
            await self.driver.destroy(machine_id)
        log.info("environment layer %s ready in %.1f s", key[:12], time.monotonic() - started)
        return self.cache.rootfs(key)

    async def _run(self, socket: Path, step: Step, key: str) -> None:
        log.info("layer %s: %s", key[:12], step.name)
        exit_code, output = await agent_exec(
            socket, step.argv, env=step.env, cwd="/", timeout_s=STEP_TIMEOUT_S
        )
        for line in output.splitlines()[-200:]:
            log.debug("layer %s: %s | %s", key[:12], step.name, line)
        if exit_code == 0:
            return
        if step.fallback is not None:
            log.info("layer %s: %s failed; retrying with the build toolchain", key[:12], step.name)
            for before in step.before_fallback:
                await self._run(socket, before, key)
            await self._run(socket, step.fallback, key)
            return
        raise PrepareFailed(step.name, exit_code, tail(output))


class Environments:
    """Which layers a section needs, building them at most once at a time."""

    def __init__(self, builder: LayerBuilder) -> None:
        self.builder = builder
        self.cache = builder.cache
        self._building: dict[str, asyncio.Task[Path]] = {}
        self._failed: dict[str, tuple[float, PrepareFailed]] = {}
        self.cache.sweep()

    def status(self, section: SandboxSection) -> Ready | Building | Failed:
        """Where ``section``'s layer stands; starts a build if none runs or is cached."""
        if section.is_empty_install:
            return Ready(layers=())
        key = self.builder.key(section)
        if self.cache.is_ready(key):
            return Ready(layers=(self.cache.rootfs(key),))
        failure = self._failed.get(key)
        if failure is not None:
            when, error = failure
            if time.monotonic() - when < FAILURE_MEMORY_S:
                return Failed(error)
            del self._failed[key]
        task = self._building.get(key)
        if task is None:
            self.builder.begin(key, section)
            task = asyncio.get_running_loop().create_task(self._build(key, section))
            self._building[key] = task
        return Building(
            retry_after_seconds=RETRY_AFTER_S, done=task, progress=self.builder.progress(key)
        )

    async def wait(self, section: SandboxSection) -> Ready | Failed:
        """Build if needed and wait for the outcome (tests, ``dev up``, pre-warming)."""
        while True:
            state = self.status(section)
            if not isinstance(state, Building):
                return state
            task = self._building.get(self.builder.key(section))
            if task is not None:
                await asyncio.wait({task})
            else:
                await asyncio.sleep(0.05)

    async def _build(self, key: str, section: SandboxSection) -> Path:
        try:
            return await self.builder.build(section)
        except PrepareFailed as exc:
            log.warning("environment layer %s failed: %s", key[:12], exc)
            self._failed[key] = (time.monotonic(), exc)
            raise
        except Exception as exc:
            log.exception("environment layer %s: build broke", key[:12])
            self._failed[key] = (
                time.monotonic(),
                PrepareFailed("start the build machine", -1, str(exc)),
            )
            raise
        finally:
            self._building.pop(key, None)

    async def close(self) -> None:
        for task in list(self._building.values()):
            task.cancel()
        await asyncio.gather(*self._building.values(), return_exceptions=True)


async def run_setup(socket: Path, section: SandboxSection, *, timeout_s: float = 600) -> None:
    """Run the section's setup commands, in order, in /workspace of a fresh sandbox."""
    for index, command in enumerate(section.setup):
        exit_code, output = await agent_exec(
            socket, ("/bin/sh", "-c", command), cwd="/workspace", timeout_s=timeout_s
        )
        if exit_code != 0:
            raise SetupFailed(index, command, exit_code, tail(output))
