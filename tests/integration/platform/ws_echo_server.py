"""A stdlib-only WebSocket echo server, run *inside* a sandbox (the base image
has python3 and no packages) by the port WebSocket tests; not a test module.

``python3 ws_echo_server.py PORT LOG``: one thread per connection. Each
message is echoed whole with its type; the text ``close-me`` is answered by a
close 4001 ``bye``; ``big N`` by a binary message of N bytes. The path
``/silent`` never answers the upgrade. ``LOG`` gets a line per connection's
start and end: ``open PATH`` and ``end PATH close CODE`` (a close frame came)
or ``end PATH eof`` (the connection ended without one).
"""

import base64
import hashlib
import socket
import struct
import sys
import threading

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
lock = threading.Lock()


def log(line):
    with lock, open(sys.argv[2], "a") as f:
        f.write(line + "\n")


def frame(opcode, payload):
    n = len(payload)
    if n < 126:
        size = bytes([n])
    elif n < 65536:
        size = b"\x7e" + struct.pack(">H", n)
    else:
        size = b"\x7f" + struct.pack(">Q", n)
    return bytes([0x80 | opcode]) + size + payload


def unmask(mask, data):
    key = int.from_bytes((mask * (len(data) // 4 + 1))[: len(data)], "big")
    return (int.from_bytes(data, "big") ^ key).to_bytes(len(data), "big")


def read_exact(f, n):
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return data


def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        data = c.recv(4096)
        if not data:
            c.close()
            return
        head += data
    lines = head.decode().split("\r\n")
    path = lines[0].split(" ")[1]
    h = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    log("open " + path)
    if path.startswith("/silent"):
        while c.recv(4096):
            pass
        c.close()
        log("end " + path + " eof")
        return
    accept = base64.b64encode(
        hashlib.sha1((h["sec-websocket-key"] + GUID).encode()).digest()
    ).decode()
    c.sendall(
        (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
        ).encode()
    )
    f = c.makefile("rb")
    parts, opcode = [], 1
    try:
        while True:
            b0, b1 = read_exact(f, 2)
            n = b1 & 127
            if n == 126:
                n = struct.unpack(">H", read_exact(f, 2))[0]
            elif n == 127:
                n = struct.unpack(">Q", read_exact(f, 8))[0]
            mask = read_exact(f, 4)
            data = unmask(mask, read_exact(f, n)) if n else b""
            op = b0 & 15
            if op == 8:
                code = struct.unpack(">H", data[:2])[0] if len(data) >= 2 else 1005
                c.sendall(frame(8, data[:2]))
                log(f"end {path} close {code}")
                break
            if op == 9:
                c.sendall(frame(10, data))
                continue
            if op == 10:
                continue
            if op in (1, 2):
                parts, opcode = [], op
            parts.append(data)
            if not b0 & 0x80:
                continue
            message = b"".join(parts)
            if opcode == 1 and message == b"close-me":
                c.sendall(frame(8, struct.pack(">H", 4001) + b"bye"))
            elif opcode == 1 and message.startswith(b"big "):
                c.sendall(frame(2, b"x" * int(message.split()[1])))
            else:
                c.sendall(frame(opcode, message))
    except (EOFError, OSError, ValueError):
        log(f"end {path} eof")
    c.close()


srv = socket.create_server(("127.0.0.1", int(sys.argv[1])))
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
