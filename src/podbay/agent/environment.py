"""The environment every command starts with: clean, never the agent's own.

A command sees a fixed base (``PATH``, ``HOME``, ``LANG``, ``TERM``), then the
sandbox's declared variables (the runtime passes them as a JSON file with
``--env-file``), then the request's ``env``, each layer overriding the one
before. Nothing of the agent's own environment leaks in: the runtime's
variables are not the user's business.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from podbay.errors import EnvFileError as EnvFileError  # re-exported: defined in the one tree

BASE_ENV: dict[str, str] = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "xterm",
}


def check_env(env: Mapping[str, str], where: str) -> str | None:
    """A sentence saying why ``env`` cannot be an environment, or None.

    >>> check_env({"A=B": "x"}, "env")
    "env: variable name 'A=B' contains '='"
    """
    for key, value in env.items():
        if not key:
            return f"{where}: empty variable name"
        if "=" in key:
            return f"{where}: variable name {key!r} contains '='"
        if "\0" in key or "\0" in value:
            return f"{where}: variable {key!r} contains a NUL character"
    return None


def load_env_file(path: str) -> dict[str, str]:
    """The JSON object in ``path`` as variables; :class:`EnvFileError` if it is not one."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError) as exc:
        raise EnvFileError(f"cannot read env file {path}: {exc}") from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise EnvFileError(f"env file {path} must hold a JSON object of strings")
    problem = check_env(data, f"env file {path}")
    if problem:
        raise EnvFileError(problem)
    return data


def command_env(declared: Mapping[str, str], requested: Mapping[str, str] | None) -> dict[str, str]:
    """Base, then the sandbox's declared variables, then the request's.

    >>> command_env({"A": "1"}, {"A": "2", "HOME": "/w"})["A"], command_env({}, None)["LANG"]
    ('2', 'C.UTF-8')
    """
    env = dict(BASE_ENV)
    env.update(declared)
    if requested:
        env.update(requested)
    return env
