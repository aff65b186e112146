"""The driver conformance suite against the ``oci`` driver (real runc, as root)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from podbay.testing.driver_conformance import DriverConformance, Harness
from podbay.testing.fixtures import DriverSession, mark_owner, require_host, sandbox_settings

pytestmark = pytest.mark.root


class TestOciConformance(DriverConformance):
    @pytest.fixture
    def conformance(self, oci_session: DriverSession) -> Harness:
        return Harness(
            oci_session.driver,
            oci_session.run,
            oci_session.settings,
            factory="podbay.runtime.oci.driver:OciDriver",
        )


@pytest.fixture(scope="module")
def generic_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DriverSession]:
    """runc under another name: the driver then takes the path every other OCI
    runtime (crun, runsc) gets — state, pause and resume through the command line."""
    require_host()
    bin_dir = tmp_path_factory.mktemp("bin")
    runc = shutil.which("runc")
    assert runc is not None
    link = bin_dir / "oci-runtime"
    os.symlink(runc, link)
    settings = sandbox_settings(tmp_path_factory.mktemp("podbay-generic"), oci_runtime=str(link))
    mark_owner(settings)
    session = DriverSession(settings)
    assert not session.driver.runc.is_runc
    session.run(session.driver.prepare())
    yield session
    session.close()
    Path(link).unlink()


class TestGenericOciRuntime(DriverConformance):
    @pytest.fixture
    def conformance(self, generic_session: DriverSession) -> Harness:
        return Harness(
            generic_session.driver,
            generic_session.run,
            generic_session.settings,
            factory="podbay.runtime.oci.driver:OciDriver",
        )
