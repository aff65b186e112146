from podbay.testing.fixtures import oci_driver, oci_session, oci_settings  # noqa: F401
