"""The checks every call made with the console's cookie passes: the session
itself, the site the call comes from, and the CSRF token of a call that
changes anything; then which deployment the call acts for.

A browser sends the cookie (SameSite=Strict) only with requests this origin
starts; the ``Origin``/``Sec-Fetch-Site`` check refuses a cross-site request
even where a browser would send it (an older browser, a WebSocket, which
SameSite does not cover everywhere), and the CSRF token, readable only by a
page of this origin, is the second lock on anything that changes state.
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from podbay.asgi import Scope
from podbay.domain import Deployment
from podbay.errors import ApiError
from podbay.signing import SigningKeys, VerifyingKeys
from podbay.store.base import Store
from podbay.wire.codes import ErrorCode

from .tokens import Generation, Session, verify_session

COOKIE = "podbay_session"
CSRF_HEADER = "x-csrf-token"
DEPLOYMENT_HEADER = "x-podbay-deployment"
#: Methods that change nothing (they need no CSRF token).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: How long an identity token minted for a session's calls is reused.
MINTED_REUSE_SECONDS = 60.0


class Keys(SigningKeys, VerifyingKeys, Protocol):
    """A key ring that signs and verifies."""


class Deployments(Protocol):
    """What the console needs of the deployment service."""

    store: Store
    identity_ttl_seconds: int

    def token_for(self, deployment: Deployment) -> str: ...

    async def authenticate(self, token: str | None) -> Deployment: ...


def header(scope: Scope, name: str) -> str | None:
    """The value of the (lower-case) header ``name``, the last one if repeated."""
    wanted = name.encode()
    found = None
    for key, value in scope["headers"]:
        if key == wanted:
            found = value.decode("latin-1")
    return found


def cookie(scope: Scope) -> str | None:
    """The session cookie's value, if the request carries one. Read pair by
    pair: another application on this host (cookies ignore the port) may set
    cookies a strict parser rejects whole, which must not sign the console out."""
    for raw in (value for key, value in scope["headers"] if key == b"cookie"):
        for pair in str(raw.decode("latin-1")).split(";"):
            name, eq, value = pair.strip().partition("=")
            if eq and name == COOKIE and value:
                return value
    return None


def same_site(scope: Scope, base_url: str, *, require_origin: bool = False) -> bool:
    """Whether the request comes from this origin (or from no page at all).

    ``Sec-Fetch-Site`` when the browser sends it; else ``Origin`` must name
    the host the request was sent to, or the server's public URL. A WebSocket
    (``require_origin``) must carry an ``Origin``: browsers always send one.
    """
    site = header(scope, "sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = header(scope, "origin")
    if origin is None:
        return not require_origin
    host = header(scope, "host")
    allowed = {_origin(base_url)}
    if host:
        allowed |= {f"http://{host}", f"https://{host}"}
    return origin.rstrip("/") in allowed


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def csrf_invalid(message: str) -> ApiError:
    return ApiError(ErrorCode.CSRF_INVALID, message)


@dataclass
class Guard:
    """Sessions, their checks and the deployment each call acts for."""

    keys: Keys
    issuer: str
    generation: Generation
    deployments: Deployments

    def __post_init__(self) -> None:
        #: deployment id → (identity token, when minted): one per minute, not per call.
        self._minted: dict[str, tuple[str, float]] = {}

    async def session(self, scope: Scope, *, websocket: bool = False) -> Session:
        """The request's session, checked for its site and, for a call that
        changes state, its CSRF token; the refusal otherwise."""
        session = await verify_session(
            self.keys, cookie(scope), issuer=self.issuer, generation=self.generation
        )
        if not same_site(scope, self.issuer, require_origin=websocket):
            raise csrf_invalid("a console call from another site is refused")
        if not websocket and scope.get("method", "GET") not in SAFE_METHODS:
            offered = header(scope, CSRF_HEADER) or ""
            if not hmac.compare_digest(offered.encode(), session.csrf.encode()):
                raise csrf_invalid(
                    "this call needs the session's CSRF token (X-CSRF-Token: the csrf "
                    "GET /console/session answers)"
                )
        return session

    async def deployment(self, session: Session, name: str | None) -> Deployment:
        """The deployment a call acts for: a deployment session's own (``name``,
        if given, must be it), or the one an operator session names."""
        store = self.deployments.store
        if session.scope == "deployment":
            assert session.deployment_id is not None
            own = await store.get_deployment(session.deployment_id)
            if own is None:
                raise ApiError(
                    ErrorCode.SESSION_INVALID, "the session's deployment no longer exists"
                )
            if name is not None and name != own.name:
                raise ApiError(
                    ErrorCode.DEPLOYMENT_FORBIDDEN,
                    "a deployment's session reaches its own deployment only",
                )
            return own
        if not name:
            raise ApiError(
                ErrorCode.DEPLOYMENT_REQUIRED,
                "an operator's session names the deployment (X-Podbay-Deployment: NAME)",
            )
        found = await store.find_deployment(name)
        if found is None:
            raise ApiError(ErrorCode.DEPLOYMENT_NOT_FOUND, f"no deployment named {name!r}")
        return found

    def identity_token(self, deployment: Deployment) -> str:
        """An identity token for ``deployment``, reused a minute: the control
        plane's own routes then check the call as any SDK's."""
        now = time.monotonic()
        known = self._minted.get(deployment.id)
        ttl = self.deployments.identity_ttl_seconds
        reuse = min(MINTED_REUSE_SECONDS, ttl / 4) if ttl > 0 else MINTED_REUSE_SECONDS
        if known is not None and now - known[1] < reuse:
            return known[0]
        token = self.deployments.token_for(deployment)
        if len(self._minted) > 1024:
            self._minted.clear()
        self._minted[deployment.id] = (token, now)
        return token
