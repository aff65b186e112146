"""One ``LocalCluster`` (PostgreSQL, two ``podbay control`` behind haproxy,
three ``podbay node``) for the modules here that take its settings:
starting one costs seconds of the suite, and stopping it as many again.

Modules run in file order: test_cluster.py leaves no sandbox behind, so the
move tests find the nodes empty; test_cluster_moves.py kills a node in its
last test. test_cluster_routes.py starts its own (no lifecycle pass there),
on the same PostgreSQL server (a database of its own): one initdb fewer.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from podbay.testing.local_cluster import LocalCluster
from podbay.testing.postgres import TemporaryCluster

#: The move tests' settings (test_cluster.py needs none): a lifecycle pass
#: every half second, no idle suspension or reclaim during the tests, an age
#: ceiling an hour away (a test that wants one brings it forward), and
#: gVisor's class beside runc's.
ENV = {
    "PODBAY_LIFECYCLE_MAX_AGE_SECONDS": "3600",
    "PODBAY_LIFECYCLE_INTERVAL_SECONDS": "0.5",
    "PODBAY_LIFECYCLE_IDLE_SECONDS": "600",
    "PODBAY_LIFECYCLE_SUSPENDED_TTL_SECONDS": "600",
    # gVisor beside runc (the default): test_cluster_moves.py moves one gVisor sandbox.
    "PODBAY_RUNTIME_CLASSES": "container,gvisor",
}


@pytest.fixture(scope="package")
def postgres() -> Iterator[TemporaryCluster]:
    with TemporaryCluster.start() as db:
        yield db


@pytest.fixture(scope="package")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, postgres: TemporaryCluster
) -> Iterator[LocalCluster]:
    with LocalCluster.start(tmp_path_factory.mktemp("cluster"), env=ENV, postgres=postgres) as c:
        yield c
