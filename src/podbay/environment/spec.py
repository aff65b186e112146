"""The ``sandbox`` section of astropods.yml: validated, canonical, hashed.

Refuse rather than ignore: every problem names its exact field, index
included (``sandbox.python.packages[1]``), and all problems are reported at
once. Package names are checked against what each ecosystem really uses,
and anything that could reach a shell (``$(id)``, ``;``, ``&&``, backticks,
a leading ``-``) is refused; package managers are called with argv anyway.

>>> section = parse_section({"toolchain": "auto", "python": {"version": "3.11",
...                          "packages": ["pandas==2.2.0"]}})
>>> section.python.packages
('pandas==2.2.0',)
>>> len(section.layer_key())
64
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from podbay.domain.egress import OPEN, EgressPolicy
from podbay.errors import ApiError
from podbay.errors import SpecError as SpecError  # re-exported: defined in the one tree

Toolchain = Literal["auto", "always", "never"]
TOOLCHAINS: tuple[Toolchain, ...] = ("auto", "always", "never")
RESERVED_KEYS = frozenset({"files", "classes", "size", "tools"})
KNOWN_KEYS = (
    "toolchain",
    "packages",
    "python",
    "node",
    "env",
    "setup",
    "browser",
    "command_log",
    "network",
)
BROWSERS = ("chromium",)
#: Bumped whenever the way a layer is built changes, so old layers are not reused.
RECIPE_VERSION = 1

# Debian: lowercase name, optional :arch, optional =version.
_DEBIAN = re.compile(r"[a-z0-9][a-z0-9+.-]*(:[a-z0-9-]+)?(=[A-Za-z0-9.+~:-]+)?")
# Python (a PEP 508 subset): name, optional [extras], optional version clauses.
# No URLs and no environment markers (";" is how a marker starts).
_PY_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_PY_VERSION = r"(?:===|==|!=|~=|>=|<=|>|<)\s*[A-Za-z0-9.*+!-]+"
_PYTHON = re.compile(
    rf"{_PY_NAME}(?:\[{_PY_NAME}(?:,{_PY_NAME})*\])?(?:{_PY_VERSION}(?:,{_PY_VERSION})*)?"
)
# npm: optional @scope/, name, optional @version-or-range-or-tag.
_NPM = re.compile(r"(?:@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*(?:@[A-Za-z0-9.^~<>=*+-]+)?")
_PY_VERSION_DECL = re.compile(r"3\.\d{1,2}")
_NODE_VERSION_DECL = re.compile(r"\d{1,2}")
_ENV_KEY = re.compile(r"[A-Z_][A-Z0-9_]*")


@dataclass(frozen=True)
class LanguageSpec:
    version: str | None = None
    packages: tuple[str, ...] = ()


@dataclass(frozen=True)
class SandboxSection:
    """A validated ``sandbox`` section. Package lists are sorted and de-duplicated."""

    toolchain: Toolchain
    packages: tuple[str, ...] = ()
    python: LanguageSpec | None = None
    node: LanguageSpec | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    setup: tuple[str, ...] = ()
    browser: str | None = None
    #: Whether the platform collects each exec and spawn's argv, user, exit
    #: code and duration (docs/observability.md). Set per deployment.
    command_log: bool = True
    #: The deployment's default egress policy (docs/network.md): each new
    #: sandbox gets it unless its attach names its own.
    network: EgressPolicy = OPEN

    def canonical(self) -> dict[str, Any]:
        """A plain, key-sorted form: equal declarations give equal dicts."""
        data = asdict(self)
        data["env"] = dict(sorted(self.env.items()))
        data["network"] = self.network.to_doc()
        return data

    def layer_key(self) -> str:
        """Hash of what gets *installed*. ``env``, ``setup``, ``command_log`` and
        ``network`` are left out: they apply to each sandbox, so changing them
        never rebuilds a layer."""
        data = self.canonical()
        del data["env"], data["setup"], data["command_log"], data["network"]
        return _digest({"recipe": RECIPE_VERSION, **data})

    @property
    def is_empty_install(self) -> bool:
        """True when nothing needs installing over the base image."""
        return (
            not self.packages
            and self.browser is None
            and self.toolchain != "always"
            and (self.python is None or not self.python.packages)
            and (self.node is None or (not self.node.packages and self.node.version is None))
            and (self.python is None or self.python.version is None)
        )


def _digest(data: Mapping[str, Any]) -> str:
    raw = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(raw.encode()).hexdigest()


class _Checker:
    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def fail(self, where: str, what: str) -> None:
        self.problems.append((where, what))

    def strings(
        self, value: Any, where: str, *, pattern: re.Pattern[str] | None = None, kind: str = ""
    ) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            self.fail(where, "must be a list")
            return ()
        out: list[str] = []
        for i, item in enumerate(value):
            at = f"{where}[{i}]"
            if not isinstance(item, str) or not item.strip():
                self.fail(at, "must be a non-empty string")
            elif "\x00" in item:
                self.fail(at, "must not contain a NUL byte")
            elif pattern is not None and not pattern.fullmatch(item):
                self.fail(at, f"{item!r} is not a valid {kind} package name")
            else:
                out.append(item)
        return tuple(out)

    def language(
        self,
        value: Any,
        where: str,
        version: re.Pattern[str],
        example: str,
        packages: re.Pattern[str],
        kind: str,
        *,
        whole_number_version: bool,
    ) -> LanguageSpec | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            self.fail(where, "must be a mapping with version and packages")
            return None
        for key in value:
            if key not in ("version", "packages"):
                self.fail(f"{where}.{key}", "unknown key (allowed: version, packages)")
        raw = value.get("version")
        declared: str | None = None
        if isinstance(raw, bool | float):
            # YAML reads 3.10 as 3.1: a float is never taken as a version.
            self.fail(f"{where}.version", f'must be a quoted string such as "{example}"')
        elif isinstance(raw, int) and whole_number_version:
            declared = str(raw)
        elif raw is not None and not isinstance(raw, str | int):
            self.fail(f"{where}.version", f'must be a string such as "{example}"')
        elif raw is not None:
            declared = str(raw)
        if declared is not None and not version.fullmatch(declared):
            self.fail(f"{where}.version", f'{declared!r} must look like "{example}"')
            declared = None
        pkgs = self.strings(value.get("packages"), f"{where}.packages", pattern=packages, kind=kind)
        return LanguageSpec(version=declared, packages=tuple(sorted(set(pkgs))))


def parse_section(data: Any, where: str = "sandbox") -> SandboxSection:
    """Validate a parsed ``sandbox`` section; raise :class:`SpecError` listing every problem."""
    check = _Checker()
    if not isinstance(data, dict) or not data:
        raise SpecError(
            [
                (
                    where,
                    "must be a non-empty mapping; it needs at least "
                    "toolchain: auto, always or never",
                )
            ]
        )
    for key in data:
        if key in RESERVED_KEYS:
            check.fail(f"{where}.{key}", f"{key!r} is reserved and not supported")
        elif key not in KNOWN_KEYS:
            check.fail(f"{where}.{key}", f"unknown key (allowed: {', '.join(KNOWN_KEYS)})")

    raw_toolchain = data.get("toolchain")
    toolchain = next((t for t in TOOLCHAINS if t == raw_toolchain), None)
    if toolchain is None:
        got = "is required" if raw_toolchain is None else f"{raw_toolchain!r} is not allowed"
        check.fail(f"{where}.toolchain", f"{got}; must be one of auto, always, never")

    packages = check.strings(
        data.get("packages"), f"{where}.packages", pattern=_DEBIAN, kind="Debian"
    )
    python = check.language(
        data.get("python"),
        f"{where}.python",
        _PY_VERSION_DECL,
        "3.12",
        _PYTHON,
        "Python",
        whole_number_version=False,
    )
    node = check.language(
        data.get("node"),
        f"{where}.node",
        _NODE_VERSION_DECL,
        "22",
        _NPM,
        "npm",
        whole_number_version=True,
    )

    env: dict[str, str] = {}
    raw_env = data.get("env")
    if raw_env is not None and not isinstance(raw_env, dict):
        check.fail(f"{where}.env", "must be a mapping of NAME: value")
    elif raw_env:
        for key, value in raw_env.items():
            at = f"{where}.env.{key}"
            if not isinstance(key, str) or not _ENV_KEY.fullmatch(key):
                check.fail(at, "name must match ^[A-Z_][A-Z0-9_]*$")
            elif isinstance(value, bool) or not isinstance(value, str | int | float):
                check.fail(at, "value must be a string")
            elif "\x00" in str(value):
                check.fail(at, "value must not contain a NUL byte")
            else:
                env[key] = str(value)

    setup = check.strings(data.get("setup"), f"{where}.setup")

    browser: str | None = None
    raw_browser = data.get("browser")
    if raw_browser is not None:
        if not isinstance(raw_browser, dict):
            check.fail(f"{where}.browser", "must be a mapping: {name: chromium}")
        else:
            for key in raw_browser:
                if key != "name":
                    check.fail(f"{where}.browser.{key}", "unknown key (allowed: name)")
            if raw_browser.get("name") not in BROWSERS:
                check.fail(f"{where}.browser.name", "must be chromium")
            else:
                browser = raw_browser["name"]

    command_log = data.get("command_log", True)
    if not isinstance(command_log, bool):
        check.fail(f"{where}.command_log", "must be true or false")
    network = OPEN
    if data.get("network") is not None:
        try:
            network = EgressPolicy.parse(data["network"])
        except ApiError as exc:
            check.fail(f"{where}.network", exc.message)

    if check.problems or toolchain is None:
        raise SpecError(check.problems)
    return SandboxSection(
        toolchain=toolchain,
        packages=tuple(sorted(set(packages))),
        python=python,
        node=node,
        env=env,
        setup=setup,
        browser=browser,
        command_log=command_log is not False,
        network=network,
    )
