"""HTTP routes: parse, call a service, serialize. Nothing else."""
