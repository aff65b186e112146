"""podbay's C programs are built once, from one place, warnings as errors; the
launcher's protocol constants are written once (podbay.agent.protocol) and the
C header is generated from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from podbay.agent import launcher, protocol
from podbay.errors import DriverError
from podbay.runtime import native, native_build


def test_the_committed_header_is_what_the_protocol_module_generates() -> None:
    header = native.PACKAGE / "agent" / protocol.C_HEADER
    assert header.read_text() == protocol.c_header()
    assert native_build.header_is_current()


def test_the_python_launcher_speaks_the_protocol_modules_constants() -> None:
    assert launcher.MAX_REQUEST == protocol.MAX_REQUEST
    given = [False, True, False]
    request = {"argv": ["true"], "cwd": "/", "env": {}, "ids": None, "terminal": True}
    decoded = launcher.decode_request(launcher.encode_request({**request, "given": given}))
    assert decoded["terminal"] is True
    assert decoded["given"] == [False, True, False]


def test_every_program_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    built = native_build.build(tmp_path / "native")
    assert native.built(built) == built
    assert native_build.is_current(built)
    for program in native.PROGRAMS:
        assert (built / program.name).stat().st_mode & 0o777 == program.mode
    assert "-Werror" in native_build.COMMON_FLAGS
    assert "-Wextra" in native_build.COMMON_FLAGS


def test_a_warning_fails_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "warns.c"
    source.write_text("int main(void) { int unused; return 0; }\n")
    program = native.Program("warns", str(source), (), 0o755)
    monkeypatch.setattr(native_build, "PROGRAMS", (program,))
    with pytest.raises(DriverError, match="unused"):
        native_build.build(tmp_path / "native")
    assert not (tmp_path / "native").exists()


def test_a_stale_or_missing_build_is_refused_naming_the_step(tmp_path: Path) -> None:
    with pytest.raises(DriverError, match=r"not built .*\./run serve"):
        native.built(tmp_path / "none")
    built = native_build.build(tmp_path / "native")
    (built / native.STAMP).write_text("0" * 16 + "\n")
    assert not native_build.is_current(built)
    with pytest.raises(DriverError, match="built from other sources"):
        native.built(built)
    assert native_build.main(["--into", str(built)]) == 0  # rebuilt
    assert native_build.main(["--check", "--into", str(built)]) == 0
    (built / "launcher").unlink()
    with pytest.raises(DriverError, match=r"\['launcher'\] are missing"):
        native.built(built)
