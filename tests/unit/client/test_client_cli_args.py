"""CLI argument handling that needs no server."""

from __future__ import annotations

from click.testing import CliRunner

from podbay.cli.commands.sandbox import command, split_remote


def test_split_remote() -> None:
    assert split_remote("t42:out.txt") == ("t42", "out.txt")
    assert split_remote("slack:C1:17.2:/workspace/a") == ("slack:C1:17.2", "/workspace/a")
    assert split_remote("t42:") == ("t42", ".")
    assert split_remote("./local:file") is None
    assert split_remote("/abs/path") is None
    assert split_remote("plain") is None


def test_no_token_is_one_line_exit_2() -> None:
    result = CliRunner().invoke(command, ["list"], env={"ASTRO_AUTHZ_TOKEN": ""})
    assert result.exit_code == 2
    assert "ASTRO_AUTHZ_TOKEN" in result.output


def test_cp_needs_exactly_one_remote_side(tmp_path: object) -> None:
    result = CliRunner().invoke(command, ["cp", "a", "b", "--token", "x.e30.y"])
    assert result.exit_code == 2
    assert "exactly one" in result.output
