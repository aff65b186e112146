"""envd's HTTP ``/files``: download (``GET``) and upload (``POST``, multipart
with one or several files, or octet-stream), on the agent's native files API.

- **uploads stream**: each part goes on to the agent as it arrives, hashed in
  the same pass (``podbay.e2b._upload``), never held whole. A later part's
  refusal (say, a second file where ``path`` names one) leaves the files
  before it written, as envd does.
- **gzip**: an upload with ``Content-Encoding: gzip`` is inflated here as it
  streams (at most :data:`MAX_UPLOAD` bytes once inflated, so a small bomb is
  refused, not expanded); a download whose request accepts gzip is sent compressed
  with ``Content-Encoding: gzip``, as the SDK's ``read(gzip=True)`` asks,
  unless its first bytes show gzip would not shrink it (then it goes as it is).
- **signed URLs**: the SDK's ``download_url``/``upload_url`` carry
  ``signature`` (and ``signature_expiration``) in place of the access token:
  ``"v1_" + base64(sha256("<path>:<read|write>:<username>:<token>[:<expiration>]"))``
  without padding, where the username is the query's (empty: the default
  user) and the token is the sandbox's ``envdAccessToken``. A wrong signature
  is 401 ``E2B_SIGNATURE_INVALID``, one past its expiration (a Unix time) 401
  ``E2B_SIGNATURE_EXPIRED``, as envd refuses them. With ``E2B_SANDBOX_URL``
  the SDK's URL names no sandbox (E2B's name it in the host): without
  ``E2b-Sandbox-Id`` the sandbox is the one whose token made the signature,
  found by signing with each E2B sandbox's token (one HMAC and one SHA-256
  per sandbox in the store: ``E2BService.signer``, where the secret is).
"""

from __future__ import annotations

import json
import posixpath
import time
import zlib
from collections.abc import AsyncIterator

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from podbay.client._files import READ_HEADERS, DigestCheck
from podbay.control.services.sandboxes import Attached
from podbay.errors import SandboxUnavailableError
from podbay.wire.paths import DIGEST_HEADER, DIGEST_TRAILING, FILES

from ._upload import MAX_UPLOAD, MultipartFiles, boundary_of, inflated, with_trailing_digest
from .error_responses import E2BError, error_response
from .relay import (
    ACCESS_TOKEN_HEADER,
    SANDBOX_ID_HEADER,
    headers,
    in_home,
    reach,
    service_of,
    user_of,
)

#: Downloads at most this large are compressed when asked (a larger one is sent
#: as it is: compressing it in this process would hold the event loop).
MAX_GZIP_DOWNLOAD = 64 * 1024 * 1024
#: A download's first bytes, compressed to see whether the rest is worth it.
_GZIP_PROBE = 64 * 1024


def _worth_compressing(data: bytes) -> bool:
    """Whether gzip shrinks ``data`` by a tenth or more, judged on its start.
    HTTP lets a server answer ``identity`` to any ``Accept-Encoding``; httpx
    (so E2B's SDK) offers gzip on every read, and deflating 10 MiB of
    already-compressed or random bytes costs far more than sending them."""
    probe = data[:_GZIP_PROBE]
    return len(zlib.compress(probe, 1)) < len(probe) * 0.9


async def _reach_files(request: Request, path: str, operation: str) -> Attached:
    """The sandbox of a ``/files`` call: its access token or API key as for
    every call, else a signature of this path and operation."""
    offered = request.query_params.get("signature")
    has_credentials = ACCESS_TOKEN_HEADER in request.headers or "x-api-key" in request.headers
    if offered is None or has_credentials:
        attached, _ = await reach(request)
        return attached
    service = service_of(request)
    raw_expiration = request.query_params.get("signature_expiration")
    expiration: int | None = None
    if raw_expiration is not None:
        if not raw_expiration.isdigit() or len(raw_expiration) > 12:
            raise E2BError(400, "REQUEST_INVALID", "signature_expiration must be a Unix time")
        expiration = int(raw_expiration)
    username = request.query_params.get("username") or ""
    found = await service.signer(
        request.headers.get(SANDBOX_ID_HEADER), offered, (path, operation, username, expiration)
    )
    if found is None:
        raise E2BError(401, "E2B_SIGNATURE_INVALID", "invalid signature")
    sandbox_id, token = found
    if expiration is not None and expiration < time.time():
        raise E2BError(401, "E2B_SIGNATURE_EXPIRED", "signature is already expired")
    deployment, _ = await service.authorize(sandbox_id, token, None)
    return await service.reach(deployment, sandbox_id)


def _file_params(request: Request, path: str) -> dict[str, str]:
    user = request.query_params.get("username") or user_of(request)
    return {"path": in_home(user, path), "user": user}


def _accepts_gzip(request: Request) -> bool:
    for item in request.headers.get("accept-encoding", "").split(","):
        coding, _, quality = item.strip().partition(";")
        if coding.strip().lower() == "gzip" and quality.replace(" ", "") not in ("q=0", "q=0.0"):
            return True
    return False


async def download(request: Request) -> Response:
    path = request.query_params.get("path")
    if not path:
        raise E2BError(400, "REQUEST_INVALID", "path is required")
    attached = await _reach_files(request, path, "read")
    http = service_of(request).http
    upstream = await http.send(
        http.build_request(
            "GET",
            attached.endpoint + FILES,
            params=_file_params(request, path),
            # One pass over the file in the agent (the digest after the bytes),
            # as podbay's own SDK reads; asked without, the agent hashes it first.
            headers={**headers(attached), **READ_HEADERS},
        ),
        stream=True,
    )
    if upstream.status_code != 200:
        await upstream.aread()
        await upstream.aclose()
        return _refusal(upstream)
    check = DigestCheck(upstream.headers, path)
    content = _checked(upstream, check)
    # The first 64 KiB decide whether gzip is worth it; the rest streams on.
    head = await _head(content)
    if (
        _accepts_gzip(request)
        and check.total is not None
        and check.total <= MAX_GZIP_DOWNLOAD
        and _worth_compressing(head)
    ):
        return StreamingResponse(
            _gzipped(head, content),
            media_type="application/octet-stream",
            headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"},
            background=BackgroundTask(upstream.aclose),
        )
    length = {} if check.total is None else {"Content-Length": str(check.total)}
    return StreamingResponse(
        _then(head, content),
        media_type="application/octet-stream",
        headers=length,
        background=BackgroundTask(upstream.aclose),
    )


async def _checked(upstream: httpx.Response, check: DigestCheck) -> AsyncIterator[bytes]:
    """The file's bytes as the agent sends them, the last piece held back until
    their SHA-256 matches the agent's: a mismatch (or a short body) raises, so
    the caller's answer is cut short of its length rather than completed."""
    held = b""
    try:
        async for chunk in upstream.aiter_bytes():
            for piece in check.update(chunk):
                if held:
                    yield held
                held = bytes(piece)
        try:
            check.verify()
        except SandboxUnavailableError as exc:
            raise E2BError(502, "SANDBOX_ERROR", str(exc)) from None
        if held:
            yield held
    finally:
        await upstream.aclose()


async def _head(content: AsyncIterator[bytes]) -> bytes:
    """At least the first :data:`_GZIP_PROBE` bytes of ``content`` (all, if fewer)."""
    head = bytearray()
    while len(head) < _GZIP_PROBE:
        chunk = await anext(content, None)
        if chunk is None:
            break
        head += chunk
    return bytes(head)


async def _then(head: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if head:
        yield head
    async for chunk in rest:
        yield chunk


async def _gzipped(head: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    async for chunk in _then(head, rest):
        if out := compressor.compress(chunk):
            yield out
    yield compressor.flush()


def _refusal(answer: httpx.Response) -> Response:
    try:
        body = answer.json()
        message, code = str(body.get("error")), str(body.get("code"))
    except (ValueError, AttributeError):
        message, code = answer.text[:500], "SANDBOX_ERROR"
    return error_response(answer.status_code, code, message)


async def upload(request: Request) -> Response:
    path = request.query_params.get("path")
    content_type = request.headers.get("content-type", "")
    media = content_type.split(";", 1)[0].strip().lower()
    if media not in ("application/octet-stream", "multipart/form-data"):
        raise E2BError(400, "REQUEST_INVALID", f"content type {media!r} is not an upload")
    if media == "application/octet-stream" and not path:
        raise E2BError(400, "REQUEST_INVALID", "path is required")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_UPLOAD:
        raise E2BError(413, "REQUEST_TOO_LARGE", f"uploads are at most {MAX_UPLOAD} bytes")
    body = inflated(request.stream(), request.headers.get("content-encoding", "").strip().lower())
    attached = await _reach_files(request, path or "", "write")
    if media == "application/octet-stream":
        assert path  # checked above
        answer = await _put(request, attached, path, body)
        return answer if isinstance(answer, Response) else _written([answer])
    files = MultipartFiles(body, boundary_of(content_type))
    written: list[dict[str, str]] = []
    while (filename := await files.next_file()) is not None:
        if written and path:
            raise E2BError(400, "REQUEST_INVALID", "path names one file; several were sent")
        # The query's path wins over the part's file name, as in envd: a signed
        # upload URL then writes only where it was signed for.
        name = path or filename
        if not name:
            raise E2BError(400, "REQUEST_INVALID", "a file part names no path")
        answer = await _put(request, attached, name, files.data())
        if isinstance(answer, Response):
            return answer
        written.append(answer)
    return _written(written)


async def _put(
    request: Request, attached: Attached, name: str, chunks: AsyncIterator[bytes]
) -> dict[str, str] | Response:
    """Stream one file to the agent, hashed in the same pass (trailing digest)."""
    params = _file_params(request, name)
    answer = await service_of(request).http.put(
        attached.endpoint + FILES,
        params=params,
        content=with_trailing_digest(chunks),
        headers={**headers(attached), DIGEST_HEADER: DIGEST_TRAILING},
    )
    if answer.status_code != 200:
        return _refusal(answer)
    return {"name": posixpath.basename(name), "type": "file", "path": params["path"]}


def _written(written: list[dict[str, str]]) -> Response:
    return Response(json.dumps(written), media_type="application/json")
