"""The soak benchmark's moving parts: the fleet's shapes, the claim trace (open-loop submissions, leases and
explicit releases, selector churn) and the sampler of the worker's processes and of PostgreSQL.
See benchmarks/soak_bench.py for what is measured and why.
"""
from __future__ import annotations

import heapq
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks._live import Client

LEASE_TTL = "draservice.io/lease-ttl"
CLAIMS = "/api/v1/namespaces/{ns}/resourceclaims"
TEAMS = 4  # trace claims are spread over this many namespaces team-0 .. team-3


@dataclass(frozen=True)
class Shape:
    """One cluster of the fleet: one node type of the demo fleet, and what a 1-device claim on it asks for."""

    name: str
    node_type: str
    devices_per_node: int  # devices published per node (all drivers), what BENCH_DEVICES counts
    slots_per_node: int  # 1-device claims one node holds (MIG: 7 x 1g.10gb per GPU, by the shared counters)
    device_class: str
    selector: str


SHAPES = (
    Shape("h100", "h100", 10, 8, "gpu.nvidia.com",
          'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'),
    Shape("a100-mig", "a100-mig", 200, 56, "mig.nvidia.com",
          'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'),
    Shape("l4", "l4", 4, 4, "gpu.nvidia.com", 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA L4"'),
    Shape("mi300x", "mi300x", 8, 8, "gpu.amd.com",
          'device.attributes["gpu.amd.com"].productName == "AMD_Instinct_MI300X_OAM"'),
)


def selector_text(shape: Shape, text_id: int) -> str:
    """A distinct selector text per id that still matches every device of the shape (a CI pipeline's commit id
    in an always-true clause, as real pipelines template them)."""
    return f'{shape.selector} && "commit-{(text_id * 2654435761) % 2**32:08x}" != ""'


def claim(name: str, shape: Shape, text_id: int | None, count: int = 1, lease_s: int | None = None) -> dict:
    selector = shape.selector if text_id is None else selector_text(shape, text_id)
    meta: dict = {"name": name}
    if lease_s is not None:
        meta["annotations"] = {LEASE_TTL: f"{max(5, lease_s)}s"}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": shape.device_class, "count": count,
                "selectors": [{"cel": {"expression": selector}}]}}]}}}


@dataclass
class Trace:
    """Which shape and selector text the next claim gets, and how long it lives.

    Shapes are picked in proportion to their slots, so one lifetime keeps every cluster equally full. Texts:
    ``texts`` distinct ones in all; at any moment claims draw from a window of ``live`` consecutive ids that
    slides over all of them during ``horizon`` seconds (so old texts fall out of use, as commits do)."""

    slots: dict[str, int]
    texts: int = 10_000
    live: int = 1_000
    horizon: float = 600.0
    rng: random.Random = field(default_factory=lambda: random.Random(14))

    def pick(self, elapsed: float) -> tuple[Shape, int]:
        index = self.rng.choices(range(len(SHAPES)), weights=[self.slots[s.name] for s in SHAPES])[0]
        start = int((self.texts - self.live) * min(1.0, elapsed / self.horizon))
        start -= start % len(SHAPES)
        text = (start + len(SHAPES) * self.rng.randrange(self.live // len(SHAPES)) + index) % self.texts
        return SHAPES[index], text


class Driver:
    """Submits the trace's claims open-loop at a rate (one POST each, from a pool of keep-alive clients) and
    ends them: half by their lease (``draservice.io/lease-ttl``, expired by the service's beat task), half by
    an explicit ``POST …/release`` when their time is up. Lifetimes are scaled by ``factor``, which the
    sampler moves to keep the fleet near ``fill`` (70-90 % full)."""

    def __init__(self, port: int, token: str, trace: Trace, total_slots: int, fill: float, clients: int):
        self.port, self.token, self.trace = port, token, trace
        self.total_slots, self.fill = total_slots, fill
        self.pool = ThreadPoolExecutor(max_workers=clients)
        self.local = threading.local()
        self.releases: list[tuple[float, str, str]] = []  # (monotonic due, namespace, name), a heap
        self.lock = threading.Lock()
        self.seq = 0
        self.factor = 1.0
        self.errors: dict[str, int] = {}
        self.sent = {"claims": 0, "releases": 0}
        self.prefilled_at: float | None = None  # when prefill() scheduled its releases (monotonic)

    def _client(self) -> Client:
        client = getattr(self.local, "client", None)
        if client is None:
            client = self.local.client = Client(self.port, self.token)
        return client

    def _call(self, kind: str, path: str, body: dict | None, ok: int) -> None:
        try:
            status, _ = self._client().call("POST", path, body if body is not None else {})
        except OSError:
            status = 0
        with self.lock:
            self.sent[kind] += 1
            if status != ok:
                key = f"{kind} {status}"
                self.errors[key] = self.errors.get(key, 0) + 1

    def lifetime(self, rate: float) -> float:
        """Mean lifetime that holds ``fill`` of the slots at ``rate`` (Little's law), times the correction."""
        return self.fill * self.total_slots / rate * self.factor

    def next_claim(self, elapsed: float, remaining: float, prefill: bool = False) -> tuple[str, dict, float]:
        """(namespace, claim, explicit release in seconds or 0) of the next claim; ``remaining``: its life.
        Prefill claims (the jobs running when the soak starts) use the shape's plain selector: placing 80 % of
        the fleet with a fresh text each would cost the setup minutes that the soak itself then measures."""
        shape, text = self.trace.pick(elapsed)
        self.seq += 1
        ns, name = f"team-{self.seq % TEAMS}", f"c-{self.seq}"
        if prefill:
            return ns, claim(name, shape, None), remaining
        if self.seq % 2:
            return ns, claim(name, shape, text), remaining
        return ns, claim(name, shape, text, lease_s=int(remaining)), 0.0

    def schedule_release(self, due: float, ns: str, name: str) -> None:
        heapq.heappush(self.releases, (due, ns, name))

    def residual_life(self, mean: float) -> float:
        """A running claim's time left in the steady state of the soak's lifetimes (uniform on 0.5-1.5 x
        ``mean``): density proportional to the chance that a lifetime is longer. With the prefill's releases so
        drawn, they and the soak's own add up to the submission rate from the first second. Drawn uniform over
        one lifetime instead, they came too early: with the soak's first releases they freed a tenth of the
        fleet by minute 4, the lifetime steering lengthened the lifetimes of the claims sent then, and the fleet
        overfilled to 99.9 % in minutes 6-8 (claims waited for releases: p99 in tens of seconds)."""
        rng = self.trace.rng
        while True:
            left = rng.uniform(0.0, 1.5 * mean)
            if rng.random() < min(1.0, (1.5 * mean - left) / mean):
                return max(1.0, left)

    def prefill(self, count: int, rate: float, batch: int = 100) -> None:
        """``count`` claims through the batch endpoint, released explicitly as the steady state would release
        them (``residual_life``), so releases run at the submission rate at once. Waits for the POSTs only."""
        now = time.monotonic()
        span = self.lifetime(rate)
        items: dict[str, list[dict]] = {}
        for _ in range(count):
            left = self.residual_life(span)
            ns, body, _ = self.next_claim(0.0, left, prefill=True)
            items.setdefault(ns, []).append(body)
            self.schedule_release(now + left, ns, body["metadata"]["name"])
        futures = [self.pool.submit(self._call, "claims", CLAIMS.format(ns=ns) + "/batch",
                                    {"items": bodies[i:i + batch]}, 201)
                   for ns, bodies in items.items() for i in range(0, len(bodies), batch)]
        for f in futures:
            f.result()
        self.prefilled_at = now

    def run(self, rate: float, seconds: float, elapsed0: float = 0.0) -> dict:
        """Submit at ``rate`` for ``seconds``; due releases are sent meanwhile. ``elapsed0``: the trace's clock
        at the start (for the selector window). Returns what was sent and the largest client backlog."""
        start = time.monotonic()
        if self.prefilled_at is not None:
            # The prefill's releases are spread over one lifetime from the soak's start, not from the prefill's:
            # the prefill and the wait for its rounds take minutes, and releases falling due during them would
            # reach the web all at once when the soak starts, ahead of its claims (an artefact that made the
            # first minute place nothing).
            shift = start - self.prefilled_at
            self.releases = [(due + shift, ns, name) for due, ns, name in self.releases]
            heapq.heapify(self.releases)
            self.prefilled_at = None
        submitted, backlog = 0, 0
        while True:
            now = time.monotonic()
            if now - start >= seconds:
                break
            while self.releases and self.releases[0][0] <= now:
                _, ns, name = heapq.heappop(self.releases)
                self.pool.submit(self._call, "releases", f"{CLAIMS.format(ns=ns)}/{name}/release", None, 200)
            while submitted < int((now - start) * rate):
                life = self.lifetime(rate) * self.trace.rng.uniform(0.5, 1.5)
                ns, body, explicit = self.next_claim(elapsed0 + now - start, life)
                if explicit:
                    self.schedule_release(now + explicit, ns, body["metadata"]["name"])
                self.pool.submit(self._call, "claims", CLAIMS.format(ns=ns), body, 201)
                submitted += 1
            backlog = max(backlog, self.pool._work_queue.qsize())
            time.sleep(0.005)
        return {"submitted": submitted, "max_client_backlog": backlog}

    def stop(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------------------------------------------ sampling

def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    kids = [int(p) for p in text.split()]
    return kids + [k for c in kids for k in _children(c)]


def process_tree(pid: int) -> list[int]:
    return [pid, *_children(pid)]


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process and of its children already reaped."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    at: float  # unix time
    worker_rss_mb: float  # all worker processes
    worker_max_rss_mb: float  # the largest one (a pool child holds the engine)
    worker_cpu_s: float
    web_cpu_s: float
    allocated: int  # claims holding devices, fleet-wide
    held: int  # ... plus the pending ones: what the fleet will hold once the worker catches up
    load: float = 0.0  # the machine's 1-minute load average (other tenants of this machine included)


class Sampler(threading.Thread):
    """Every ``every`` seconds: the worker's and the web server's processes (RSS, CPU) and the fleet's
    fullness. Also corrects the driver's lifetimes toward its fill target."""

    def __init__(self, stack, db_name: str, driver: Driver | None = None, every: float = 5.0):
        super().__init__(daemon=True)
        self.stack, self.db_name, self.driver, self.every = stack, db_name, driver, every
        self.samples: list[Sample] = []
        self.halt = threading.Event()

    def sample(self) -> Sample:
        from claims.models import ResourceClaim

        worker = process_tree(self.stack.pid("worker")) if "worker" in self.stack.procs else []
        rss = [rss_mb(p) for p in worker]
        return Sample(at=time.time(), worker_rss_mb=sum(rss), worker_max_rss_mb=max(rss, default=0.0),
                      worker_cpu_s=sum(cpu_seconds(p) for p in worker),
                      web_cpu_s=sum(cpu_seconds(p) for p in process_tree(self.stack.pid("web"))),
                      allocated=ResourceClaim.objects.filter(phase="Allocated").count(),
                      held=ResourceClaim.objects.filter(phase__in=["Allocated", "Pending"]).count(),
                      load=os.getloadavg()[0])

    def run(self) -> None:
        from django.db import connection

        while not self.halt.is_set():
            s = self.sample()
            self.samples.append(s)
            self.steer(s)
            self.halt.wait(self.every)
        connection.close()

    def steer(self, s: Sample) -> None:
        """Lifetimes x (target / claims held), damped and bounded: leases are fixed at submission, so a
        correction acts one lifetime later; a strong one would overshoot. Pending claims count as held: steering
        on the allocated ones alone lengthens lifetimes while the worker lags, and the fleet then overfills."""
        if self.driver is None or not self.driver.total_slots:
            return
        full = max(0.05, s.held / self.driver.total_slots)
        want = min(2.0, max(0.5, self.driver.fill / full))
        self.driver.factor = min(2.0, max(0.5, self.driver.factor * want ** 0.25))

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


def gc_pauses(path: Path) -> list[tuple[float, int, int, float, float]]:
    """(unix time, pid, generation, wall ms, CPU ms) of the worker's collections of 1 ms or more
    (draservice/celery.py)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 5:
            out.append((float(parts[0]), int(parts[1]), int(parts[2]), float(parts[3]), float(parts[4])))
    return out
