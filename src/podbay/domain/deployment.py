"""A deployment: who calls the control plane, and what its sandboxes need."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

DEFAULT_ACCOUNT = "default"


# The id maker and the record below are alike in shape to sandbox.py's on
# purpose: each record of the domain declares its own fields and id format.
def new_deployment_id() -> str:
    """Opaque and unguessable: a recreated name gets a new id, so old tokens die."""
    return "dep_" + secrets.token_hex(10)


@dataclass(frozen=True, kw_only=True)
class Deployment:
    id: str
    name: str
    account: str
    #: The astropods.yml as registered, verbatim.
    spec_text: str
    #: The raw ``sandbox`` section (parsed YAML), ``None`` when the file has none.
    #: Validated and built by the environment service, not here.
    sandbox_section: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime

    @property
    def declares_sandbox(self) -> bool:
        return self.sandbox_section is not None
