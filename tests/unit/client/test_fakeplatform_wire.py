"""The client tests' fake platform against the wire contract it stands in for:
every answer it gives in a session using each kind of call has the status and
body shape :mod:`podbay.wire.openapi` declares for that route."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import jsonschema
from fakeplatform import ENDPOINT, SERVER, Fake

from podbay.wire import openapi


def _operations(doc: dict[str, Any]) -> list[tuple[re.Pattern[str], dict[str, Any]]]:
    return [
        (re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$"), ops)
        for path, ops in doc["paths"].items()
    ]


CONTROL = openapi.control_plane(SERVER)
DATA = openapi.data_plane(ENDPOINT)


def _check(
    doc: dict[str, Any], route: str, request: httpx.Request, response: httpx.Response
) -> None:
    matches = [ops for pattern, ops in _operations(doc) if pattern.match(route)]
    assert matches, f"{route}: not a route of the contract"
    op = matches[0].get(request.method.lower())
    assert op is not None, f"{request.method} {route}: not in the contract"
    declared = op["responses"].get(str(response.status_code))
    assert declared is not None, (request.method, route, response.status_code)
    schema = declared.get("content", {}).get("application/json", {}).get("schema")
    if schema is None or response.headers.get("content-type") != "application/json":
        return
    jsonschema.validate(
        response.json(),
        {**schema, "components": doc["components"]},
    )


def check_exchanges(fake: Fake) -> int:
    for request, response in fake.exchanges:
        path = request.url.path
        if request.url.host == "control.test":
            _check(CONTROL, path, request, response)
        else:
            _, _name, *rest = path.lstrip("/").split("/")
            _check(DATA, "/" + "/".join(rest), request, response)
    return len(fake.exchanges)


def test_every_answer_has_the_contracts_shape(client: Any, fake: Fake) -> None:
    fake.preparing = 1  # a 202 first
    client.attach("t")
    fake.reject_credentials = 1  # a 401 refusal, then the call again
    client.exec("t", ["/bin/echo", "hi"])
    client.write_file("t", "/workspace/a.txt", "hello")
    assert client.read_file("t", "/workspace/a.txt") == "hello"
    client.list_dir("t", "/workspace")
    proc = client.spawn("t", ["/bin/sh", "-c", "echo started; exec sleep 30"])
    client.processes("t")
    client.poll("t", proc.process_id)
    client.signal("t", proc.process_id, "TERM")
    deadline = time.monotonic() + 10
    while client.poll("t", proc.process_id).state != "exited" and time.monotonic() < deadline:
        time.sleep(0.01)
    client.kill("t", proc.process_id)
    client.get("t")
    client.list()
    assert {r.status_code for _, r in fake.exchanges} >= {200, 202, 204, 401}
    assert check_exchanges(fake) >= 12
