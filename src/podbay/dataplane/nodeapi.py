"""The internal API between the control plane and its nodes: paths, who may
call, and how a deployment travels. Shared by both sides, never public.

Two credentials, each good for one direction only:

* **node credential**: an opaque random string the control plane hands a
  node at enrollment (it keeps only its SHA-256). The node presents it on
  every call to the control plane (heartbeat, public keys).
* **control call**: a short-lived EdDSA JWT the control plane signs for one
  node (``aud`` = :data:`NODE_CALL_AUDIENCE`, ``sub`` = node name, ``enr`` =
  the SHA-256 of the node credential that enrollment gave it). The node checks
  it with the control plane's public keys, like a data-plane credential, and
  that ``enr`` is its own credential's: a token minted for another enrollment
  under its name (someone who held the enrollment token and got the name
  after an operator forgot the node) is refused.
* **disk pass**: a JWT the control plane signs so that one node may read one
  stopped machine's disk from another (``aud`` = :data:`DISK_PASS_AUDIENCE`,
  ``sub`` = the node holding it, ``machine`` = ``class/machine id``, ``to`` =
  the receiving node, one minute). The receiver presents it to the holder:
  disks move node to node, never through the control plane.

A data-plane credential (``aud`` = ``podbay:data-plane``) is neither: its
audience refuses it on a node's internal API, and it hashes to no node on
the control plane's. Neither internal credential passes the gateway, whose
audience is the data plane's.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from podbay.domain import Deployment
from podbay.errors import ApiError
from podbay.signing import SigningKeys, TokenKind, VerifyingKeys, sign, verify
from podbay.wire.codes import ErrorCode

PREFIX = "/internal/v1"
ENROLL = f"{PREFIX}/nodes/enroll"
HEARTBEAT = f"{PREFIX}/nodes/heartbeat"
#: ``POST {"sandboxes": [id, ...]}``: a node's gateway found these agents silent;
#: answered once the control plane has checked their machines.
SUSPECTS = f"{PREFIX}/nodes/suspects"
KEYS = f"{PREFIX}/keys"
#: ``GET DISKS/<class>/<machine id>``: a stopped machine's disk, for a disk pass.
DISKS = f"{PREFIX}/disks"

NODE_CALL_AUDIENCE = "podbay:node-call"
NODE_CALL = TokenKind(ErrorCode.NODE_CREDENTIAL_INVALID, "control-plane call credential")
#: Life of a control call's token; the control plane reuses one for half of it.
NODE_CALL_SECONDS = 120
NODE_CREDENTIAL_PREFIX = "pbn_"
DISK_PASS_AUDIENCE = "podbay:disk-pass"
DISK_PASS = TokenKind(ErrorCode.NODE_CREDENTIAL_INVALID, "disk pass")
#: A disk pass is checked when the transfer starts, which follows its minting at once.
DISK_PASS_SECONDS = 60
#: The label a node's warm-pool machine carries (its environment key): the
#: control plane, adopting a node's machines, tells pooled from orphaned by it.
POOL_LABEL = "podbay.pool"


def new_node_credential() -> str:
    return NODE_CREDENTIAL_PREFIX + secrets.token_urlsafe(32)


def credential_hash(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


def enrollment_matches(offered: str, expected: str) -> bool:
    """Constant-time; an empty expected token enrolls nobody."""
    return bool(expected) and secrets.compare_digest(offered.encode(), expected.encode())


def refused(message: str) -> ApiError:
    return ApiError(ErrorCode.NODE_CREDENTIAL_INVALID, message)


def bearer(header: str | None) -> str:
    scheme, _, value = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise refused("an internal call needs Authorization: Bearer <credential>")
    return value.strip()


def mint_node_call(keys: SigningKeys, node: str, enrollment: str) -> str:
    """A control call for ``node`` as enrolled with the credential whose
    :func:`credential_hash` is ``enrollment``."""
    now = int(time.time())
    claims = {
        "aud": NODE_CALL_AUDIENCE,
        "sub": node,
        "enr": enrollment,
        "iat": now,
        "exp": now + NODE_CALL_SECONDS,
    }
    return sign(keys, claims)


def verify_node_call(keys: VerifyingKeys, token: str, node: str, credential: str | None) -> None:
    """A control call meant for ``node`` holding ``credential`` (``None``: not
    enrolled, so no call is meant for it); else 401 ``NODE_CREDENTIAL_INVALID``."""
    claims = verify(
        keys, token, NODE_CALL, require=["sub", "enr", "exp", "aud"], audience=NODE_CALL_AUDIENCE
    )
    if claims.get("sub") != node:
        raise refused("this control-plane call was meant for another node")
    if credential is None or not secrets.compare_digest(
        str(claims.get("enr")), credential_hash(credential)
    ):
        raise refused("this control-plane call was meant for another enrollment of this node")


def mint_disk_pass(keys: SigningKeys, holder: str, class_: str, machine_id: str, to: str) -> str:
    now = int(time.time())
    return sign(
        keys,
        {
            "aud": DISK_PASS_AUDIENCE,
            "sub": holder,
            "machine": f"{class_}/{machine_id}",
            "to": to,
            "iat": now,
            "exp": now + DISK_PASS_SECONDS,
        },
    )


def verify_disk_pass(
    keys: VerifyingKeys, token: str, holder: str, class_: str, machine_id: str
) -> str:
    """A pass to read ``class_/machine_id`` from ``holder``; the receiving
    node's name. Else 401 ``NODE_CREDENTIAL_INVALID``."""
    claims = verify(
        keys,
        token,
        DISK_PASS,
        require=["sub", "exp", "aud", "machine", "to"],
        audience=DISK_PASS_AUDIENCE,
    )
    if claims.get("sub") != holder or claims.get("machine") != f"{class_}/{machine_id}":
        raise refused("this disk pass is for another machine or node")
    return str(claims["to"])


# -- public keys ------------------------------------------------------------------------
def public_key_text(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def public_key_from_text(text: str) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(base64.b64decode(text))


# -- deployments as a node needs them (for its declared environment) ---------------------
# Alike in shape to the CLI's deployment row by nature (a deployment's fields
# as a dict), for another reader: this one is what a node needs.
def deployment_doc(d: Deployment) -> dict[str, Any]:
    return {
        "id": d.id,
        "name": d.name,
        "account": d.account,
        "sandbox_section": d.sandbox_section,
    }


def deployment_from(doc: Any) -> Deployment:
    if not isinstance(doc, dict) or not all(
        isinstance(doc.get(k), str) for k in ("id", "name", "account")
    ):
        raise ApiError(ErrorCode.REQUEST_INVALID, "deployment: id, name and account are required")
    section = doc.get("sandbox_section")
    epoch = datetime.fromtimestamp(0, UTC)
    return Deployment(
        id=doc["id"],
        name=doc["name"],
        account=doc["account"],
        spec_text="",
        sandbox_section=section if isinstance(section, dict) else None,
        created_at=epoch,
        updated_at=epoch,
    )
