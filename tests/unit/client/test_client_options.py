"""Attach's options, list's label filter, listening ports and NAME completion
on the client's side (sans I/O; the real server's side is
tests/integration/platform/test_platform_options.py)."""

from __future__ import annotations

import json
from urllib.parse import parse_qsl, urlsplit

import click
from fakeplatform import make_token

from podbay.cli.commands.sandbox import command as sandbox_group
from podbay.cli.completion import NAME_PARAMS, sandbox_names
from podbay.client._core import Core, resolve_config
from podbay.client._options import AttachOptions, parse_listening

PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0
   2: 0100007F:1F90 0100007F:D2C4 01 00000000:00000000 00:00000000 00000000     0
  sl  local_address                         remote_address                        st
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A
   1: garbage
"""


def _core() -> Core:
    return Core(resolve_config(identity_token=make_token("http://cp:1/"), environ={}))


def test_listening_ports_are_the_listening_sockets_once_each() -> None:
    assert parse_listening(PROC_NET_TCP) == [22, 8080]
    assert parse_listening("") == []
    assert parse_listening("   0: 0100007F:ZZZZ 00000000:0000 0A\n") == []


def test_attach_without_options_sends_the_references_body() -> None:
    request = _core().attach_request("t", None)
    assert json.loads(request.content) == {"class": "default"}
    request = _core().attach_request("t", None, AttachOptions())
    assert json.loads(request.content) == {"class": "default"}


def test_attach_sends_the_options_it_is_given() -> None:
    options = AttachOptions(labels={"a": "1"}, env={"E": "x"}, cpus=0.5, idle_timeout_seconds=90)
    body = json.loads(_core().attach_request("t", "gvisor", options).content)
    assert body == {
        "class": "gvisor",
        "labels": {"a": "1"},
        "env": {"E": "x"},
        "cpus": 0.5,
        "idle_timeout_seconds": 90,
    }


def test_list_sends_one_label_query_per_label() -> None:
    assert urlsplit(str(_core().list_request().url)).query == ""
    url = str(_core().list_request({"team": "a=b", "x": "y z"}).url)
    assert parse_qsl(urlsplit(url).query) == [("label", "team=a=b"), ("label", "x=y z")]


def test_every_sandbox_name_argument_completes_to_sandboxes() -> None:
    named = [
        (cmd.name, p)
        for cmd in sandbox_group.commands.values()
        for p in cmd.params
        if isinstance(p, click.Argument) and p.name in NAME_PARAMS
    ]
    assert {"exec", "get", "create", "ports", "url", "rm"} <= {name for name, _ in named}
    for _, param in named:
        assert param._custom_shell_complete is sandbox_names


def test_completion_without_a_token_or_server_is_empty() -> None:
    ctx = click.Context(sandbox_group, obj=None)
    ctx.params = {"token": "not-a-token", "server": "http://127.0.0.1:9"}
    (argument,) = [p for p in sandbox_group.commands["get"].params if p.name == "name"]
    assert sandbox_names(ctx, argument, "") == []
