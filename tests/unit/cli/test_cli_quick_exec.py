"""The quick ``sandbox exec`` path: what it takes itself and what it hands over."""

from __future__ import annotations

import subprocess
import sys

from podbay.cli.quick_exec import parse, run


def test_takes_the_plain_forms() -> None:
    call = parse(["box", "--cwd", "/tmp", "--env", "A=1", "--env=B=x=y", "--timeout-ms=50",
                  "--token", "t", "--server=http://s", "--", "ls", "--json"])
    assert call == {"name": "box", "cwd": "/tmp", "env": {"A": "1", "B": "x=y"},
                    "timeout_ms": 50, "token": "t", "server": "http://s",
                    "argv": ["ls", "--json"]}


def test_hands_over_what_the_full_command_must_judge() -> None:
    for args in (["box", "--json", "--", "true"], ["box", "-h"], ["box", "true"],
                 ["box", "--"], ["--cwd", "x", "box", "--", "true"], ["box", "--env", "A",
                 "--", "true"], ["box", "--timeout-ms", "soon", "--", "true"], ["box", "--cwd"],
                 []):
        assert parse(args) is None, args


def test_hands_over_without_a_token_or_to_https() -> None:
    assert run(["box", "--", "true"], environ={}) is None
    assert run(["box", "--server", "https://cp.example", "--token", "t", "--", "true"],
               environ={}) is None
    assert run(["box", "--token", "not-a-jwt", "--", "true"], environ={}) is None


def test_loads_neither_click_nor_httpx_nor_typing() -> None:
    code = ("import sys; import podbay.cli.entry, podbay.cli.quick_exec; "
            "print(sorted(m for m in ('click', 'httpx', 'typing') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
