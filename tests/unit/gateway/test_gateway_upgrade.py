"""The gateway's leg of terminals and ports against a hostile agent socket:
whatever answers there (code in the sandbox may hold it) gets bounded reads
and a contract refusal, never a hang or a crash."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from podbay.errors import ApiError
from podbay.gateway import terminal
from podbay.gateway.upgrade import MAX_HEAD, upgrade
from podbay.wire import stream

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _with_agent(tmp_path: Path, answer: Answer) -> ApiError | None:
    path = tmp_path / "agent.sock"
    server = await asyncio.start_unix_server(answer, str(path))
    try:
        await upgrade(path, "GET", "/v1/tunnel?port=1", "podbay-tunnel")
    except ApiError as exc:
        return exc
    finally:
        server.close()
    return None


def _answering(data: bytes, close: bool = True) -> Answer:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(data)
        await writer.drain()
        if close:
            writer.close()

    return answer


@pytest.mark.parametrize(
    "data",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
        b"HTTP/1.1 502 Bad\r\ncontent-length: 9\r\n\r\nnot json!",
        b"HTTP/1.1 400 Bad\r\ncontent-length: 99999999\r\n\r\n",
        b"HTTP/1.1 101 Switching",  # cut before the head ends
        b"HTTP/1.1 101 Switching\r\n" + b"x: y\r\n" * (MAX_HEAD // 6 + 10) + b"\r\n",
    ],
)
def test_hostile_answers_are_agent_unreachable(tmp_path: Path, data: bytes) -> None:
    refusal = asyncio.run(_with_agent(tmp_path, _answering(data)))
    assert refusal is not None
    assert refusal.code.value == "AGENT_UNREACHABLE"


def test_a_refusal_in_the_contracts_shape_keeps_its_code(tmp_path: Path) -> None:
    body = b'{"error": "nothing on port 1", "code": "PORT_UNREACHABLE"}'
    data = b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
    refusal = asyncio.run(_with_agent(tmp_path, _answering(data)))
    assert refusal is not None
    assert refusal.code.value == "PORT_UNREACHABLE"
    assert refusal.message == "nothing on port 1"


def test_no_agent_is_agent_unreachable(tmp_path: Path) -> None:
    async def main() -> ApiError | None:
        try:
            await upgrade(tmp_path / "none.sock", "GET", "/", "podbay-tunnel")
        except ApiError as exc:
            return exc
        return None

    refusal = asyncio.run(main())
    assert refusal is not None
    assert refusal.code.value == "AGENT_UNREACHABLE"


@pytest.mark.parametrize(
    "frames",
    [
        b"d" + (stream.MAX_FRAME + 1).to_bytes(4, "big"),  # too long
        b"q\x00\x00\x00\x00",  # unknown kind
        stream.resize_frame(10, 10),  # a kind only the gateway sends
        stream.frame(stream.EXIT, b"\x00"),  # a malformed exit
        stream.frame(stream.DATA, b"partial")[:7],  # cut short
    ],
)
def test_hostile_frames_from_the_agent_end_the_terminal(frames: bytes) -> None:
    async def main() -> tuple[bool, list[dict[str, object]]]:
        reader = asyncio.StreamReader()
        reader.feed_data(frames)
        reader.feed_eof()
        sent: list[dict[str, object]] = []

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        return await terminal._agent_to_client(reader, send), sent  # type: ignore[arg-type]

    finished, sent = asyncio.run(main())
    assert finished is terminal._End.AGENT_BROKE_OFF
    assert all(m.get("text") is None for m in sent)  # no exit was made up
