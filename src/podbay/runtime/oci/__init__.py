"""The ``oci`` driver: sandboxes as OCI bundles run by runc (see :mod:`.driver`)."""
