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
