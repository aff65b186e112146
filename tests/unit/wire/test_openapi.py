"""The OpenAPI documents describe the code that serves them: the same paths
and methods, every schema resolvable, and loadable as OpenAPI 3.1."""

from __future__ import annotations

import json
from pathlib import Path

import schemathesis
from starlette.routing import Route

from podbay.agent.app import App
from podbay.agent.reaper import Reaper
from podbay.console import admin
from podbay.control.routes import observe, sandboxes, volumes
from podbay.wire import paths
from podbay.wire.openapi import control_plane, data_plane


def _operations(doc: dict) -> set[tuple[str, str]]:  # type: ignore[type-arg]
    return {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}


def test_control_plane_document_matches_the_routes() -> None:
    routes = {
        (method, route.path)
        for route in [*sandboxes.routes, *volumes.routes, *admin.routes, *observe.routes]
        if isinstance(route, Route)
        for method in (route.methods or ())
        if method != "HEAD"
    }
    assert _operations(control_plane("http://x")) == routes


def test_data_plane_document_matches_the_agents_routes(tmp_path: Path) -> None:
    app = App(Reaper(), str(tmp_path), {})
    routes = {(method, path) for path, methods in app.routes.items() for method in methods}
    # The process routes are matched by prefix in App._dispatch.
    one = paths.PROCESSES + "/{process_id}"
    routes |= {("GET", one), ("DELETE", one), ("POST", one + "/signal")}
    assert _operations(data_plane("/sandbox/x")) == routes


def test_every_reference_resolves_and_documents_load_as_openapi_31() -> None:
    for doc in (control_plane("http://x"), data_plane("/sandbox/x")):
        text = json.dumps(doc)
        for name in {part.split('"')[0] for part in text.split("#/components/schemas/")[1:]}:
            assert name in doc["components"]["schemas"], name
        schema = schemathesis.openapi.from_dict(doc)
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) == len(_operations(doc))
