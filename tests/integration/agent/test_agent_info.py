from __future__ import annotations

from agent_harness import Agent

import podbay


def test_info_reports_version_and_files_feature(agent: Agent) -> None:
    resp = agent.client.get("/v1/info")
    assert resp.status_code == 200
    assert resp.json() == {"version": podbay.__version__,
                           "features": ["files", "files.trailing-digest", "pty", "ports"]}
