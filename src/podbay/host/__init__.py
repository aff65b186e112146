"""The host library: what every driver does on this host besides driving its
runtime — machine records, disk images and storage, the data directory's
layout, base images, cgroups, user namespaces, waiting on file descriptors,
running host tools. It imports nothing of :mod:`podbay.runtime` or above."""
