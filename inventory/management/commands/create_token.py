"""Print a new bearer token's secret, once. For operators and scripts.

    python manage.py create_token --admin
    python manage.py create_token --cluster eu-west-1 --expires 30d
    python manage.py create_token --namespace team-a --namespace team-b --read-only
"""
import base64
import os
from pathlib import Path

import yaml
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from dra.k8s.fields import is_dns_label
from draservice.models import APIToken
from draservice.tls import self_signed_paths
from draservice.tokens import issue_token, parse_duration
from inventory.models import Cluster


class Command(BaseCommand):
    help = "Create an API token and print its secret (shown only this once)."

    def add_arguments(self, parser):
        kind = parser.add_mutually_exclusive_group(required=True)
        kind.add_argument("--admin", action="store_true", help="manages clusters and DeviceClasses")
        kind.add_argument("--cluster", metavar="NAME", help="an agent token: writes only this cluster's inventory")
        kind.add_argument("--namespace", metavar="NS", action="append",
                          help="a tenant token for these namespaces (repeatable)")
        parser.add_argument("--read-only", action="store_true")
        parser.add_argument("--expires", metavar="DURATION", help="e.g. 12h, 7d, 2w (default: never)")
        parser.add_argument("--name", default="", help="a label to recognise the token by")
        parser.add_argument("--kubeconfig", nargs="?", const="https://127.0.0.1:8000/k8s", metavar="SERVER",
                            help="print a kubeconfig for the /k8s door instead of the bare secret (SERVER: the "
                                 "door's URL, default https://127.0.0.1:8000/k8s; the self-signed certificate of "
                                 "`serve --tls`, if any, is embedded as its certificate authority)")
        parser.add_argument("--create-cluster", action="store_true",
                            help="with --cluster: register the cluster if it does not exist yet")

    def handle(self, *args, **opts):
        try:
            expires_in = parse_duration(opts["expires"]) if opts["expires"] else None
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        cluster = None
        with transaction.atomic():
            if opts["cluster"]:
                kind = APIToken.CLUSTER
                cluster = Cluster.objects.filter(name=opts["cluster"]).first()
                if cluster is None:
                    if not opts["create_cluster"]:
                        raise CommandError(
                            f"no cluster named {opts['cluster']!r} (add --create-cluster to register it)")
                    from inventory.services.clusters import create_cluster

                    cluster, _ = create_cluster(name=opts["cluster"], labels={}, with_token=False)
            elif opts["namespace"]:
                kind = APIToken.NAMESPACE
                bad = [ns for ns in opts["namespace"] if not is_dns_label(ns)]
                if bad:
                    raise CommandError(f"not a valid namespace name (DNS label): {', '.join(bad)}")
            else:
                kind = APIToken.ADMIN
            token, secret = issue_token(kind=kind, name=opts["name"], cluster=cluster, namespaces=opts["namespace"],
                                        read_only=opts["read_only"], expires_in=expires_in)
        self.stderr.write(f"Created {token.kind} token {token.name!r} (id {token.pk}"
                          + (f", expires {token.expires_at.isoformat()}" if token.expires_at else "")
                          + "). The secret is shown only once:")
        if opts["kubeconfig"]:
            namespace = (opts["namespace"] or ["default"])[0]
            self.stdout.write(kubeconfig(opts["kubeconfig"], secret, namespace))
        else:
            self.stdout.write(secret)


def kubeconfig(server: str, secret: str, namespace: str) -> str:
    """A kubeconfig (YAML) for kubectl against the /k8s door with this token."""
    cluster: dict = {"server": server}
    cert = self_signed_paths()[0]
    if os.environ.get("TLS_CERTFILE"):
        cert = Path(os.environ["TLS_CERTFILE"])
    if server.startswith("https://") and cert.exists():
        cluster["certificate-authority-data"] = base64.b64encode(cert.read_bytes()).decode()
    config = {"apiVersion": "v1", "kind": "Config", "clusters": [{"name": "draservice", "cluster": cluster}],
              "users": [{"name": "draservice", "user": {"token": secret}}],
              "contexts": [{"name": "draservice", "context": {"cluster": "draservice", "user": "draservice",
                                                             "namespace": namespace}}],
              "current-context": "draservice"}
    return yaml.safe_dump(config, sort_keys=False)
