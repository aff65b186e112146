"""Servers on the test host that say which name a connection gave them, and a
probe that connects naming one: for the SNI and Host checks.

``NamedServers`` listens in the test host's namespace (sockets made by a thread
that entered it, served by threads of this process): HTTPS on
:data:`TLS_PORT` with a self-signed certificate made here (``cryptography``),
answering ``tls:<SNI>``; plain HTTP on :data:`HTTP_PORT`, answering
``http:<Host>``. ``NAMED_PROBE`` runs inside a sandbox (its python3) and
prints one result per target: the server's answer, or the error's name.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import ssl
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from podbay.runtime.network import netns

TLS_PORT = 8443
HTTP_PORT = 8081
#: Echoes what it reads until the client ends, then ends too.
ECHO_PORT = 8082

#: argv[1]: address, argv[2]: port, argv[3]: MiB. Sends that much (a pattern)
#: while reading the echo back; prints "same" when every byte came back.
ECHO_PROBE = r"""
import hashlib, socket, sys, threading
address, port, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = hashlib.sha256(b"podbay").digest() * (1 << 15)  # 1 MiB
s = socket.create_connection((address, port), timeout=60)
def send():
    for _ in range(mib):
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=send).start()
got = hashlib.sha256()
total = 0
while True:
    chunk = s.recv(1 << 16)
    if not chunk:
        break
    got.update(chunk)
    total += len(chunk)
want = hashlib.sha256(data * mib).hexdigest()
print("same" if got.hexdigest() == want else f"differs: {total} bytes")
"""

#: argv[1]: JSON [[kind, host, port, name-or-payload], ...]; kind "tls" (SNI
#: = name, none when empty), "http" (Host = name, none when empty), "raw" (hex
#: bytes sent, then the answer read). Prints a JSON list of results.
NAMED_PROBE = r"""
import errno, json, socket, ssl, sys

def one(kind, host, port, name):
    try:
        s = socket.create_connection((host, port), timeout=15)
        s.settimeout(15)
        if kind == "tls":
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            s = ctx.wrap_socket(s, server_hostname=name or None)
        elif kind == "http":
            head = "GET / HTTP/1.1\r\n" + (f"Host: {name}\r\n" if name else "") + "\r\n"
            s.sendall(head.encode())
        elif name:
            s.sendall(bytes.fromhex(name))
        data = b""
        while len(data) < 4096:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        s.close()
        if not data:
            return "closed"
        return data.decode(errors="replace").strip().splitlines()[-1]
    except socket.timeout:
        return "timeout"
    except ssl.SSLError as e:
        return "ssl:" + (e.reason or type(e).__name__)
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__

print(json.dumps([one(*t) for t in json.loads(sys.argv[1])]))
"""


def _certificate(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "podbay test host")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "named.crt", directory / "named.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


class NamedServers:
    def __init__(self, testhost_netns: Path, workdir: Path) -> None:
        def listen() -> tuple[socket.socket, socket.socket, socket.socket]:
            netns.enter(testhost_netns)
            made = []
            for port in (TLS_PORT, HTTP_PORT, ECHO_PORT):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("0.0.0.0", port))
                sock.listen(64)
                made.append(sock)
            return made[0], made[1], made[2]

        found: list[tuple[socket.socket, socket.socket, socket.socket]] = []
        netns.run_in_thread_now(lambda: found.append(listen()))
        self.tls_sock, self.http_sock, self.echo_sock = found[0]
        cert, key = _certificate(workdir)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.context.sni_callback = self._remember_sni
        #: Connections each server accepted (a cut one may never be accepted:
        #: the check connects while it reads, and resets on a refusal).
        self.answered: list[str] = []
        for target in (self._serve_tls, self._serve_http, self._serve_echo):
            threading.Thread(target=target, daemon=True).start()

    @staticmethod
    def _remember_sni(conn: ssl.SSLSocket, name: str | None, _: ssl.SSLContext) -> None:
        conn.podbay_sni = name  # type: ignore[attr-defined]

    def _serve_tls(self) -> None:
        self._accepting(self.tls_sock, self._tls_one)

    def _serve_http(self) -> None:
        self._accepting(self.http_sock, self._http_one)

    def _serve_echo(self) -> None:
        self._accepting(self.echo_sock, self._echo_one)

    @staticmethod
    def _echo_one(conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            while chunk := conn.recv(1 << 16):
                conn.sendall(chunk)

    @staticmethod
    def _accepting(sock: socket.socket, handle: object) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()  # type: ignore[arg-type]

    def _tls_one(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.settimeout(20)
            with self.context.wrap_socket(conn, server_side=True) as tls:
                answer = f"tls:{getattr(tls, 'podbay_sni', None) or ''}"
                self.answered.append(answer)
                tls.sendall(answer.encode() + b"\n")

    def _http_one(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.settimeout(20)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            host = ""
            for line in head.decode("latin-1").split("\r\n")[1:]:
                key, _, value = line.partition(":")
                if key.lower() == "host":
                    host = value.strip()
            answer = f"http:{host}"
            self.answered.append(answer)
            conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + answer.encode() + b"\n")

    def close(self) -> None:
        for sock in (self.tls_sock, self.http_sock, self.echo_sock):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
