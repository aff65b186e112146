from podbay.testing.fixtures import (  # noqa: F401
    oci_driver,
    oci_machines,
    oci_session,
    oci_settings,
)
