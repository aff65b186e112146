from __future__ import annotations

from agent_harness import Agent

import podbay


def test_info_reports_version_and_files_feature(agent: Agent) -> None:
    resp = agent.client.get("/v1/info")
    assert resp.status_code == 200
    body = resp.json()
    assert set(body) == {"version", "features"}
    assert body["version"] == podbay.__version__
    assert {
        "files",
        "files.trailing-digest",
        "pty",
        "ports",
        "files-ops",
        "stdin",
        "exec-output",
        "live-output",
        "users",
    } <= set(body["features"])
