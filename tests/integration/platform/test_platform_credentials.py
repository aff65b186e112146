"""Data-plane credentials against a real gateway: forged, expired, another
sandbox's, and expiry mid-session followed by a re-attach."""

from __future__ import annotations

import base64
import json
import time

import pytest

from podbay.testing.platform import run_cli

pytestmark = pytest.mark.root


def _tamper(token: str) -> str:
    head, payload, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["exp"] += 3600
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{head}.{forged}.{sig}"


def test_missing_forged_other_sandbox(server, token):
    a = server.attach(token, "cred-a").json()
    b = server.attach(token, "cred-b").json()
    r = server.http.post(a["endpoint"] + "/v1/exec", json={"command": ["true"]})
    assert (r.status_code, r.json()["code"]) == (401, "CREDENTIAL_INVALID")
    forged = {k: _tamper(v) for k, v in a["headers"].items()}
    r = server.http.post(
        a["endpoint"] + "/v1/exec", headers=forged, json={"command": ["touch", "/workspace/ran"]}
    )
    assert (r.status_code, r.json()["code"]) == (401, "CREDENTIAL_INVALID")
    r = server.http.post(
        b["endpoint"] + "/v1/exec",
        headers=a["headers"],
        json={"command": ["touch", "/workspace/ran"]},
    )
    assert (r.status_code, r.json()["code"]) == (403, "CREDENTIAL_WRONG_SANDBOX")
    # nothing ran in either sandbox
    for h in (a, b):
        assert server.exec(h, "ls", "/workspace").json()["stdout"] == ""
    for name in ("cred-a", "cred-b"):
        server.api("DELETE", f"/api/v1/sandboxes/{name}", token)


def test_expiry_mid_session_then_reattach(make_server):
    server = make_server({"PODBAY_CREDENTIALS_TTL_SECONDS": "2"})
    token = server.create_deployment("short-creds")
    h = server.attach(token, "s").json()
    assert server.exec(h, "sh", "-c", "echo 1 > /workspace/n").status_code == 200
    time.sleep(2.5)
    r = server.exec(h, "cat", "/workspace/n")
    assert r.status_code == 401
    assert r.json()["code"] == "CREDENTIAL_INVALID"
    assert "expired" in r.json()["error"]
    again = server.attach(token, "s").json()
    assert again["start"] == "reused"
    assert again["headers"] != h["headers"]
    assert server.exec(again, "cat", "/workspace/n").json()["stdout"] == "1\n"


def _claims(token: str) -> dict[str, int]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def test_identity_token_with_expiry_and_key_rotation(make_server):
    # Tokens with the default lifetime (days): slow CLI calls under load never
    # expire one early. Expiry is checked on a token of its own below.
    server = make_server()
    token = server.create_deployment("rotating")
    assert server.api("GET", "/api/v1/sandboxes", token).status_code == 200
    old_kid = server.cli("deployment", "keys", "list").stdout.split()[1]
    server.cli("deployment", "keys", "rotate")
    new_token = server.cli("deployment", "token", "rotating").stdout.strip()
    assert server.api("GET", "/api/v1/sandboxes", new_token).status_code == 200  # new key
    assert server.api("GET", "/api/v1/sandboxes", token).status_code == 200  # old still works
    server.cli("deployment", "keys", "remove", old_kid)
    time.sleep(1.1)  # the server looks at its key directory at most once a second
    assert server.api("GET", "/api/v1/sandboxes", new_token).status_code == 200
    assert server.api("GET", "/api/v1/sandboxes", token).status_code == 401  # key removed
    # The CLI signs with the lifetime its settings give: 2 s here. The token
    # is the same as new_token but for its times, and new_token (its exp days
    # away) is accepted: the refusal is the expiry's.
    short = run_cli(
        ["deployment", "token", "rotating", "--data-dir", str(server.data_dir)],
        {**server.env, "PODBAY_CREDENTIALS_IDENTITY_TTL_SECONDS": "2"},
    ).stdout.strip()
    claims = _claims(short)
    assert claims["exp"] - claims["iat"] == 2
    assert _claims(new_token)["exp"] > claims["exp"]
    time.sleep(max(0.0, claims["exp"] - time.time()) + 1.1)
    expired = server.api("GET", "/api/v1/sandboxes", short)
    assert (expired.status_code, expired.json()["code"]) == (401, "IDENTITY_TOKEN_INVALID")
    assert "expired" in expired.json()["error"]
