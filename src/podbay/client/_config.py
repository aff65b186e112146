"""What the client needs before any request: where the server is, whose token,
how long exec may run. Stdlib only, so the CLI's quick exec path can use it
without loading httpx.
"""

from __future__ import annotations

import binascii

from podbay.wire.quickjson import loads

TOKEN_ENV = "ASTRO_AUTHZ_TOKEN"
DEFAULT_TIMEOUT_SECONDS = 30.0
#: base64url's two letters to standard base64's: ``base64.urlsafe_b64decode``
#: is this and ``binascii``, less the ``base64`` module's import (``struct``).
_URLSAFE = bytes.maketrans(b"-_", b"+/")


def token_issuer(token: str) -> str:
    """The ``iss`` claim of a JWT, read WITHOUT verifying it (the client has no key).

    >>> import base64, json
    >>> body = base64.urlsafe_b64encode(json.dumps({"iss": "http://cp:8700"}).encode())
    >>> token_issuer("e30." + body.decode().rstrip("=") + ".sig")
    'http://cp:8700'
    """
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise ValueError("identity token is not a JWT (expected three dot-separated parts)")
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        if not payload.isascii():  # base64's own words for it
            raise ValueError("string argument should contain only ASCII characters")
        claims = loads(binascii.a2b_base64(payload.encode().translate(_URLSAFE)))
    except (ValueError, binascii.Error) as exc:
        raise ValueError(f"identity token payload is not base64url JSON ({exc})") from None
    issuer = claims.get("iss") if isinstance(claims, dict) else None
    if not isinstance(issuer, str) or not issuer:
        raise ValueError("identity token has no 'iss' claim; pass server_url=")
    return issuer


def exec_timeout_ms(timeout_seconds: float, requested: int | None) -> int:
    """The deadline an exec sends: never later than one second under the request
    timeout, so the answer arrives before the client gives up.

    >>> exec_timeout_ms(30.0, None), exec_timeout_ms(30.0, 5_000), exec_timeout_ms(30.0, 0)
    (29000, 5000, 1)
    """
    bound = int(timeout_seconds * 1000) - 1000
    return bound if requested is None else max(1, min(int(requested), bound))
