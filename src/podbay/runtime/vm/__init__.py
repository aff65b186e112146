"""The ``vm`` driver: each machine is a QEMU microVM with its own kernel."""
