"""Every client method, sync and async, against the fake platform."""

from __future__ import annotations

import json
import os
import tarfile
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from fakeplatform import Fake

from podbay.client import (
    BuildStep,
    CombinedResult,
    DirEntry,
    ExecResult,
    GrepMatch,
    Preparing,
    RunResult,
    SandboxHandle,
    SandboxNotEnabledError,
    SandboxPreparingError,
    SandboxRecord,
    SandboxRequestError,
    SandboxUnavailableError,
)
from podbay.wire.limits import BASE64_WRITE_CHUNK

BINARY = bytes(range(256)) * 4 + b"\x00\xff\x00\xff"


# -- attach and handles ------------------------------------------------------------


def test_attach_returns_a_typed_handle_and_caches_it(client: Any, fake: Fake) -> None:
    handle = client.attach("thread-42")
    assert isinstance(handle, SandboxHandle)
    assert (handle.name, handle.class_, handle.state, handle.start) == (
        "thread-42",
        "default",
        "running",
        "created",
    )
    assert "X-Podbay-Credential" not in repr(handle)  # credentials stay out of logs
    client.exec("thread-42", ["true"])
    client.exec("thread-42", ["true"])
    assert fake.attaches == 1
    put = next(r for r in fake.requests if r.method == "PUT")
    assert json.loads(put.content) == {"class": "default"}
    assert put.headers["Authorization"] == f"Bearer {fake.token}"


def test_exec_attaches_on_first_use(client: Any, fake: Fake) -> None:
    assert client.exec("a", ["true"]).exit_code == 0
    assert fake.attaches == 1


def test_202_then_200_waits_retry_after_and_puts_again(client: Any, fake: Fake) -> None:
    fake.preparing = 2
    handle = client.attach("prep")
    assert handle.state == "running"
    assert fake.count("PUT", "/prep") == 3


def test_each_202_goes_to_on_preparing_with_the_builds_step(make_client: Any, fake: Fake) -> None:
    seen: list[Preparing] = []
    fake.preparing = 2
    fake.preparing_extra = {
        "progress": {"step": 2, "steps": 4, "doing": "apt-get update", "elapsed_seconds": 3.5},
        "later": "a field this client does not know",
    }
    client = make_client(on_preparing=seen.append)
    assert client.attach("prep").state == "running"
    assert (
        seen
        == [
            Preparing(
                name="prep",
                progress=BuildStep(step=2, steps=4, doing="apt-get update", elapsed_seconds=3.5),
            )
        ]
        * 2
    )
    # A server that says no more than the contract: progress is None.
    seen.clear()
    fake.preparing, fake.preparing_extra = 1, {}
    client.attach("other")
    assert seen == [Preparing(name="other")]


def test_prepare_timeout_raises_preparing_error(make_client: Any, fake: Fake) -> None:
    fake.preparing = 100
    fake.retry_after = "7"
    client = make_client(prepare_timeout_seconds=1)
    with pytest.raises(SandboxPreparingError) as info:
        client.attach("slow")
    assert info.value.retry_after == 7.0
    assert isinstance(info.value, SandboxRequestError)
    assert fake.count("PUT", "/slow") == 1


def test_unknown_class_is_a_409_request_error(client: Any) -> None:
    with pytest.raises(SandboxRequestError) as info:
        client.attach("x", "huge")
    assert info.value.status == 409
    assert info.value.code == "SANDBOX_CLASS_UNKNOWN"
    assert not isinstance(info.value, SandboxNotEnabledError)


def test_not_declared_is_not_enabled(client: Any, fake: Fake) -> None:
    fake.not_enabled = True
    with pytest.raises(SandboxNotEnabledError) as info:
        client.exec("x", ["true"])
    assert info.value.status == 409
    assert info.value.code == "SANDBOX_NOT_DECLARED"


def test_401_reattaches_once_and_repeats(client: Any, fake: Fake) -> None:
    client.attach("t")
    fake.credentials["t"] = "rotated"  # the cached credential no longer works
    result = client.exec("t", ["echo", "hi"])
    assert result.stdout == "hi\n"
    assert fake.attaches == 2
    assert fake.count("POST", "/v1/exec") == 2


def test_401_twice_is_raised_not_retried_again(client: Any, fake: Fake) -> None:
    client.attach("t")
    fake.reject_credentials = 2
    with pytest.raises(SandboxRequestError) as info:
        client.exec("t", ["true"])
    assert info.value.status == 401
    assert fake.attaches == 2
    assert fake.count("POST", "/v1/exec") == 2


def test_a_restarted_gateway_503_reattaches_and_repeats(client: Any, fake: Fake) -> None:
    """A restarted server's gateway, still taking back its sandboxes, held the
    call and answers 503 SANDBOXES_UNAVAILABLE with Retry-After: the call
    re-attaches (attach waits out the restart) and is repeated once."""
    import httpx

    client.attach("t")
    answer = fake.data
    held = [
        httpx.Response(
            503,
            json={"error": "taking back", "code": "SANDBOXES_UNAVAILABLE"},
            headers={"Retry-After": "1"},
        )
    ]
    fake.data = lambda request, path: held.pop() if held else answer(request, path)  # type: ignore[method-assign]
    assert client.exec("t", ["echo", "back"]).stdout == "back\n"
    assert fake.attaches == 2
    assert fake.count("POST", "/v1/exec") == 2


def test_transport_failure_after_send_is_not_retried(
    client: Any, fake: Fake, tmp_path: Any
) -> None:
    fake.fail_after_send = {"/v1/exec"}
    marker = fake.workspace / "ran"
    with pytest.raises(SandboxUnavailableError) as info:
        client.exec("t", ["/bin/sh", "-c", "echo x >> ran"])
    assert info.value.cause is not None
    assert fake.count("POST", "/v1/exec") == 1
    assert marker.read_text() == "x\n"  # it ran exactly once


def test_unreachable_control_plane_is_unavailable(make_client: Any, fake: Fake) -> None:
    def down(request: Any) -> Any:
        import httpx

        raise httpx.ConnectError("connection refused", request=request)

    fake.control = lambda request, path: down(request)  # type: ignore[method-assign]
    with pytest.raises(SandboxUnavailableError, match="ConnectError"):
        make_client().list()


def test_handle_is_renewed_before_it_expires(client: Any, fake: Fake) -> None:
    fake.ttl = timedelta(seconds=30)  # under the 60 s margin: renewed on every use
    client.exec("t", ["true"])
    client.exec("t", ["true"])
    assert fake.attaches == 2
    fake.ttl = timedelta(minutes=15)
    client.exec("t", ["true"])
    client.exec("t", ["true"])
    assert fake.attaches == 3


# -- commands ----------------------------------------------------------------------------


def test_exec_result_and_deadline(client: Any, fake: Fake) -> None:
    result = client.exec(
        "t", ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"], env={"X": "1"}, cwd="/workspace"
    )
    assert isinstance(result, ExecResult)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not result.timed_out
    assert not result.truncated
    bodies = [json.loads(r.content) for r in fake.requests if r.url.path.endswith("/v1/exec")]
    assert bodies[-1]["timeout_ms"] == 29_000  # one second under 30 s
    assert bodies[-1]["env"] == {"X": "1"}
    client.exec("t", ["true"], timeout_ms=500)
    client.exec("t", ["true"], timeout_ms=10**9)
    bodies = [json.loads(r.content) for r in fake.requests if r.url.path.endswith("/v1/exec")]
    assert [b["timeout_ms"] for b in bodies[-2:]] == [500, 29_000]


def test_exec_timeout_is_a_result(client: Any) -> None:
    result = client.exec("t", ["sleep", "5"], timeout_ms=200)
    assert result.timed_out
    assert result.exit_code == 137


def test_exec_refuses_a_shell_line(client: Any) -> None:
    with pytest.raises(TypeError, match="argv"):
        client.exec("t", "ls -l")


def test_command_start_failure_is_a_400(client: Any) -> None:
    with pytest.raises(SandboxRequestError) as info:
        client.exec("t", ["/no/such/binary"])
    assert info.value.status == 400
    assert info.value.code == "COMMAND_START_FAILED"


def test_exec_combined_interleaves(client: Any) -> None:
    result = client.exec_combined("t", "echo 1; echo 2 >&2; echo 3; exit 4")
    assert result == CombinedResult(output="1\n2\n3\n", exit_code=4, truncated=False)


def test_spawn_poll_processes_signal_kill(client: Any) -> None:
    proc = client.spawn("t", ["/bin/sh", "-c", "echo started; exec sleep 30"])
    assert proc.state == "running"
    assert proc.exit_code is None
    assert [p.process_id for p in client.processes("t")] == [proc.process_id]
    deadline = time.monotonic() + 10
    chunk = client.poll("t", proc.process_id)
    while not chunk.stdout and time.monotonic() < deadline:
        time.sleep(0.01)
        chunk = client.poll("t", proc.process_id)
    assert chunk.stdout == "started\n"
    assert chunk.stdout_next == 8
    again = client.poll("t", proc.process_id, stdout_from=8)
    assert again.stdout == ""
    client.signal("t", proc.process_id, "TERM")
    while chunk.state != "exited" and time.monotonic() < deadline:
        time.sleep(0.01)
        chunk = client.poll("t", proc.process_id, stdout_from=8)
    assert chunk.exit_code == 128 + 15
    client.kill("t", proc.process_id)
    assert client.processes("t") == []
    with pytest.raises(SandboxRequestError) as info:
        client.poll("t", proc.process_id)
    assert info.value.status == 404


def test_run_collects_whole_output_and_reaps(client: Any) -> None:
    seen: list[str] = []
    result = client.run(
        "t",
        ["/bin/sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.05; done; echo e >&2; exit 2"],
        interval_ms=20,
        on_output=lambda c: seen.append(c.stdout),
    )
    assert isinstance(result, RunResult)
    assert (result.stdout, result.stderr, result.exit_code) == ("1\n2\n3\n", "e\n", 2)
    assert not result.killed
    assert not result.timed_out
    assert result.state == "exited"
    assert "".join(seen) == "1\n2\n3\n"
    assert client.processes("t") == []


def test_run_timeout_kills(client: Any) -> None:
    result = client.run(
        "t", ["/bin/sh", "-c", "echo begin; exec sleep 30"], interval_ms=20, timeout_ms=500
    )
    assert result.killed
    assert result.timed_out
    assert result.stdout == "begin\n"
    assert result.exit_code == 137
    assert client.processes("t") == []


def test_run_cancel_event_kills(client: Any) -> None:
    cancel = threading.Event()
    cancel.set()
    result = client.run("t", ["sleep", "30"], interval_ms=20, cancel=cancel)
    assert result.killed
    assert not result.timed_out
    assert client.processes("t") == []


# -- files ---------------------------------------------------------------------------------


@pytest.fixture(params=["auto", "base64"])
def files_client(request: pytest.FixtureRequest, make_client: Any) -> Any:
    return make_client(files=request.param)


def test_binary_round_trip(files_client: Any, fake: Fake) -> None:
    files_client.write_file_bytes("t", "bin.dat", BINARY)
    assert (fake.workspace / "bin.dat").read_bytes() == BINARY
    assert files_client.read_file_bytes("t", "bin.dat") == BINARY
    files_client.write_file_bytes("t", "empty", b"")
    assert files_client.read_file_bytes("t", "empty") == b""


def test_text_twins(files_client: Any, fake: Fake) -> None:
    files_client.write_file("t", "main.py", "print('hé')\n")
    assert files_client.read_file("t", "main.py") == "print('hé')\n"


def test_missing_file_is_404(files_client: Any) -> None:
    with pytest.raises(SandboxRequestError) as info:
        files_client.read_file("t", "nope.txt")
    assert info.value.status == 404


def test_native_path_is_used_when_advertised(make_client: Any, fake: Fake) -> None:
    client = make_client()
    client.write_file_bytes("t", "a", b"x")
    client.read_file_bytes("t", "a")
    assert fake.count("PUT", "/v1/files") == 1
    assert fake.count("GET", "/v1/files") == 1
    assert fake.count("POST", "/v1/exec") == 0
    assert fake.count("GET", "/v1/info") == 1  # cached per handle
    put = next(r for r in fake.requests if r.method == "PUT" and r.url.path.endswith("files"))
    assert put.headers["X-Podbay-Sha256"] == (
        "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
    )


def test_fallback_when_not_advertised(make_client: Any, fake: Fake) -> None:
    fake.features = []
    client = make_client()
    client.write_file_bytes("t", "a", b"x")
    assert client.read_file_bytes("t", "a") == b"x"
    assert fake.count("PUT", "/v1/files") == 0


def test_files_native_insists(make_client: Any, fake: Fake) -> None:
    fake.features = []
    with pytest.raises(SandboxRequestError, match="native"):
        make_client(files="native").read_file_bytes("t", "a")


def test_base64_writes_are_chunked_at_48_kib(make_client: Any, fake: Fake) -> None:
    client = make_client(files="base64")
    data = os.urandom(BASE64_WRITE_CHUNK * 2 + 10)
    progress: list[tuple[int, int | None]] = []
    client.write_file_bytes("t", "big.bin", data, progress=lambda d, t: progress.append((d, t)))
    assert (fake.workspace / "big.bin").read_bytes() == data
    execs = [
        json.loads(r.content)["command"] for r in fake.requests if r.url.path.endswith("/v1/exec")
    ]
    assert len(execs) == 4  # three chunks, one rename
    assert all(len(c[3]) <= 4 * BASE64_WRITE_CHUNK // 3 + 4 for c in execs[:3])
    assert progress[-1] == (len(data), len(data))
    assert not [p for p in fake.workspace.iterdir() if ".podbay-" in p.name]


def test_base64_truncated_read_is_refused(make_client: Any, fake: Fake) -> None:
    (fake.workspace / "large").write_bytes(os.urandom(900 * 1024))
    with pytest.raises(SandboxRequestError, match="1 MiB") as info:
        make_client(files="base64").read_file_bytes("t", "large")
    assert info.value.status == 413


def test_native_digest_mismatch_raises(client: Any, fake: Fake) -> None:
    (fake.workspace / "f").write_bytes(b"hello")
    fake.corrupt_reads = True
    with pytest.raises(SandboxUnavailableError, match="SHA-256 mismatch"):
        client.read_file_bytes("t", "f")


def test_native_download_mismatch_leaves_no_file(client: Any, fake: Fake, tmp_path: Any) -> None:
    (fake.workspace / "f").write_bytes(b"hello")
    fake.corrupt_reads = True
    target = tmp_path / "local"
    target.mkdir()
    with pytest.raises(SandboxUnavailableError):
        client.download("t", "f", target / "f")
    assert list(target.iterdir()) == []


def test_list_dir(files_client: Any, fake: Fake) -> None:
    (fake.workspace / "sub").mkdir()
    (fake.workspace / "a.txt").write_text("a")
    (fake.workspace / ".hidden").write_text("h")
    entries = sorted(files_client.list_dir("t"), key=lambda e: e.name)
    assert entries == [
        DirEntry(name=".hidden", is_directory=False),
        DirEntry(name="a.txt", is_directory=False),
        DirEntry(name="sub", is_directory=True),
    ]
    with pytest.raises(SandboxRequestError) as info:
        files_client.list_dir("t", "missing")
    assert info.value.status == 404


def test_grep(client: Any, fake: Fake) -> None:
    (fake.workspace / "src").mkdir()
    (fake.workspace / "src" / "a.py").write_text("x = 1\n# TODO: a:b:c\n")
    (fake.workspace / "b.txt").write_text("nothing\nTODO here\n")
    matches = sorted(client.grep("t", "TODO"), key=lambda m: m.path)
    assert matches == [
        GrepMatch(path="./b.txt", line=2, text="TODO here"),
        GrepMatch(path="./src/a.py", line=2, text="# TODO: a:b:c"),
    ]
    single = client.grep("t", "TODO", "src/a.py")
    assert single == [GrepMatch(path="src/a.py", line=2, text="# TODO: a:b:c")]
    assert client.grep("t", "absent-pattern") == []
    with pytest.raises(SandboxRequestError) as info:
        client.grep("t", "x", "no-such-dir")
    assert info.value.status == 404


def test_upload_download_file_and_directory(files_client: Any, fake: Fake, tmp_path: Any) -> None:
    src = tmp_path / "src"
    (src / "nested").mkdir(parents=True)
    (src / "a.bin").write_bytes(BINARY)
    (src / "nested" / "b.txt").write_text("b")
    files_client.upload("t", src / "a.bin", "copy.bin")
    assert (fake.workspace / "copy.bin").read_bytes() == BINARY
    files_client.upload("t", src, "tree")
    assert (fake.workspace / "tree" / "nested" / "b.txt").read_text() == "b"
    out = tmp_path / "out"
    out.mkdir()
    files_client.download("t", "copy.bin", out)  # into a directory: keeps its name
    assert (out / "copy.bin").read_bytes() == BINARY
    files_client.download("t", "tree", out / "tree")
    assert (out / "tree" / "a.bin").read_bytes() == BINARY
    assert (out / "tree" / "nested" / "b.txt").read_text() == "b"


def test_progress_callback_native(client: Any, tmp_path: Any) -> None:
    data = os.urandom(3 * 1024 * 1024 + 5)
    seen: list[tuple[int, int | None]] = []
    client.write_file_bytes("t", "p.bin", data, progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (len(data), len(data))
    seen.clear()
    assert client.read_file_bytes("t", "p.bin", progress=lambda d, t: seen.append((d, t))) == data
    assert seen[-1][0] == len(data)


# -- control plane ---------------------------------------------------------------------------


def test_get_list_stop_delete(client: Any, fake: Fake) -> None:
    client.attach("one")
    client.attach("two")
    record = client.get("one")
    assert isinstance(record, SandboxRecord)
    assert record.class_ == "default"
    assert {r.name for r in client.list()} == {"one", "two"}
    client.stop("one")
    assert client.get("one").state == "suspended"
    client.exec("one", ["true"])  # attaches again (resumes)
    client.delete("two")
    with pytest.raises(SandboxRequestError) as info:
        client.get("two")
    assert (info.value.status, info.value.code) == (404, "SANDBOX_NOT_FOUND")
    get = next(r for r in fake.requests if r.method == "GET" and r.url.path.endswith("/one"))
    assert "X-Podbay-Credential" not in get.headers


def test_handle_object(client: Any, fake: Fake, face: str) -> None:
    sb = client.sandbox("thread-42")
    if face == "sync":
        with sb as s:
            s.write_file("hi.txt", "hi")
            assert s.exec(["cat", "hi.txt"]).stdout == "hi"
            assert s.list_dir() == [DirEntry(name="hi.txt", is_directory=False)]
    else:
        assert type(sb).__name__ == "AsyncSandbox"
        assert sb.name == "thread-42"


def test_directory_tar_is_safe(make_client: Any, fake: Fake, tmp_path: Any) -> None:
    """A hostile archive from the sandbox cannot write outside the target."""
    evil = fake.workspace / "evil"
    evil.mkdir()
    (evil / "ok").write_text("ok")
    client = make_client()
    client.download("t", "evil", tmp_path / "got")
    assert (tmp_path / "got" / "ok").read_text() == "ok"


def test_safe_extract_refuses_escapes(tmp_path: Any) -> None:
    import io

    from podbay.client import _files

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("../escape")
        tar.addfile(info, io.BytesIO(b""))
    buffer.seek(0)
    with tarfile.open(fileobj=buffer) as tar, pytest.raises(tarfile.TarError):
        _files.safe_extract(tar, str(tmp_path / "dest"))
    assert not (tmp_path / "escape").exists()


def test_run_interrupted_by_the_caller_kills_and_propagates(client: Any, fake: Fake) -> None:
    """Any exception while run() waits (Ctrl-C alike): the process is killed and reaped."""

    class Stop(Exception):
        pass

    def interrupt(chunk: Any) -> None:
        raise Stop

    with pytest.raises(Stop):
        client.run(
            "t", ["/bin/sh", "-c", "echo go; exec sleep 30"], interval_ms=20, on_output=interrupt
        )
    assert client.processes("t") == []
    assert any(r.url.path.endswith("/signal") for r in fake.requests)
