"""Ad hoc (not committed): the conformance suite on a vm driver that checkpoints."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from podbay.testing.driver_conformance import DriverConformance, Harness
from podbay.testing.vm import VmSession

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def vm_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmSession]:
    session = VmSession.open(
        tmp_path_factory.mktemp("podbay-vm"), memory_bytes=512 << 20, checkpoint_classes="vm"
    )
    yield session
    session.close()


class TestVmCheckpointConformance(DriverConformance):
    @pytest.fixture
    def conformance(self, vm_session: VmSession) -> Harness:
        return Harness(
            vm_session.driver,
            vm_session.run,
            vm_session.settings,
            factory="podbay.runtime.vm.driver:VmDriver",
            settle=vm_session.driver.wait_templates,
        )
