"""E2B's template ids as podbay's declared environments.

A template is the environment a sandbox of the key's deployment gets:

* ``base``, or the deployment's own name: its own ``sandbox:`` section;
* ``code-interpreter-v1`` (``e2b_code_interpreter.Sandbox``'s default): that
  section with numpy, pandas and matplotlib added to its Python packages, so
  it is a layer built once (per distinct section, cached) as any declared one;
* the name of another deployment of the same account that declares a
  sandbox: that deployment's section (the E2B way to pick an image).

Anything else is E2B's 404. The sandbox still belongs to the key's
deployment: only the section it is prepared from changes.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from podbay.domain import Deployment

from .error_responses import E2BError

if TYPE_CHECKING:
    from podbay.store.base import Store

BASE = "base"
CODE_INTERPRETER = "code-interpreter-v1"
#: What E2B's code-interpreter image has that the base image has not (the
#: pins of docs/interpreter.md's declaration, so its cached layer serves both).
PYDATA = ("matplotlib==3.9.2", "numpy==2.1.3", "pandas==2.2.3")
_PROJECT = re.compile(r"[A-Za-z0-9._-]+")


def _project(requirement: str) -> str:
    found = _PROJECT.match(requirement)
    return (found.group(0) if found else requirement).lower().replace("_", "-")


def with_pydata(section: dict[str, Any]) -> dict[str, Any]:
    """``section`` with :data:`PYDATA` among its Python packages; a package the
    deployment already pins keeps its own pin."""
    python = section.get("python")
    python = dict(python) if isinstance(python, dict) else {}
    declared = python.get("packages")
    packages = [p for p in declared if isinstance(p, str)] if isinstance(declared, list) else []
    have = {_project(p) for p in packages}
    python["packages"] = packages + [p for p in PYDATA if _project(p) not in have]
    return {**section, "python": python}


async def resolve(store: Store, deployment: Deployment, template: str) -> Deployment:
    """The deployment as a sandbox of ``template`` is prepared from it."""
    if template in (BASE, deployment.name):
        return deployment
    if template == CODE_INTERPRETER:
        if deployment.sandbox_section is None:
            return deployment  # refused as podbay refuses it: no sandbox declared
        return replace(deployment, sandbox_section=with_pydata(deployment.sandbox_section))
    other = await store.find_deployment(template)
    if (
        other is not None
        and other.account == deployment.account
        and other.sandbox_section is not None
    ):
        return replace(deployment, sandbox_section=other.sandbox_section)
    raise E2BError(
        404,
        "E2B_TEMPLATE_NOT_FOUND",
        f"template {template!r} was not found: podbay serves {BASE!r}, {CODE_INTERPRETER!r} "
        "and the names of this account's deployments that declare a sandbox",
    )
