"""TLS for ``manage.py serve --tls``: kubectl (client-go) sends a bearer token only over HTTPS, so the /k8s door
needs TLS end to end, or a TLS-terminating proxy in front (the usual production set-up: an Ingress).

Without ``TLS_CERTFILE``/``TLS_KEYFILE`` a self-signed certificate for localhost is made once with the
``openssl`` command under ``VAR_DIR/tls`` (development and tests); ``create_token --kubeconfig`` embeds it as
the kubeconfig's certificate authority, so kubectl verifies the server instead of skipping verification.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from django.conf import settings


def self_signed_paths() -> tuple[Path, Path]:
    folder = Path(settings.VAR_DIR) / "tls"
    return folder / "cert.pem", folder / "key.pem"


def certificate() -> tuple[str, str]:
    """(certfile, keyfile): the configured ones, else the self-signed pair (made when missing)."""
    cert, key = os.environ.get("TLS_CERTFILE"), os.environ.get("TLS_KEYFILE")
    if cert and key:
        return cert, key
    cert_path, key_path = self_signed_paths()
    if not (cert_path.exists() and key_path.exists()):
        if shutil.which("openssl") is None:
            raise RuntimeError("--tls without TLS_CERTFILE/TLS_KEYFILE needs the openssl command to make a "
                               "self-signed certificate")
        cert_path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "825",
                        "-keyout", str(key_path), "-out", str(cert_path), "-subj", "/CN=draservice",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                       check=True, capture_output=True)
        key_path.chmod(0o600)
    return str(cert_path), str(key_path)


# ------------------------------------------------------------------------------- HTTPS beside HTTP (make run)
#
# gunicorn serves TLS on every address it binds or on none. `make run` wants both: plain HTTP for the browser
# and curl, HTTPS for kubectl (which sends its token only over TLS). So gunicorn binds the plain port and a
# Unix socket; a small TLS terminator in the web process accepts on the HTTPS port and pipes each connection
# to that socket, and requests arriving on the socket are marked as HTTPS (``wsgi.url_scheme``) for Django.

PIPE_CHUNK = 64 * 1024


def kubeconfig_path() -> Path:
    return Path(settings.VAR_DIR) / "kubeconfig"


def upstream_socket() -> Path:
    return Path(settings.VAR_DIR) / "https-upstream.sock"


def behind_terminator(application):
    """The WSGI application, with requests that came through the TLS terminator's socket marked secure."""
    import socket

    def app(environ, start_response):
        sock = environ.get("gunicorn.socket")
        if sock is not None and sock.family == socket.AF_UNIX:
            environ["wsgi.url_scheme"] = "https"
            environ["HTTPS"] = "on"
        return application(environ, start_response)

    return app


def start_terminator(host: str, port: int, upstream: Path) -> None:
    """Accept TLS on ``host:port`` and pipe each connection to the Unix socket ``upstream`` (a daemon thread;
    several web processes share the port, SO_REUSEPORT)."""
    import asyncio
    import ssl
    import threading

    cert, key = certificate()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(PIPE_CHUNK):
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():  # the Unix side: half-close, the answer may still be on its way
                writer.write_eof()
                return
        except (ConnectionError, OSError, ssl.SSLError):
            pass
        writer.close()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(str(upstream))
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        up_writer.close()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(connection, host, port, ssl=context, reuse_port=True)
        async with server:
            await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(main()), name="tls-terminator", daemon=True).start()
