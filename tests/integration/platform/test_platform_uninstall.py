"""``podbay gc --all`` leaves only the deployments and the keys, and says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from podbay import SandboxClient
from podbay.cli.uninstall import KEPT, human, size_of
from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root


def gc_all(server: PlatformServer, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = ["gc", "--all", "--data-dir", str(server.data_dir), *extra]
    return subprocess.run(
        [sys.executable, "-m", "podbay.cli.main", *argv],
        env=server.env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_gc_all_removes_all_but_the_deployments_and_keys(tmp_path: Path) -> None:
    with PlatformServer.start(tmp_path / "serve") as server:
        token = server.create_deployment("uninstall")
        with SandboxClient(identity_token=token, server_url=server.base_url) as client:
            client.exec("kept-until-gc", ["touch", "/workspace/f"])
        # While the server runs, gc --all refuses: the server stands on these files.
        refused = gc_all(server)
        assert refused.returncode == 1
        assert refused.stderr.startswith(f"podbay: podbay serve runs on {server.data_dir}")
        assert (server.data_dir / "machines").is_dir()
        server.stop()
        # The caches a real install keeps in its data directory (here shared, elsewhere).
        for cache in ("images/0123abcd/rootfs", "layers/4567ef/root"):
            (server.data_dir / cache).mkdir(parents=True)
            (server.data_dir / cache / "file").write_bytes(b"x" * 4096)
        (server.data_dir / "dev-serve.log").write_text("log\n")

        done = gc_all(server, "--json")
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        left = sorted(p.name for p in server.data_dir.iterdir() if p.name in KEPT)
        assert "keys" in left
        assert "podbay.db" in left
        # Besides them, only the layout's empty directories.
        others = [p for p in server.data_dir.iterdir() if p.name not in KEPT]
        assert [f for p in others for f in p.rglob("*") if not f.is_dir()] == [], others
        removed = [line.split(" (")[0] for line in answer["removed"]]
        for gone in ("images", "layers", "agent", "dev-serve.log"):
            assert f"removed {server.data_dir / gone}" in removed, removed
        stays = [server.data_dir / name for name in left]
        assert answer["kept"] == [f"kept {p} ({KEPT[p.name]}, {human(size_of(p))})" for p in stays]
        # The deployments are kept: a server started again still knows the token.
        server.spawn()
        server.wait_ready()
        with SandboxClient(identity_token=token, server_url=server.base_url) as client:
            assert client.list() == []
        server.stop()
        text = gc_all(server)
        assert text.returncode == 0, text.stderr
        assert f"to uninstall: rm -rf {server.data_dir}" in text.stdout
