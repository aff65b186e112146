"""Every validation rule of the sandbox section, good and bad."""

from __future__ import annotations

import pytest

from podbay.control.services.deployments import parse_astropods
from podbay.domain.egress import EgressPolicy
from podbay.environment.spec import (
    SandboxSection,
    SpecError,
    parse_section,
)
from podbay.errors import DeploymentError


def problems(data: object) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_section(data)
    return dict(info.value.problems)


def test_minimal_section_is_valid() -> None:
    section = parse_section({"toolchain": "never"})
    assert section == SandboxSection(toolchain="never")
    assert section.is_empty_install


@pytest.mark.parametrize("data", [{}, None, [], "auto"])
def test_empty_or_non_mapping_section_is_refused(data: object) -> None:
    assert "sandbox" in problems(data)


def test_toolchain_is_required_and_error_lists_the_three() -> None:
    got = problems({"packages": ["curl"]})
    assert "sandbox.toolchain" in got
    assert all(word in got["sandbox.toolchain"] for word in ("auto", "always", "never"))
    got = problems({"toolchain": "sometimes"})
    assert "'sometimes'" in got["sandbox.toolchain"]


@pytest.mark.parametrize("key", ["files", "classes", "size", "tools"])
def test_reserved_keys_are_refused_by_name(key: str) -> None:
    got = problems({"toolchain": "auto", key: []})
    assert "reserved" in got[f"sandbox.{key}"]


def test_unknown_keys_are_refused() -> None:
    got = problems({"toolchain": "auto", "pakages": ["curl"], "python": {"verison": "3.12"}})
    assert "unknown key" in got["sandbox.pakages"]
    assert "unknown key" in got["sandbox.python.verison"]


HOSTILE = [
    "$(id)",
    "ffmpeg; rm -rf /",
    "pandas && curl x",
    "`id`",
    "-rf",
    "a|b",
    "x\ny",
    "pkg > /etc/passwd",
    "a b",
]


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("where", ["packages", "python", "node"])
def test_names_that_could_reach_a_shell_are_refused(name: str, where: str) -> None:
    data: dict[str, object] = {"toolchain": "auto"}
    if where == "packages":
        data["packages"] = ["curl", name]
        field = "sandbox.packages[1]"
    else:
        data[where] = {"packages": ["ok", name]}
        field = f"sandbox.{where}.packages[1]"
    assert field in problems(data)


def test_names_real_ecosystems_use_pass() -> None:
    section = parse_section(
        {
            "toolchain": "auto",
            "packages": ["python3.13", "gcc-c++", "libstdc++", "curl=7.88.1-10+deb12u5"],
            "python": {
                "version": "3.12",
                "packages": [
                    "pandas==2.2.0",
                    "uvicorn[standard]",
                    "ruff>=0.5",
                    "numpy>=1.26,<3",
                    "Django~=5.0",
                ],
            },
            "node": {"version": "22", "packages": ["@angular/cli", "typescript@5", "left-pad"]},
        }
    )
    assert section.python is not None
    assert "uvicorn[standard]" in section.python.packages
    assert section.node is not None
    assert section.node.packages[0] == "@angular/cli"


def test_every_problem_is_reported_with_its_index() -> None:
    got = problems(
        {
            "toolchain": "auto",
            "python": {"version": "3", "packages": ["ok", "bad;"]},
            "setup": ["echo hi", "  "],
            "env": {"lower": "x", "OK": "y"},
        }
    )
    assert set(got) == {
        "sandbox.python.version",
        "sandbox.python.packages[1]",
        "sandbox.setup[1]",
        "sandbox.env.lower",
    }


@pytest.mark.parametrize(
    ("version", "ok"),
    [("3.12", True), ("3.9", True), ("3", False), ("3.12.1", False), ("py3", False)],
)
def test_python_version_is_major_minor(version: str, ok: bool) -> None:
    data = {"toolchain": "auto", "python": {"version": version}}
    if ok:
        assert parse_section(data).python.version == version  # type: ignore[union-attr]
    else:
        assert "sandbox.python.version" in problems(data)


def test_unquoted_python_version_is_refused_with_a_hint() -> None:
    # YAML reads 3.10 as the float 3.1: refuse rather than guess.
    assert (
        "quoted"
        in problems({"toolchain": "auto", "python": {"version": 3.10}})["sandbox.python.version"]
    )


@pytest.mark.parametrize(
    ("version", "ok"), [("22", True), (20, True), ("22.1", False), ("latest", False)]
)
def test_node_version_is_major_only(version: object, ok: bool) -> None:
    data = {"toolchain": "auto", "node": {"version": version}}
    if ok:
        assert parse_section(data).node.version == str(version)  # type: ignore[union-attr]
    else:
        assert "sandbox.node.version" in problems(data)


@pytest.mark.parametrize("key", ["lower", "1ABC", "A-B", "A B"])
def test_env_keys_must_be_upper_snake(key: str) -> None:
    assert f"sandbox.env.{key}" in problems({"toolchain": "auto", "env": {key: "x"}})


def test_env_values_are_strings() -> None:
    section = parse_section({"toolchain": "auto", "env": {"PORT": 8080, "NAME": "x"}})
    assert section.env == {"PORT": "8080", "NAME": "x"}
    assert "sandbox.env.FLAG" in problems({"toolchain": "auto", "env": {"FLAG": True}})
    assert "sandbox.env.LIST" in problems({"toolchain": "auto", "env": {"LIST": [1]}})


def test_setup_commands_must_be_non_empty_strings() -> None:
    assert parse_section({"toolchain": "auto", "setup": ["echo hi > a"]}).setup == ("echo hi > a",)
    assert "sandbox.setup[0]" in problems({"toolchain": "auto", "setup": [""]})
    assert "sandbox.setup[1]" in problems({"toolchain": "auto", "setup": ["ok", 3]})
    assert "sandbox.setup" in problems({"toolchain": "auto", "setup": "echo hi"})


def test_browser_is_chromium_only() -> None:
    assert parse_section({"toolchain": "auto", "browser": {"name": "chromium"}}).browser == (
        "chromium"
    )
    assert "sandbox.browser.name" in problems({"toolchain": "auto", "browser": {"name": "firefox"}})
    assert "sandbox.browser.headless" in problems(
        {"toolchain": "auto", "browser": {"name": "chromium", "headless": True}}
    )


def test_canonical_form_ignores_order_and_duplicates() -> None:
    a = parse_section(
        {"toolchain": "auto", "packages": ["jq", "curl", "jq"], "env": {"B": "1", "A": "2"}}
    )
    b = parse_section(
        {"toolchain": "auto", "packages": ["curl", "jq"], "env": {"A": "2", "B": "1"}}
    )
    assert a.layer_key() == b.layer_key()
    assert a.canonical() == b.canonical()


def test_env_and_setup_change_the_section_but_not_the_layer() -> None:
    base = parse_section({"toolchain": "auto", "packages": ["jq"]})
    more = parse_section(
        {"toolchain": "auto", "packages": ["jq"], "env": {"A": "1"}, "setup": ["touch x"]}
    )
    assert base.layer_key() == more.layer_key()
    assert base.canonical() != more.canonical()
    other = parse_section({"toolchain": "auto", "packages": ["jq", "curl"]})
    assert other.layer_key() != base.layer_key()


def test_only_the_sandbox_section_of_astropods_yml_is_read() -> None:
    assert parse_astropods("name: agent\nmodel: x\n") is None
    assert parse_astropods("") is None
    raw = parse_astropods("name: agent\nsandbox:\n  toolchain: auto\n  packages: [jq]\n")
    assert raw is not None
    assert parse_section(raw).packages == ("jq",)
    with pytest.raises(SpecError):
        parse_section(parse_astropods("sandbox: {}\n"))
    with pytest.raises(DeploymentError):
        parse_astropods("sandbox: [unclosed\n")
    with pytest.raises(DeploymentError):
        parse_astropods("- a list\n")


def test_network_is_the_deployments_default_egress_policy() -> None:
    section = parse_section({"toolchain": "never", "network": {"allow": ["PyPI.org"]}})
    assert section.network == EgressPolicy(allow=("pypi.org",))
    # Not installed: a changed policy rebuilds no layer.
    assert section.layer_key() == parse_section({"toolchain": "never"}).layer_key()
    assert (
        "pypi.org"
        in problems({"toolchain": "never", "network": {"deny": ["pypi.org;x"]}})["sandbox.network"]
    )
    assert "sandbox.network" in problems({"toolchain": "never", "network": {"internet": "no"}})
