"""Code that runs inside the guest (stdlib only, copied into its initramfs)."""
