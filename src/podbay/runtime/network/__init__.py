"""Sandbox networking shared by every isolation class.

``policy`` (what a sandbox may reach, as an nftables ruleset; pure),
``netns`` (namespaces through the kernel's calls), ``nft`` (libnftables),
``slirp`` (the per-sandbox user-mode network helper), ``procscan`` (``/proc``),
``hostcheck`` (host addresses, doctor's checks) and ``manager``
(:class:`NetworkManager`, what drivers use). See ``docs/network.md``.
"""

from __future__ import annotations

from ...errors import NetworkError
from .manager import NetworkHandle, NetworkManager

__all__ = ["NetworkError", "NetworkHandle", "NetworkManager"]
