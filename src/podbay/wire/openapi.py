"""OpenAPI 3.1 documents of both planes, generated from this package.

The models (``control``, ``data``), the paths (``paths``), the codes and
their statuses (``codes``) and the limits are the contract; this module only
describes them, so the documents cannot drift from what servers and
clients use. The control plane serves :func:`control_plane` at
``/openapi.json``; the gateway serves :func:`data_plane` at
``<endpoint>/openapi.json``. Stdlib only, like the rest of ``wire``.

>>> doc = control_plane("http://127.0.0.1:8700")
>>> doc["openapi"], sorted(doc["paths"])[0]
('3.1.0', '/api/v1/deployments')
"""

from __future__ import annotations

import dataclasses
import types
from datetime import datetime
from enum import Enum
from typing import Any, Literal, Union, get_args, get_origin

from . import control, data, observe, paths
from .codec import _fields
from .codes import STATUS, ErrorCode
from .limits import (
    EXEC_MAX_TIMEOUT_MS,
    EXEC_OUTPUT_MAX,
    MAX_JSON_BODY,
    POLL_WAIT_MAX_MS,
    SANDBOX_NAME_PATTERN,
    SIGNAL_NAMES,
    VOLUME_NAME_PATTERN,
)

VERSION = "3.1.0"
_ERROR = {"$ref": "#/components/schemas/ErrorBody"}


class _Schemas:
    """Component schemas, collected as models are referenced."""

    def __init__(self, *, closed: set[type]) -> None:
        self.components: dict[str, Any] = {}
        #: Request models: unknown fields are refused (``additionalProperties: false``).
        self.closed = closed

    def ref(self, cls: type) -> dict[str, Any]:
        name = cls.__name__
        if name not in self.components:
            self.components[name] = {}  # placeholder: recursion stops here
            self.components[name] = self._model(cls)
        return {"$ref": f"#/components/schemas/{name}"}

    def _model(self, cls: type) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        required: list[str] = []
        for _, wire, tp, needed in _fields(cls):
            properties[wire] = self.of(tp)
            if needed:
                required.append(wire)
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            schema["required"] = required
        if cls in self.closed:
            schema["additionalProperties"] = False
        if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
            schema["description"] = " ".join(cls.__doc__.split())
        return schema

    def of(self, tp: Any) -> dict[str, Any]:
        origin = get_origin(tp)
        if tp is Any:
            return {}
        if origin in (Union, types.UnionType):
            # ``X | None``: None is "absent" on the wire, never null.
            options = [a for a in get_args(tp) if a is not type(None)]
            if len(options) == 1:
                return self.of(options[0])
            return {"anyOf": [self.of(a) for a in options]}
        if origin is Literal:
            return {"enum": list(get_args(tp))}
        if origin is list:
            (item,) = get_args(tp)
            return {"type": "array", "items": self.of(item)}
        if origin is dict:
            _, item = get_args(tp)
            return {"type": "object", "additionalProperties": self.of(item)}
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return self.ref(tp)
        if isinstance(tp, type) and issubclass(tp, Enum):
            return {"enum": [m.value for m in tp]}
        if tp is datetime:
            return {"type": "string", "format": "date-time"}
        simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
        if tp in simple:
            return {"type": simple[tp]}
        raise TypeError(f"no schema for {tp!r}")


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _refusals(codes: list[ErrorCode]) -> dict[str, Any]:
    """One response per status, naming the codes sent with it."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(STATUS[code], []).append(code.value)
    return {
        str(status): {"description": " or ".join(sorted(names)), **_json(_ERROR)}
        for status, names in sorted(by_status.items())
    }


def _op(
    summary: str,
    ok: dict[str, Any],
    refusals: list[ErrorCode],
    *,
    body: dict[str, Any] | None = None,
    params: list[dict[str, Any]] | None = None,
    body_required: bool = True,
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {**ok, **_refusals(refusals)}}
    if body is not None:
        op["requestBody"] = {"required": body_required, **body}
    if params:
        op["parameters"] = params
    return op


C = ErrorCode
#: Refusals any endpoint of either plane may send.
_ANY = [C.REQUEST_INVALID, C.REQUEST_TOO_LARGE, C.SERVER_SHUTTING_DOWN]
_IDENTITY = [C.IDENTITY_TOKEN_INVALID, C.SANDBOX_NAME_INVALID, *_ANY]
_CREDENTIAL = [
    C.CREDENTIAL_INVALID,
    C.SANDBOX_NOT_RUNNING,
    C.CREDENTIAL_WRONG_SANDBOX,
    C.AGENT_UNREACHABLE,
    C.SANDBOXES_UNAVAILABLE,  # a restarted server still taking back its sandboxes
    C.AGENT_TIMEOUT,
    C.SANDBOX_BUSY,
    *_ANY,
]


#: A ``network`` object that is not a policy (docs/network.md).
_NETWORK_INVALID = [
    C.SANDBOX_NETWORK_INVALID,
    C.SANDBOX_NETWORK_ENTRY_INVALID,
    C.SANDBOX_NETWORK_TOO_LARGE,
]


def _name_param() -> dict[str, Any]:
    return {
        "name": "name",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": SANDBOX_NAME_PATTERN},
    }


def control_plane(server_url: str) -> dict[str, Any]:
    """The control plane's document (``/api/v1/sandboxes``)."""
    s = _Schemas(
        closed={
            control.AttachRequest,
            control.ShareRequest,
            control.NetworkPolicy,
            control.ForkRequest,
            control.VolumeMount,
            control.VolumeCreate,
        }
    )
    handle = {
        "200": {
            "description": "the sandbox, running, and how to reach it",
            **_json(s.ref(control.SandboxHandle)),
        },
        "202": {
            "description": "the declared environment is being prepared; repeat after Retry-After",
            **_json(s.ref(control.Preparing)),
        },
    }
    record = {
        "200": {
            "description": "the sandbox (no credentials)",
            **_json(s.ref(control.SandboxRecord)),
        }
    }
    done = {"204": {"description": "done"}}
    policy = {"200": {"description": "the policy in force", **_json(s.ref(control.NetworkPolicy))}}
    name = [_name_param()]
    since = [
        *name,
        {
            "name": "since",
            "in": "query",
            "required": False,
            "description": "RFC 3339: only what came after it",
            "schema": {"type": "string", "format": "date-time"},
        },
    ]
    one = f"{paths.SANDBOXES}/{{name}}"
    doc: dict[str, Any] = {
        "openapi": VERSION,
        "info": {
            "title": "podbay control plane",
            "version": "1",
            "description": "Sandboxes by name for the deployment the identity token "
            "names. Every refusal is {error, code}.",
        },
        "servers": [{"url": server_url}],
        "security": [{"identityToken": []}],
        "paths": {
            paths.SANDBOXES: {
                "get": _op(
                    "This deployment's sandboxes",
                    {"200": {"description": "the list", **_json(s.ref(control.SandboxList))}},
                    [C.IDENTITY_TOKEN_INVALID, C.SANDBOX_LABELS_INVALID, *_ANY],
                    params=[
                        {
                            "name": "label",
                            "in": "query",
                            "required": False,
                            "description": "k=v: only sandboxes with this label (repeatable: all)",
                            "schema": {"type": "array", "items": {"type": "string"}},
                            "style": "form",
                            "explode": True,
                        }
                    ],
                )
            },
            one: {
                "put": _op(
                    "Create, resume or reuse the sandbox",
                    handle,
                    [
                        *_IDENTITY,
                        C.SANDBOX_LIMIT_REACHED,
                        C.SANDBOXES_NOT_CONFIGURED,
                        C.SANDBOX_NOT_DECLARED,
                        C.SANDBOX_CLASS_UNKNOWN,
                        C.SANDBOX_LABELS_INVALID,
                        C.SANDBOX_ENV_INVALID,
                        C.SANDBOX_CPUS_BELOW_MIN,
                        C.SANDBOX_CPUS_ABOVE_MAX,
                        C.SANDBOX_MEMORY_BELOW_MIN,
                        C.SANDBOX_MEMORY_ABOVE_MAX,
                        C.SANDBOX_IDLE_TIMEOUT_BELOW_MIN,
                        C.SANDBOX_IDLE_TIMEOUT_ABOVE_MAX,
                        *_NETWORK_INVALID,
                        *_VOLUME_MOUNT,
                        C.SANDBOX_OPTIONS_CONFLICT,
                        C.SANDBOX_PREPARE_FAILED,
                        C.SANDBOX_APPLY_FAILED,
                        C.SANDBOX_START_FAILED,
                        C.SANDBOXES_UNAVAILABLE,
                    ],
                    body=_json(s.ref(control.AttachRequest)),
                    body_required=False,
                    params=name,
                ),
                "get": _op(
                    "The sandbox's record", record, [*_IDENTITY, C.SANDBOX_NOT_FOUND], params=name
                ),
                "delete": _op(
                    "Drop the sandbox and its files",
                    done,
                    [*_IDENTITY, C.SANDBOX_NOT_FOUND, C.SANDBOXES_UNAVAILABLE],
                    params=name,
                ),
            },
            f"{one}/network": {
                "get": _op(
                    "Its egress policy in force",
                    policy,
                    [*_IDENTITY, C.SANDBOX_NOT_FOUND],
                    params=name,
                ),
                "put": _op(
                    "Change its egress policy, in force when answered (docs/network.md)",
                    policy,
                    [
                        *_IDENTITY,
                        C.SANDBOX_NOT_FOUND,
                        *_NETWORK_INVALID,
                        C.SANDBOX_NETWORK_NOT_APPLIED,
                        C.SANDBOX_NODE_LOST,
                    ],
                    body=_json(s.ref(control.NetworkPolicy)),
                    params=name,
                ),
            },
            f"{one}/egress": {
                "get": _op(
                    "Destinations it reached or was refused lately, busiest first; empty "
                    "while it does not run (docs/network.md, Audit)",
                    {
                        "200": {
                            "description": "the audit",
                            **_json(s.ref(control.EgressAudit)),
                        }
                    },
                    [*_IDENTITY, C.SANDBOX_NOT_FOUND, C.SANDBOX_NODE_LOST],
                    params=name,
                ),
            },
            f"{one}/fork": {
                "post": _op(
                    "Copy it into new running sandboxes: its files now, class, options "
                    "and egress policy; each its own credentials and network (docs/fork.md)",
                    {
                        "200": {
                            "description": "the new sandboxes, running, in the order asked",
                            **_json(s.ref(control.ForkResult)),
                        }
                    },
                    [
                        *_IDENTITY,
                        C.SANDBOX_NOT_FOUND,
                        C.SANDBOX_NAME_TAKEN,
                        C.SANDBOX_FORK_INVALID,
                        C.SANDBOX_FORK_UNSUPPORTED,
                        C.SANDBOX_LIMIT_REACHED,
                        C.HOST_DISK_FULL,
                        C.SANDBOX_NODE_LOST,
                        C.SANDBOX_START_FAILED,
                        C.SANDBOXES_UNAVAILABLE,
                    ],
                    body=_json(s.ref(control.ForkRequest)),
                    params=name,
                )
            },
            f"{one}/stop": {
                "post": _op(
                    "Suspend its compute early",
                    done,
                    [*_IDENTITY, C.SANDBOX_NOT_FOUND, C.SANDBOXES_UNAVAILABLE],
                    params=name,
                )
            },
            f"{one}/metrics": {
                "get": _op(
                    "The sandbox's resource samples (every 2 s, the last 10 min), oldest first",
                    {"200": {"description": "the samples", **_json(s.ref(observe.Metrics))}},
                    [*_IDENTITY, C.SANDBOX_NOT_FOUND, C.SANDBOXES_UNAVAILABLE],
                    params=since,
                )
            },
            f"{one}/events": {
                "get": _op(
                    "What happened to the sandbox (kept after it is removed), oldest first",
                    {"200": {"description": "the events", **_json(s.ref(observe.EventList))}},
                    [*_IDENTITY, C.SANDBOX_NOT_FOUND],
                    params=since,
                )
            },
            f"{one}/commands": {
                "get": _op(
                    "Each exec and spawn's argv, user, exit code and duration, oldest first",
                    {"200": {"description": "the log", **_json(s.ref(observe.CommandList))}},
                    [*_IDENTITY, C.SANDBOX_NOT_FOUND, C.SANDBOXES_UNAVAILABLE],
                    params=since,
                )
            },
            f"{one}/ports/{{port}}/share": {
                "post": _op(
                    "A signed, expiring URL to one port of the sandbox, for a person",
                    {
                        "200": {
                            "description": "the URL and when it expires",
                            **_json(s.ref(control.ShareUrl)),
                        }
                    },
                    [*_IDENTITY, C.SANDBOX_NOT_FOUND],
                    body=_json(s.ref(control.ShareRequest)),
                    body_required=False,
                    params=[
                        *name,
                        {
                            "name": "port",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "integer", "minimum": 1, "maximum": 65535},
                        },
                    ],
                )
            },
        },
        "components": {
            "securitySchemes": {
                "identityToken": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
            }
        },
    }
    doc["paths"].update(_volume_paths(s))
    doc["paths"].update(_operator_paths())
    doc["components"]["securitySchemes"]["operatorToken"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "podbay admin token (or an operator's console session)",
    }
    s.ref(control.ErrorBody)
    doc["components"]["schemas"] = s.components
    return doc


#: Attach's ``volumes`` that cannot be mounted (docs/volumes.md).
_VOLUME_MOUNT = [
    C.VOLUME_MOUNT_INVALID,
    C.VOLUME_NAME_INVALID,
    C.VOLUME_NOT_FOUND,
    C.VOLUME_CLASS_UNSUPPORTED,
    C.VOLUMES_UNAVAILABLE,
]


def _volume_paths(s: _Schemas) -> dict[str, Any]:
    """``/api/v1/volumes``: the deployment's volumes and their files (docs/volumes.md)."""
    refused = [C.IDENTITY_TOKEN_INVALID, C.VOLUMES_UNAVAILABLE, *_ANY]
    name = [
        {
            "name": "name",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": VOLUME_NAME_PATTERN},
        }
    ]
    path = {
        "name": "path",
        "in": "query",
        "required": True,
        "description": "a path in the volume ('/' or '' is its root); symlinks are never followed",
        "schema": {"type": "string"},
    }
    one = f"{paths.VOLUMES}/{{name}}"
    volume = {"description": "the volume", **_json(s.ref(control.Volume))}
    bad_path = [C.VOLUME_NOT_FOUND, C.VOLUME_NAME_INVALID, C.VOLUME_PATH_INVALID]
    return {
        paths.VOLUMES: {
            "get": _op(
                "This deployment's volumes",
                {"200": {"description": "the list", **_json(s.ref(control.VolumeList))}},
                refused,
            ),
            "post": _op(
                "Create a volume of a fixed size (a hard limit)",
                {"201": volume},
                [*refused, C.VOLUME_NAME_INVALID, C.VOLUME_SIZE_INVALID, C.VOLUME_EXISTS],
                body=_json(s.ref(control.VolumeCreate)),
            ),
        },
        one: {
            "get": _op(
                "The volume: size, bytes used, the sandboxes that mount it",
                {"200": volume},
                [*refused, C.VOLUME_NOT_FOUND, C.VOLUME_NAME_INVALID],
                params=name,
            ),
            "delete": _op(
                "Delete the volume and its files; refused while a sandbox mounts it",
                {"204": {"description": "done"}},
                [*refused, C.VOLUME_NOT_FOUND, C.VOLUME_NAME_INVALID, C.VOLUME_IN_USE],
                params=name,
            ),
        },
        f"{one}/files": {
            "get": _op(
                "A file's content",
                {
                    "200": {
                        "description": "its bytes",
                        "content": {"application/octet-stream": {"schema": {}}},
                    }
                },
                [*refused, *bad_path, C.VOLUME_PATH_NOT_FOUND],
                params=[*name, path],
            ),
            "put": _op(
                "Write a file (its directories made); the body is its whole content",
                {"204": {"description": "written"}},
                [*refused, *bad_path, C.VOLUME_FULL],
                body={"content": {"application/octet-stream": {"schema": {}}}},
                params=[*name, path],
            ),
            "delete": _op(
                "Remove a file, a symlink (not its target) or a directory and all in it",
                {"204": {"description": "done"}},
                [*refused, *bad_path, C.VOLUME_PATH_NOT_FOUND],
                params=[*name, path],
            ),
        },
        f"{one}/entries": {
            "get": _op(
                "A directory's entries (path optional: the root)",
                {"200": {"description": "the entries", **_json(s.ref(control.VolumeEntryList))}},
                [*refused, *bad_path, C.VOLUME_PATH_NOT_FOUND],
                params=[*name, {**path, "required": False}],
            )
        },
    }


def _operator_paths() -> dict[str, Any]:
    """The operator's API (docs/console.md): deployments and nodes."""
    operator: list[dict[str, list[str]]] = [{"operatorToken": []}]
    refused = [C.TOKEN_INVALID, C.OPERATOR_REQUIRED, *_ANY]
    obj = {"type": "object"}
    doc = {"200": {"description": "the document", **_json(obj)}}
    name = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]
    one = f"{paths.DEPLOYMENTS}/{{name}}"
    ops: dict[str, Any] = {
        paths.DEPLOYMENTS: {
            "get": _op("Every deployment, with its count of sandboxes", doc, refused),
            "post": _op(
                "Register a deployment ({name, spec?}); its identity token",
                {"201": {"description": "name, token, created_at", **_json(obj)}},
                [*refused, C.DEPLOYMENT_EXISTS],
                body=_json(obj),
            ),
        },
        one: {
            "delete": _op(
                "Delete the deployment: its tokens stop working, its sandboxes go",
                {"204": {"description": "done"}},
                [*refused, C.DEPLOYMENT_NOT_FOUND],
                params=name,
            )
        },
        f"{one}/token": {
            "post": _op(
                'A new identity token, or ({"kind": "e2b"}) a new E2B API key',
                doc,
                [*refused, C.DEPLOYMENT_NOT_FOUND],
                body=_json(obj),
                body_required=False,
                params=name,
            )
        },
        paths.NODES: {"get": _op("The nodes: state, classes, load", doc, refused)},
        f"{paths.NODES}/{{name}}/drain": {
            "post": _op(
                "Drain a cluster node: no new sandboxes go there",
                {"202": {"description": "name, state", **_json(obj)}},
                [*refused, C.NODE_NOT_FOUND, C.NOT_A_CLUSTER],
                params=name,
            )
        },
    }
    for methods in ops.values():
        for op in methods.values():
            op["security"] = operator
    return ops


def data_plane(endpoint: str) -> dict[str, Any]:
    """The data plane's document: paths relative to a handle's ``endpoint``."""
    s = _Schemas(
        closed={
            data.ExecRequest,
            data.SpawnRequest,
            data.SignalRequest,
            data.MakeDirRequest,
            data.ChmodRequest,
            data.MoveRequest,
        }
    )
    done = {"204": {"description": "done"}}
    path_q = [{"name": "path", "in": "query", "required": True, "schema": {"type": "string"}}]
    pid = [{"name": "process_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    offsets = [
        {
            "name": f"{stream}_from",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 0},
        }
        for stream in ("stdout", "stderr")
    ]
    # Beyond the reference: a bounded long-poll, bytes as base64, an account.
    live = [
        {
            "name": "wait_ms",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 0, "maximum": POLL_WAIT_MAX_MS},
        },
        {
            "name": "encoding",
            "in": "query",
            "required": False,
            "schema": {"type": "string", "enum": ["utf-8", "base64"]},
        },
    ]
    user_q = [{"name": "user", "in": "query", "required": False, "schema": {"type": "string"}}]
    # One entry per route, alike in shape on purpose: the document declares each
    # operation (summary, answers, refusals, parameters) where a reader finds it.
    paths_ = {
        "PATH_" + c
        for c in ("INVALID", "NOT_FOUND", "IS_DIRECTORY", "NOT_DIRECTORY", "ACCESS_DENIED")
    }
    path_codes = [c for c in C if c.value in paths_]
    exec_body = s.ref(data.ExecRequest)
    s.components["ExecRequest"]["properties"]["timeout_ms"].update(
        {"minimum": 1, "maximum": EXEC_MAX_TIMEOUT_MS}
    )
    s.components["ExecRequest"]["properties"]["max_output_bytes"].update(
        {"minimum": 0, "maximum": EXEC_OUTPUT_MAX}
    )
    s.ref(data.SignalRequest)
    s.components["SignalRequest"]["properties"]["signal"]["enum"] = list(SIGNAL_NAMES)
    doc: dict[str, Any] = {
        "openapi": VERSION,
        "info": {
            "title": "podbay data plane",
            "version": "1",
            "description": "Commands, processes and files of one sandbox, through the "
            f"gateway. JSON bodies at most {MAX_JSON_BODY} bytes.",
        },
        "servers": [{"url": endpoint}],
        "security": [{"credential": []}],
        "paths": {
            paths.INFO: {
                "get": _op(
                    "What this agent can do",
                    {
                        "200": {
                            "description": "version and features",
                            **_json(s.ref(data.AgentInfo)),
                        }
                    },
                    _CREDENTIAL,
                )
            },
            paths.EXEC: {
                "post": _op(
                    "Run argv to completion",
                    {
                        "200": {
                            "description": "its exit code and output",
                            **_json(s.ref(data.ExecResult)),
                        }
                    },
                    [*_CREDENTIAL, C.COMMAND_START_FAILED, C.USER_UNKNOWN],
                    body=_json(exec_body),
                )
            },
            paths.PROCESSES: {
                "get": _op(
                    "Tracked processes",
                    {"200": {"description": "the list", **_json(s.ref(data.ProcessList))}},
                    _CREDENTIAL,
                ),
                "post": _op(
                    "Start argv and return at once",
                    {"200": {"description": "its status", **_json(s.ref(data.ProcessStatus))}},
                    [*_CREDENTIAL, C.COMMAND_START_FAILED, C.PROCESS_LIMIT_REACHED, C.USER_UNKNOWN],
                    body=_json(s.ref(data.SpawnRequest)),
                ),
                "delete": _op("Kill every process in the sandbox but the agent", done, _CREDENTIAL),
            },
            paths.PROCESSES + "/{process_id}": {
                "get": _op(
                    "Status and output after the given offsets",
                    {
                        "200": {
                            "description": "status and output",
                            **_json(s.ref(data.ProcessOutput)),
                        }
                    },
                    [*_CREDENTIAL, C.PROCESS_NOT_FOUND],
                    params=pid + offsets + live,
                ),
                "delete": _op(
                    "Kill if running, then forget",
                    done,
                    [*_CREDENTIAL, C.PROCESS_NOT_FOUND],
                    params=pid,
                ),
            },
            paths.PROCESSES + "/{process_id}/signal": {
                "post": _op(
                    "Signal the process group",
                    done,
                    [*_CREDENTIAL, C.PROCESS_NOT_FOUND, C.SIGNAL_INVALID],
                    body=_json(s.ref(data.SignalRequest)),
                    params=pid,
                )
            },
            paths.FILES: {
                "get": _op(
                    "Read a file",
                    {
                        "200": {
                            "description": "its bytes (X-Podbay-Sha256: their digest; "
                            "asked with X-Podbay-Sha256: trailing, a file above 1 MiB is "
                            "answered 'trailing' with its digest as the body's last 64 bytes)",
                            "content": {"application/octet-stream": {"schema": {}}},
                        }
                    },
                    [*_CREDENTIAL, *path_codes, C.USER_UNKNOWN],
                    params=path_q + user_q,
                ),
                "put": _op(
                    "Write a file atomically",
                    {"200": {"description": "what was written", **_json(s.ref(data.FileInfo))}},
                    [
                        *_CREDENTIAL,
                        *path_codes,
                        C.DIGEST_MISSING,
                        C.DIGEST_MISMATCH,
                        C.NO_SPACE,
                        C.PATH_EXISTS,
                    ],
                    body={"content": {"application/octet-stream": {"schema": {}}}},
                    params=[
                        *path_q,
                        *user_q,
                        {
                            "name": paths.DIGEST_HEADER,
                            "in": "header",
                            "required": True,
                            "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                        },
                    ],
                ),
                "delete": _op(
                    "Remove a file or directory",
                    done,
                    [*_CREDENTIAL, *path_codes, C.DIRECTORY_NOT_EMPTY],
                    params=[
                        *path_q,
                        *user_q,
                        {"name": "recursive", "in": "query", "schema": {"type": "boolean"}},
                    ],
                ),
            },
            paths.FILES_STAT: {
                "get": _op(
                    "A file's metadata",
                    {"200": {"description": "its metadata", **_json(s.ref(data.FileInfo))}},
                    [*_CREDENTIAL, *path_codes, C.USER_UNKNOWN],
                    params=[
                        *path_q,
                        *user_q,
                        {"name": "owner", "in": "query", "schema": {"type": "boolean"}},
                    ],
                )
            },
            paths.FILES_LIST: {
                "get": _op(
                    "A directory's entries",
                    {"200": {"description": "its entries", **_json(s.ref(data.DirListing))}},
                    [*_CREDENTIAL, *path_codes, C.USER_UNKNOWN],
                    params=path_q + user_q,
                )
            },
            paths.FILES_MKDIR: {
                "post": _op(
                    "Make a directory",
                    {"200": {"description": "the directory", **_json(s.ref(data.FileInfo))}},
                    [*_CREDENTIAL, *path_codes, C.PATH_EXISTS, C.USER_UNKNOWN],
                    body=_json(s.ref(data.MakeDirRequest)),
                    params=user_q,
                )
            },
            paths.FILES_CHMOD: {
                "post": _op(
                    "Set a path's permission bits",
                    {"200": {"description": "the path", **_json(s.ref(data.FileInfo))}},
                    [*_CREDENTIAL, *path_codes, C.USER_UNKNOWN],
                    body=_json(s.ref(data.ChmodRequest)),
                    params=user_q,
                )
            },
            paths.FILES_MOVE: {
                "post": _op(
                    "Rename a path (atomic, one filesystem)",
                    {"200": {"description": "the destination", **_json(s.ref(data.FileInfo))}},
                    [
                        *_CREDENTIAL,
                        *path_codes,
                        C.PATH_EXISTS,
                        C.DIRECTORY_NOT_EMPTY,
                        C.USER_UNKNOWN,
                    ],
                    body=_json(s.ref(data.MoveRequest)),
                    params=user_q,
                )
            },
        },
        "components": {
            "securitySchemes": {
                "credential": {"type": "apiKey", "in": "header", "name": paths.CREDENTIAL_HEADER}
            }
        },
    }
    s.ref(control.ErrorBody)
    doc["components"]["schemas"] = s.components
    return doc


__all__ = ["control_plane", "data_plane"]
