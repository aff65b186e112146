"""Environments' bookkeeping: one build per key, failures remembered, then retried."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from podbay.environment import build
from podbay.environment.build import (
    Building,
    Environments,
    Failed,
    LayerCache,
    PrepareFailed,
    Ready,
)
from podbay.environment.spec import SandboxSection, parse_section

SECTION = parse_section({"toolchain": "never", "packages": ["tree"]})


class FakeBuilder:
    """Publishes a layer after a short wait; fails while ``broken`` is set."""

    def __init__(self, root: Path) -> None:
        self.cache = LayerCache(root)
        self.builds = 0
        self.broken = False

    def key(self, section: SandboxSection) -> str:
        return "base-" + section.layer_key()[:12]

    def begin(self, key: str, section: SandboxSection) -> None:
        pass

    def progress(self, key: str) -> None:
        return None

    async def build(self, section: SandboxSection) -> Path:
        self.builds += 1
        await asyncio.sleep(0.05)
        if self.broken:
            raise PrepareFailed("install system packages", 100, "E: Unable to locate package")
        key = self.key(section)
        staged = self.cache.staging(key)
        (staged / "rootfs").mkdir()
        self.cache.publish(key, staged, {"key": key})
        return self.cache.rootfs(key)


def test_nothing_to_install_is_ready_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        envs = Environments(FakeBuilder(tmp_path))  # type: ignore[arg-type]
        assert envs.status(parse_section({"toolchain": "never", "env": {"A": "1"}})) == Ready(())

    asyncio.run(main())


def test_concurrent_first_attaches_share_one_build(tmp_path: Path) -> None:
    async def main() -> None:
        builder = FakeBuilder(tmp_path)
        envs = Environments(builder)  # type: ignore[arg-type]
        assert isinstance(envs.status(SECTION), Building)
        results = await asyncio.gather(*(envs.wait(SECTION) for _ in range(20)))
        assert builder.builds == 1
        assert all(r == Ready((builder.cache.rootfs(builder.key(SECTION)),)) for r in results)
        # A new process finds the layer on disk: no build.
        again = Environments(FakeBuilder(tmp_path))  # type: ignore[arg-type]
        assert isinstance(again.status(SECTION), Ready)

    asyncio.run(main())


def test_a_failure_is_reported_then_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        builder = FakeBuilder(tmp_path)
        builder.broken = True
        envs = Environments(builder)  # type: ignore[arg-type]
        outcome = await envs.wait(SECTION)
        assert isinstance(outcome, Failed)
        assert outcome.error.step == "install system packages"
        assert isinstance(envs.status(SECTION), Failed)  # remembered: no rebuild storm
        assert builder.builds == 1
        monkeypatch.setattr(build, "FAILURE_MEMORY_S", 0.0)
        builder.broken = False
        assert isinstance(envs.status(SECTION), Building)  # tried again
        assert isinstance(await envs.wait(SECTION), Ready)
        assert builder.builds == 2

    asyncio.run(main())


def test_staging_leftovers_are_swept(tmp_path: Path) -> None:
    cache = LayerCache(tmp_path)
    leftover, under_way = cache.staging("k"), cache.staging("k")
    for staged in (leftover, under_way):
        (staged / "rootfs").mkdir()
    long_ago = time.time() - build.STALE_STAGING_S - 60
    for path in (leftover, leftover / "rootfs"):
        os.utime(path, (long_ago, long_ago))
    cache.sweep()
    assert not leftover.exists()
    # Touched within the hour: another server sharing the cache may be building it.
    assert under_way.is_dir()
