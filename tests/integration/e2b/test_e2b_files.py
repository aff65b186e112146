"""envd's ``/files`` through E2B's SDK and its URLs: gzip both ways, several
files in one upload, signed URLs (valid, wrong, expired), and E2B's default
account ``user`` working in its home."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import os
from typing import Any

import httpx
import pytest

from podbay.testing.platform import PlatformServer

e2b = pytest.importorskip("e2b")

pytestmark = pytest.mark.root


def _raw(
    server: PlatformServer, sandbox: Any, method: str, extra: dict[str, str], body: bytes = b""
) -> httpx.Response:
    """``/files`` of ``/tmp/gz.bin`` by hand, with the sandbox's access token."""
    named = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": sandbox._envd_access_token}
    return httpx.request(
        method,
        server.base_url + "/files",
        params={"path": "/tmp/gz.bin"},
        headers={**named, **extra},
        content=body or None,
    )


@pytest.mark.parametrize("e2b_server", ["gvisor", "container", "vm"], indirect=True)
def test_gzip_uploads_and_downloads(e2b_server: PlatformServer, e2b_opts: dict[str, Any]) -> None:
    sandbox = e2b.Sandbox.create(**e2b_opts)
    try:
        data = b"compressible " * 10_000
        info = sandbox.files.write("/tmp/gz.bin", data, gzip=True)
        assert info.path == "/tmp/gz.bin"
        digest = sandbox.commands.run("sha256sum < /tmp/gz.bin").stdout.split()[0]
        assert digest == hashlib.sha256(data).hexdigest()
        assert sandbox.files.read("/tmp/gz.bin", format="bytes", gzip=True) == data
        # On the wire: the answer really is gzip when the request accepts it.
        raw = _raw(e2b_server, sandbox, "GET", {"Accept-Encoding": "gzip"})
        assert raw.headers["content-encoding"] == "gzip"
        # Streamed as it is compressed (no Content-Length): count the wire's bytes.
        assert raw.num_bytes_downloaded < len(data) // 10
        assert raw.content == data  # httpx inflated it
        # Bytes gzip cannot shrink are sent as they are, though gzip is offered
        # (httpx offers it on every read): deflating them is all cost.
        noise = os.urandom(512 * 1024)
        sandbox.files.write("/tmp/gz.bin", noise)
        raw = _raw(e2b_server, sandbox, "GET", {"Accept-Encoding": "gzip"})
        assert "content-encoding" not in raw.headers
        assert raw.content == noise
        upload = {"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}
        cut = gzip.compress(b"x" * 100)[:-9]
        refused = _raw(e2b_server, sandbox, "POST", upload, cut)
        assert refused.status_code == 400
        assert refused.json()["error_code"] == "REQUEST_INVALID"
        brotli = _raw(e2b_server, sandbox, "POST", {**upload, "Content-Encoding": "br"}, b"x")
        assert brotli.status_code == 415
    finally:
        sandbox.kill()


def test_several_files_in_one_upload(e2b_opts: dict[str, Any]) -> None:
    async def main() -> None:
        sandbox = await e2b.AsyncSandbox.create(**e2b_opts)
        try:
            written = await sandbox.files.write_files(
                [
                    {"path": "/tmp/multi/a.txt", "data": "A"},
                    {"path": "/tmp/multi/b.txt", "data": b"B"},
                    {"path": "c.txt", "data": "C"},
                ]
            )
            assert [w.path for w in written] == [
                "/tmp/multi/a.txt",
                "/tmp/multi/b.txt",
                "/home/user/c.txt",
            ]
            got = await sandbox.commands.run("cat /tmp/multi/a.txt /tmp/multi/b.txt ~/c.txt")
            assert got.stdout == "ABC"
            assert await sandbox.files.read("/tmp/multi/b.txt", gzip=True) == "B"
        finally:
            await sandbox.kill()

    asyncio.run(main())


def test_signed_urls(e2b_server: PlatformServer, e2b_opts: dict[str, Any]) -> None:
    sandbox = e2b.Sandbox.create(secure=True, **e2b_opts)
    # With E2B_SANDBOX_URL the SDK's URL names no sandbox: the header does.
    named = {"E2b-Sandbox-Id": sandbox.sandbox_id}
    try:
        upload = sandbox.upload_url("/tmp/signed.txt", use_signature_expiration=60)
        assert "signature=v1_" in upload
        assert "signature_expiration=" in upload
        sent = httpx.post(upload, headers=named, files={"file": ("signed.txt", b"via url")})
        assert sent.status_code == 200, sent.text
        assert sent.json()[0]["path"] == "/tmp/signed.txt"
        fetched = httpx.get(sandbox.download_url("/tmp/signed.txt"), headers=named)
        assert (fetched.status_code, fetched.content) == (200, b"via url")
        # As the SDK hands it out, with no header: the signature names the sandbox.
        bare = httpx.get(sandbox.download_url("/tmp/signed.txt"))
        assert (bare.status_code, bare.content) == (200, b"via url")
        again = httpx.post(sandbox.upload_url("/tmp/bare.txt"), files={"f": ("x", b"bare")})
        assert again.status_code == 200
        assert sandbox.files.read("/tmp/bare.txt") == "bare"
        # As root: the user is part of what is signed.
        as_root = sandbox.download_url("/tmp/signed.txt", user="root")
        assert httpx.get(as_root, headers=named).content == b"via url"

        # Signed for another path, operation or user; expired; no signature.
        other = sandbox.download_url("/tmp/other.txt").replace("other.txt", "signed.txt")
        write_url = sandbox.upload_url("/tmp/signed.txt")
        user_swapped = as_root.replace("username=root", "username=user")
        expired = sandbox.download_url("/tmp/signed.txt", use_signature_expiration=-5)
        for url, code in [
            (other, "E2B_SIGNATURE_INVALID"),
            (write_url, "E2B_SIGNATURE_INVALID"),
            (user_swapped, "E2B_SIGNATURE_INVALID"),
            (expired, "E2B_SIGNATURE_EXPIRED"),
        ]:
            for extra in (named, {}):
                answer = httpx.get(url, headers=extra)
                assert answer.status_code == 401, url
                assert answer.json()["error_code"] == code
        hostile = httpx.get(e2b_server.base_url + "/files?path=/x&signature=v1_é", headers=named)
        assert hostile.status_code == 401
        unsigned = httpx.get(e2b_server.base_url + "/files?path=/tmp/x", headers=named)
        assert unsigned.status_code == 401
        assert unsigned.json()["error_code"] == "E2B_ACCESS_TOKEN_MISSING"
        # A signed upload URL writes where it was signed for, whatever the part says.
        elsewhere = httpx.post(
            upload, headers=named, files={"file": ("/tmp/elsewhere.txt", b"moved?")}
        )
        assert elsewhere.json()[0]["path"] == "/tmp/signed.txt"
        assert not sandbox.files.exists("/tmp/elsewhere.txt")
        # A signature minted for one sandbox does not open another.
        second = e2b.Sandbox.create(secure=True, **e2b_opts)
        try:
            second.files.write("/tmp/signed.txt", "second's")
            other_box = httpx.get(
                sandbox.download_url("/tmp/signed.txt"),
                headers={"E2b-Sandbox-Id": second.sandbox_id},
            )
            assert other_box.status_code == 401
        finally:
            second.kill()
    finally:
        sandbox.kill()


@pytest.mark.parametrize("e2b_server", ["gvisor", "container", "vm"], indirect=True)
def test_user_is_the_default_and_works_in_its_home(e2b_opts: dict[str, Any]) -> None:
    sandbox = e2b.Sandbox.create(**e2b_opts)
    try:
        ran = sandbox.commands.run("id -un; pwd; touch here && stat -c %U here ~")
        assert ran.stdout == "user\n/home/user\nuser\nuser\n"
        root = sandbox.commands.run("id -un; pwd", user="root")
        assert root.stdout == "root\n/root\n"
        sandbox.files.write("notes.txt", "mine")
        assert sandbox.files.get_info("notes.txt").owner == "user"
        assert sandbox.files.get_info("/home/user/notes.txt").path == "/home/user/notes.txt"
        assert sandbox.files.read("/home/user/notes.txt") == "mine"
        assert [e.name for e in sandbox.files.list(".")] == sandbox.commands.run(
            "ls -A"
        ).stdout.split()
        with pytest.raises(e2b.SandboxException):  # root's files stay root's
            sandbox.files.write("/root/x", "no")
        sandbox.files.write("/root/x", "yes", user="root")
        assert sandbox.files.get_info("/root/x", user="root").owner == "root"
    finally:
        sandbox.kill()
