"""``podbay serve`` with its state in PostgreSQL (``store.url``), through the HTTP API."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from podbay.testing.postgres import TemporaryCluster

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def cluster() -> Iterator[TemporaryCluster]:
    with TemporaryCluster.start() as c:
        yield c


def test_serve_on_postgres_attaches_and_keeps_state_there(make_server, cluster):
    url = cluster.create_database()
    server = make_server({"PODBAY_STORE_URL": url})
    token = server.create_deployment("pg-agent")  # the CLI writes to the same database
    attached = server.attach(token, "t1")
    assert attached.status_code == 200, attached.text
    handle = attached.json()
    assert handle["start"] in {"created", "warm"}
    ran = server.exec(handle, "sh", "-c", "echo hi from $(hostname)")
    assert ran.status_code == 200
    assert ran.json()["stdout"].startswith("hi from")
    assert server.attach(token, "t1").json()["start"] == "reused"

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT s.name, s.state FROM sandboxes s JOIN deployments d"
            " ON d.id = s.deployment_id WHERE d.name = 'pg-agent'"
        ).fetchall()
    assert rows == [("t1", "running")]
    assert not (server.data_dir / "podbay.db").exists()  # nothing went to SQLite

    # Another server process on the same database sees the same sandbox.
    server.terminate()
    server.spawn()
    server.wait_ready()
    assert server.attach(token, "t1").json()["start"] == "reused"
    assert server.api("DELETE", "/api/v1/sandboxes/t1", token).status_code in {200, 204}


def test_serve_refuses_a_store_url_it_cannot_use(tmp_path, cluster):
    for url, says in [
        ("mysql://x/y", "postgresql://"),
        (cluster.url("no_such_database"), "cannot use the database"),
    ]:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "podbay.cli.main",
                "serve",
                "--data-dir",
                str(tmp_path / "data"),
                "--listen",
                "127.0.0.1:0",
            ],
            env={
                "PATH": "/usr/bin:/bin",
                "PODBAY_STORE_URL": url,
                "PODBAY_RUNTIME_RUN_DIR": str(tmp_path / "run"),
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2, result.stderr
        assert says in result.stderr
