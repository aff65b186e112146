from collections.abc import Iterator

import pytest

from podbay.settings import Settings
from podbay.testing.fixtures import (  # noqa: F401
    OCI_RUNTIMES,
    oci_driver,
    oci_session,
    settings_for,
)


@pytest.fixture(scope="session", params=OCI_RUNTIMES)
def oci_settings(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    """The oci driver's conformance under runc and under runsc (gVisor)."""
    yield from settings_for(tmp_path_factory, request.param)
