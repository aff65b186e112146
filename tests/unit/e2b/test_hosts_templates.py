"""``get_host`` addresses (podbay.e2b.hosts) and template sections
(podbay.e2b.templates), without a server."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from podbay.e2b import hosts, templates

SANDBOX = "abcdefghij0123456789"


def _request(host: str) -> Request:
    return Request(
        {"type": "http", "method": "POST", "path": "/", "headers": [(b"host", host.encode())]}
    )


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        (f"8080-{SANDBOX}.localhost:8700", (8080, SANDBOX)),
        (f"3000-{SANDBOX}.podbay.example.com", (3000, SANDBOX)),
        (f"8080-{SANDBOX.upper()}.localhost", (8080, SANDBOX)),  # names are case-blind
        ("127.0.0.1:8700", None),
        (f"0-{SANDBOX}.localhost", None),
        (f"65536-{SANDBOX}.localhost", None),
        (f"8080-{SANDBOX[:-1]}.localhost", None),
        (f"8080-{SANDBOX}-x.localhost", None),
        (f"x8080-{SANDBOX}.localhost", None),
    ],
)
def test_a_host_names_a_port_and_a_sandbox(host: str, expected: object) -> None:
    assert hosts.target([(b"host", host.encode())]) == expected


def test_no_host_header_is_not_a_sandbox_port() -> None:
    assert hosts.target([]) is None


@pytest.mark.parametrize(
    ("host", "domain"),
    [
        ("127.0.0.1:8700", "localhost:8700"),
        ("[::1]:8700", "localhost:8700"),
        ("localhost:8700", "localhost:8700"),
        ("localhost", "localhost"),
        ("podbay.example.com", "podbay.example.com"),
        ("podbay.example.com:8443", "podbay.example.com:8443"),
    ],
)
def test_the_domain_is_the_address_the_create_reached(host: str, domain: str) -> None:
    assert hosts.domain_for(_request(host)) == domain


def test_code_interpreter_adds_pydata_and_keeps_the_deployments_pins() -> None:
    section = {"toolchain": "never", "env": {"A": "1"}}
    assert templates.with_pydata(section) == {
        "toolchain": "never",
        "env": {"A": "1"},
        "python": {"packages": list(templates.PYDATA)},
    }
    pinned = {"python": {"version": "3.11", "packages": ["NumPy==1.26.4", "requests"]}}
    assert templates.with_pydata(pinned)["python"] == {
        "version": "3.11",
        "packages": ["NumPy==1.26.4", "requests", "matplotlib==3.9.2", "pandas==2.2.3"],
    }
    assert section == {"toolchain": "never", "env": {"A": "1"}}  # not changed in place
