"""``python -m agent`` / ``draservice-agent``: command line and environment, logging, signals."""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time

from agent import __version__, metrics
from agent.kube import KubeClient
from agent.runner import Agent, Settings
from agent.service import ServiceClient, TokenSource

log = logging.getLogger("agent")


def _env(name: str, default=None):
    value = os.environ.get(name)
    return default if value in (None, "") else value


def build_parser() -> argparse.ArgumentParser:
    # Numeric defaults stay strings: argparse converts them with `type`, so a bad value in the environment is
    # a one-line usage error ("invalid float value"), not a traceback while the parser is being built.
    p = argparse.ArgumentParser(
        prog="draservice-agent",
        description="Sync a Kubernetes cluster's DRA inventory to draservice and write allocations back. "
                    "Every option can also be set by the environment variable shown.")
    p.add_argument("--service-url", default=_env("DRASERVICE_URL"), help="draservice base URL [DRASERVICE_URL]")
    p.add_argument("--cluster", default=_env("DRASERVICE_CLUSTER"),
                   help="this cluster's name in the service [DRASERVICE_CLUSTER]")
    p.add_argument("--token-file", default=_env("DRASERVICE_TOKEN_FILE"),
                   help="file holding the cluster token, re-read when it changes [DRASERVICE_TOKEN_FILE]; "
                        "or put the token itself in DRASERVICE_TOKEN (never on the command line)")
    p.add_argument("--ca-file", default=_env("DRASERVICE_CA_FILE"),
                   help="CA bundle for the service's TLS certificate [DRASERVICE_CA_FILE]")
    p.add_argument("--kubeconfig", default=_env("KUBECONFIG"),
                   help="kubeconfig path; in a pod the service account is used when unset [KUBECONFIG]")
    p.add_argument("--context", default=_env("DRASERVICE_KUBE_CONTEXT"), help="kubeconfig context")
    p.add_argument("--resync-period", type=float, default=_env("DRASERVICE_RESYNC_PERIOD", "600"),
                   help="seconds between full syncs [DRASERVICE_RESYNC_PERIOD, 600]")
    p.add_argument("--heartbeat-interval", type=float, default=_env("DRASERVICE_HEARTBEAT_INTERVAL", "10"),
                   help="seconds between heartbeats [DRASERVICE_HEARTBEAT_INTERVAL, 10]")
    p.add_argument("--watch-timeout", type=int, default=_env("DRASERVICE_WATCH_TIMEOUT", "300"),
                   help="server-side watch timeout in seconds [DRASERVICE_WATCH_TIMEOUT, 300]")
    p.add_argument("--claim-poll-interval", type=float, default=_env("DRASERVICE_CLAIM_POLL_INTERVAL", "2"),
                   help="seconds between checks of pending claims in the service [DRASERVICE_CLAIM_POLL_INTERVAL, 2]")
    p.add_argument("--no-claims", action="store_true", default=_env("DRASERVICE_NO_CLAIMS", "") in ("1", "true"),
                   help="inventory only: do not mirror ResourceClaims or write allocations [DRASERVICE_NO_CLAIMS]")
    p.add_argument("--metrics-port", type=int, default=_env("DRASERVICE_METRICS_PORT", "0"),
                   help="serve Prometheus metrics on this port; 0 = off [DRASERVICE_METRICS_PORT]")
    p.add_argument("--metrics-address", default=_env("DRASERVICE_METRICS_ADDRESS", "0.0.0.0"))
    p.add_argument("--log-level", default=_env("DRASERVICE_LOG_LEVEL", "INFO"), help="[DRASERVICE_LOG_LEVEL, INFO]")
    p.add_argument("--log-format", choices=("text", "json"), default=_env("DRASERVICE_LOG_FORMAT", "text"),
                   help="[DRASERVICE_LOG_FORMAT, text]")
    p.add_argument("--once", action="store_true",
                   help="push one full sync and exit (0 when the service accepted it within --once-timeout): "
                        "a first check of a set-up")
    p.add_argument("--once-timeout", type=float, default=60.0, help="seconds --once waits (60)")
    p.add_argument("--version", action="version", version=f"draservice-agent {__version__}")
    return p


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The client libraries log every request at DEBUG; keep them at INFO unless asked for.
    for noisy in ("urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, root.level))


class ConfigError(Exception):
    """A configuration the agent cannot start with: reported as one line, exit status 2 (as argparse does)."""


def _connect(args) -> tuple[ServiceClient, KubeClient]:
    missing = [flag for flag, value in (("--service-url", args.service_url), ("--cluster", args.cluster))
               if not value]
    token = _env("DRASERVICE_TOKEN")
    if not token and not args.token_file:
        missing.append("DRASERVICE_TOKEN or --token-file")
    if missing:
        raise ConfigError(f"missing configuration: {', '.join(missing)}")
    # Files are checked now: later they would only show up as retried failures deep in the sync loop.
    for flag, path in (("--token-file", args.token_file), ("--ca-file", args.ca_file)):
        if path and not os.path.isfile(path):
            raise ConfigError(f"{flag} {path}: no such file")
    service = ServiceClient(args.service_url, args.cluster, TokenSource(token=token, path=args.token_file),
                            ca_certs=args.ca_file, user_agent=f"draservice-agent/{__version__}")
    return service, _kube_client(args)


def _kube_client(args) -> KubeClient:
    from kubernetes.config.config_exception import ConfigException
    from yaml import YAMLError

    if args.kubeconfig:
        where = args.kubeconfig
        # KUBECONFIG may list several files; the client library would call a missing one "no configuration".
        for path in args.kubeconfig.split(os.pathsep):
            if path and not os.path.isfile(os.path.expanduser(path)):
                raise ConfigError(f"kubeconfig {path}: no such file (--kubeconfig / KUBECONFIG)")
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        where = "the pod's service account"
    else:
        where = "~/.kube/config (no --kubeconfig, no KUBECONFIG, not in a pod)"
    try:
        return KubeClient.from_environment(args.kubeconfig, args.context)
    except (ConfigException, OSError, ValueError, TypeError, YAMLError) as exc:
        reason = " ".join(str(exc).split())  # YAML errors span lines: keep the report to one
        raise ConfigError(f"no usable Kubernetes credentials from {where}: {reason}") from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not isinstance(logging.getLevelName(args.log_level.upper()), int):
        parser.error(f"--log-level: unknown level {args.log_level!r}")
    configure_logging(args.log_level, args.log_format)
    try:
        service, kube = _connect(args)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    settings = Settings(resync_period=args.resync_period, heartbeat_interval=args.heartbeat_interval,
                        watch_timeout=args.watch_timeout, claims=not args.no_claims,
                        claim_poll_interval=args.claim_poll_interval)
    agent = Agent(kube, service, settings)
    if args.once:
        ok = agent.run_once(timeout=args.once_timeout)
        log.info("one-shot sync %s", "accepted by the service" if ok else "did NOT complete")
        return 0 if ok else 1
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_address)

    def shutdown(signum, _frame):
        log.info("received %s: stopping", signal.Signals(signum).name)
        agent.stop_event.set()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    agent.start()
    while not agent.stop_event.wait(1.0):
        pass
    agent.stop()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
