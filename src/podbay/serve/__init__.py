"""The composition root: the one place that builds ``podbay serve`` (control
plane, node and gateway in one process), ``podbay control`` and ``podbay node``
from the planes, which import nothing of each other."""
