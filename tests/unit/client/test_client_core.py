"""The sans-I/O core and helpers: tokens, config, deadlines, answers, parsing."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from fakeplatform import make_token

from podbay.client import _files
from podbay.client._core import Config, Core, resolve_config, token_issuer
from podbay.errors import SandboxNotEnabledError, SandboxRequestError
from podbay.wire.control import SandboxHandle
from podbay.wire.data import ExecResult
from podbay.wire.limits import BASE64_WRITE_CHUNK

ROOT = Path(__file__).resolve().parents[3]


def result(
    stdout: str = "", *, exit_code: int = 0, stderr: str = "", truncated: bool = False
) -> ExecResult:
    return ExecResult(
        exit_code=exit_code,
        stdout=stdout,
        stderr=stderr,
        duration_ms=1,
        timed_out=False,
        truncated=truncated,
    )


# -- token and configuration ---------------------------------------------------------


def test_token_issuer_reads_iss_without_a_key() -> None:
    assert token_issuer(make_token("https://cp.example:8700/")) == "https://cp.example:8700/"


@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("nodots", "not a JWT"),
        ("a.!!!.c", "not base64url JSON"),
        (
            "a." + base64.urlsafe_b64encode(json.dumps({"sub": "x"}).encode()).decode() + ".c",
            "no 'iss' claim",
        ),
        ("a.W10.c", "no 'iss' claim"),
    ],
)
def test_token_issuer_refuses_bad_tokens(token: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        token_issuer(token)


def test_resolve_config_from_environment() -> None:
    config = resolve_config(environ={"ASTRO_AUTHZ_TOKEN": make_token("http://cp:1/")})
    assert config.server_url == "http://cp:1"
    assert (config.timeout_seconds, config.prepare_timeout_seconds) == (30.0, 900.0)
    explicit = resolve_config(identity_token=make_token(), server_url="http://other", environ={})
    assert explicit.server_url == "http://other"
    with pytest.raises(ValueError, match="ASTRO_AUTHZ_TOKEN"):
        resolve_config(environ={})


def test_client_construction_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from podbay import AsyncSandboxClient, SandboxClient

    monkeypatch.setenv("ASTRO_AUTHZ_TOKEN", make_token("http://from-token:8700"))
    with SandboxClient() as client:
        assert client.server_url == "http://from-token:8700"
    assert AsyncSandboxClient().server_url == "http://from-token:8700"


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"timeout_seconds": 1}, "timeout_seconds must be above 1"),
        ({"files": "ftp"}, "files must be one of"),
        ({"server_url": "cp:80"}, "server_url must start with http"),
        ({"prepare_timeout_seconds": -1}, "prepare_timeout_seconds must not be negative"),
    ],
)
def test_config_is_checked(kwargs: dict[str, object], why: str) -> None:
    base: dict[str, object] = {"identity_token": "t", "server_url": "http://cp"}
    with pytest.raises(ValueError, match=why):
        Config(**{**base, **kwargs})  # type: ignore[arg-type]


# -- requests and answers -------------------------------------------------------------


def core(timeout: float = 30) -> Core:
    return Core(Config(identity_token="tok", server_url="http://cp", timeout_seconds=timeout))


def test_exec_deadline_is_one_second_under_the_request_timeout() -> None:
    c = core(10)
    assert c.exec_timeout_ms(None) == 9_000
    assert c.exec_timeout_ms(5_000) == 5_000
    assert c.exec_timeout_ms(60_000) == 9_000
    assert c.exec_timeout_ms(0) == 1


def test_control_requests_carry_the_identity_token_and_escape_names() -> None:
    request = core().attach_request("a:b.c")
    assert request.method == "PUT"
    assert request.url.path == "/api/v1/sandboxes/a:b.c"
    assert request.headers["Authorization"] == "Bearer tok"
    assert json.loads(request.content) == {"class": "default"}
    assert core().get_request("x/y").url.raw_path == b"/api/v1/sandboxes/x%2Fy"


def test_data_requests_merge_the_opaque_headers() -> None:
    handle = SandboxHandle(
        name="n",
        class_="default",
        state="running",
        created_at=datetime.now(UTC),
        last_active_at=datetime.now(UTC),
        endpoint="http://node:9/sbx/n/",
        headers={"X-Cred": "c"},
        expires_at=datetime.now(UTC) + timedelta(minutes=15),
    )
    request = core().data_request(handle, "GET", "/v1/info")
    assert str(request.url) == "http://node:9/sbx/n/v1/info"
    assert request.headers["X-Cred"] == "c"
    assert "Authorization" not in request.headers


def test_handle_cache_renews_within_a_minute_of_expiry() -> None:
    c = core()
    now = datetime.now(UTC)
    handle = SandboxHandle(
        name="n",
        class_="default",
        state="running",
        created_at=now,
        last_active_at=now,
        endpoint="http://e",
        headers={},
        expires_at=now + timedelta(seconds=90),
    )
    c.store("n", handle)
    assert c.cached("n", now) is handle
    assert c.cached("n", now + timedelta(seconds=31)) is None
    c.forget("n")
    assert c.cached("n", now) is None


@pytest.mark.parametrize(
    ("header", "expected"), [(None, 5.0), ("3", 3.0), ("0.5", 0.5), ("junk", 5.0), ("-4", 0.0)]
)
def test_retry_after(header: str | None, expected: float) -> None:
    headers = {"Retry-After": header} if header else {}
    assert Core.retry_after(httpx.Response(202, headers=headers)) == expected


def test_refusals_map_to_the_exception_tree() -> None:
    def refuse(status: int, body: object) -> SandboxRequestError:
        response = (
            httpx.Response(status, json=body)
            if not isinstance(body, str)
            else httpx.Response(status, text=body)
        )
        return Core.refusal(response)

    for code in ("SANDBOXES_NOT_CONFIGURED", "SANDBOX_NOT_DECLARED"):
        assert isinstance(refuse(409, {"error": "no", "code": code}), SandboxNotEnabledError)
    other = refuse(409, {"error": "bad class", "code": "SANDBOX_CLASS_UNKNOWN"})
    assert type(other) is SandboxRequestError
    assert str(other) == "409 SANDBOX_CLASS_UNKNOWN: bad class"
    plain = refuse(502, "Bad Gateway from a proxy")
    assert (plain.status, plain.code, plain.message) == (502, None, "Bad Gateway from a proxy")
    # 409 NOT_DECLARED-looking text without the code is not "not enabled"
    assert type(refuse(409, "SANDBOX_NOT_DECLARED")) is SandboxRequestError


def test_lenient_decoding_survives_new_fields() -> None:
    now = datetime.now(UTC).isoformat()
    response = httpx.Response(
        200,
        json={
            "name": "n",
            "class": "default",
            "state": "running",
            "created_at": now,
            "last_active_at": now,
            "new": 1,
        },
        request=httpx.Request("GET", "http://cp"),
    )
    assert core().parse_record(response).name == "n"
    broken = httpx.Response(200, json={"name": 1}, request=httpx.Request("GET", "http://cp"))
    with pytest.raises(SandboxRequestError, match="unexpected answer"):
        core().parse_record(broken)


# -- files helpers ------------------------------------------------------------------------


def test_grep_parsing() -> None:
    assert _files.grep_result(result("", exit_code=1), "x", ".") == []
    out = "a.py\x0012:x = 1: two\nsub/b:c.txt\x003:TODO: a:b\n"
    assert _files.parse_grep(out, ".") == [
        _files.GrepMatch(path="a.py", line=12, text="x = 1: two"),
        _files.GrepMatch(path="sub/b:c.txt", line=3, text="TODO: a:b"),
    ]
    # a grep without -Z (another server's image): "path:line:text"
    assert _files.parse_grep("f.txt:2:a:b\n", "f.txt") == [
        _files.GrepMatch(path="f.txt", line=2, text="a:b")
    ]
    # a cut last line is dropped, not returned half
    assert len(_files.parse_grep("a\x001:x\na\x002:y", ".", truncated=True)) == 1
    with pytest.raises(SandboxRequestError) as info:
        _files.grep_result(result(exit_code=2, stderr="grep: Unmatched ( or \\("), "(", ".")
    assert info.value.status == 400
    partial = _files.grep_result(result("a\x001:x\n", exit_code=2, stderr="denied"), "x", ".")
    assert len(partial) == 1


def test_grep_command_always_names_the_file() -> None:
    command = _files.grep_command("-v", "file")
    assert command[:2] == ["grep", "-rnHIZ"]
    assert command[2:4] == ["-e", "-v"]


def test_write_commands_chunk_at_48_kib() -> None:
    data = bytes(range(256)) * (BASE64_WRITE_CHUNK // 256) * 2 + b"tail"
    commands = list(_files.write_commands("dir/f.bin", io.BytesIO(data)))
    assert len(commands) == 4  # 48 KiB + 48 KiB + 4 bytes, then the rename
    assert [c[2].split()[-2] for c in commands[:3]] == [">", ">>", ">>"]
    assert b"".join(base64.b64decode(c[4]) for c in commands[:3]) == data
    assert all(len(c[4].encode()) < 128 * 1024 for c in commands[:3])  # per-argument limit
    assert commands[-1][-1] == "dir/f.bin"
    assert commands[-1][-2] == commands[0][-1]
    assert len(list(_files.write_commands("e", io.BytesIO(b"")))) == 2
    exact = list(_files.write_commands("e", io.BytesIO(b"x" * BASE64_WRITE_CHUNK)))
    assert len(exact) == 2


def test_base64_read_refuses_truncation_and_maps_missing() -> None:
    with pytest.raises(SandboxRequestError, match="1 MiB") as info:
        _files.decode_read(result("QUFB", truncated=True), "big")
    assert info.value.status == 413
    with pytest.raises(SandboxRequestError) as info:
        _files.decode_read(result(exit_code=1, stderr="base64: x: No such file"), "x")
    assert info.value.status == 404
    assert _files.decode_read(result("AP8A\n/w=="), "x") == b"\x00\xff\x00\xff"


def test_list_parsing() -> None:
    entries = _files.parse_list(result("a\nsub/\n.hidden\n"), ".")
    assert [(e.name, e.is_directory) for e in entries] == [
        ("a", False),
        ("sub", True),
        (".hidden", False),
    ]


def test_digest_check() -> None:
    check = _files.DigestCheck({"X-Podbay-Sha256": "00"}, "p")
    check.update(b"x")
    with pytest.raises(Exception, match="mismatch"):
        check.verify()
    missing = _files.DigestCheck({}, "p")
    with pytest.raises(Exception, match="no X-Podbay-Sha256"):
        missing.verify()


def test_digest_check_takes_a_trailing_digest_off_the_content() -> None:
    data = bytes(range(256)) * 300
    body = data + hashlib.sha256(data).hexdigest().encode()
    headers = {"X-Podbay-Sha256": "trailing", "Content-Length": str(len(body))}
    check = _files.DigestCheck(headers, "p")
    # Split anywhere: chunks shorter and longer than a digest, one across it.
    chunks, i, sizes = [], 0, [50, 700, 10, 64, 3]
    while i < len(body):
        size = sizes[len(chunks) % len(sizes)]
        chunks.append(body[i : i + size])
        i += size
    passed = b"".join(bytes(piece) for chunk in chunks for piece in check.update(chunk))
    assert passed == data
    assert check.total == len(data) == check.size
    check.verify()
    bad = _files.DigestCheck(headers, "p")
    bad.update(body[:-1] + b"0")
    with pytest.raises(Exception, match="mismatch"):
        bad.verify()
    short = _files.DigestCheck(headers, "p")
    short.update(body[:30])
    with pytest.raises(Exception, match="no X-Podbay-Sha256"):
        short.verify()


# -- the generated sync client ----------------------------------------------------------


def test_generated_sync_client_is_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "unasync.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_unasync_fails_on_a_rule_that_matches_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location("unasync", ROOT / "scripts" / "unasync.py")
    assert spec is not None
    assert spec.loader is not None
    unasync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(unasync)
    assert unasync.main(["--check"]) == 0
    monkeypatch.setattr(unasync, "SUBS", [*unasync.SUBS, (r"\bNoSuchAsyncName\b", "X")])
    assert unasync.main(["--check"]) == 1
    assert "NoSuchAsyncName" in capsys.readouterr().out
