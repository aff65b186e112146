"""The driver conformance suite against the ``oci`` driver (real runc, as root)."""

from __future__ import annotations

import pytest

from podbay.testing.driver_conformance import DriverConformance, Harness
from podbay.testing.fixtures import DriverSession

pytestmark = pytest.mark.root


class TestOciConformance(DriverConformance):
    @pytest.fixture
    def conformance(self, oci_session: DriverSession) -> Harness:
        return Harness(oci_session.driver, oci_session.run, oci_session.settings,
                       factory="podbay.runtime.registry:build")
