"""The ASGI interface's types, spelled as Starlette's ``types.py`` spells them.

The gateway's relay and the control plane's middlewares are plain ASGI
callables; these aliases type them without importing Starlette, and are
the same types Starlette's own, so either side accepts the other's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeAlias

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]
ASGIApp: TypeAlias = Callable[[Scope, Receive, Send], Awaitable[None]]
