"""podbay.host.criu_build's pure parts: where the source comes from, that it is
checked, that the fix applies once; and podbay.host.criu's finding of a build.
(The build itself and criu check: tests/integration/runtime/test_criu_host.py.)"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from podbay.errors import DriverError
from podbay.host import criu, criu_build


def test_archive_uris_reads_both_apt_formats_and_leaves_security_out(tmp_path: Path) -> None:
    one_line = tmp_path / "sources.list"
    one_line.write_text(
        "# a comment\n"
        "deb [signed-by=/k.gpg arch=amd64] http://mirror.example/debian bookworm main\n"
        "deb http://mirror.example/debian-security bookworm-security main\n"
    )
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    (parts / "debian.sources").write_text(
        "Types: deb\nURIs: https://other.example/debian/\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://other.example/debian-security\nSuites: bookworm-security\n"
    )
    (parts / "ignored.list.disabled").write_text("deb http://nope.example/debian x main\n")
    assert criu_build.archive_uris((one_line, parts)) == [
        "http://mirror.example/debian",
        "https://other.example/debian",
    ]


def test_a_kept_source_with_the_wrong_digest_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = tmp_path / "src" / criu.SOURCE_NAME
    kept.parent.mkdir()
    kept.write_bytes(b"not criu")
    # No archive to download from: the bad copy is refused, not built.
    monkeypatch.setattr(criu_build, "archive_uris", lambda: [])
    with pytest.raises(DriverError, match="no Debian archive"):
        criu_build.fetch_source(tmp_path)


def test_a_kept_source_with_the_right_digest_is_used_without_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = tmp_path / "src" / criu.SOURCE_NAME
    kept.parent.mkdir()
    kept.write_bytes(b"stand-in")
    monkeypatch.setattr(criu, "SOURCE_SHA256", hashlib.sha256(b"stand-in").hexdigest())
    monkeypatch.setattr(criu_build, "SOURCE_SHA256", criu.SOURCE_SHA256)
    assert criu_build.fetch_source(tmp_path) == kept


def test_the_source_fix_applies_exactly_once(tmp_path: Path) -> None:
    (path, old, new) = criu.SOURCE_FIXES[0]
    source = tmp_path / path
    source.parent.mkdir(parents=True)
    source.write_text(f"a\n\t{old}\nb\n")
    criu_build.apply_fixes(tmp_path)
    assert source.read_text() == f"a\n\t{new}\nb\n"
    # Already fixed (or another criu): refused rather than built unfixed.
    with pytest.raises(DriverError, match="does not apply"):
        criu_build.apply_fixes(tmp_path)


def test_criu_path_finds_only_a_complete_build_of_this_recipe(tmp_path: Path) -> None:
    assert criu.criu_path(tmp_path) is None
    binary = criu.build_dir(tmp_path) / "sbin" / "criu"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o700)
    assert criu.criu_path(tmp_path) == binary
    assert criu.criu_env(tmp_path) == {
        "CRIU_CONFIG_FILE": str(criu.build_dir(tmp_path) / criu.CONFIG_NAME)
    }
