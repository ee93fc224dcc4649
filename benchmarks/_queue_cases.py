"""The scenarios of benchmarks/queue_scenarios.py (issue 30, "Done when"). Each states its expected numbers and
records met/MISSED figures on the ``World``; none raises on a miss (a scenario that cannot run at all raises).
"""
from __future__ import annotations

import time

from benchmarks._queue_world import World, mig_claim, queue_body

PASS_SECONDS = 5  # the beat sends the preemption pass this often (scheduler/schedule.py)


def notices_for(namespace: str, name: str) -> int:
    from queues.models import Preemption

    return Preemption.objects.filter(preemptor__namespace__name=namespace, preemptor__name=name).count()


def print_notices(namespace: str, name: str) -> None:
    """What a missed notice count consisted of: each notice's victim, state and times."""
    from queues.models import Preemption

    for p in Preemption.objects.filter(preemptor__namespace__name=namespace, preemptor__name=name) \
            .select_related("victim"):
        print(f"    notice {p.id}: victim {p.victim.name} {p.state} created {p.created_at:%H:%M:%S.%f} "
              f"finished {p.finished_at and f'{p.finished_at:%H:%M:%S.%f}'}", flush=True)


def victims_given_back(namespace: str, name: str) -> int:
    """Victims of the preemptor that got devices again (what was taken from them went back to them)."""
    from claims.models import ResourceClaim
    from queues.models import Preemption

    ids = Preemption.objects.filter(preemptor__namespace__name=namespace, preemptor__name=name).values("victim_id")
    return ResourceClaim.objects.filter(id__in=ids, phase="Allocated").count()


def devices_in_use() -> int:
    from claims.models import DeviceAllocation

    return DeviceAllocation.objects.filter(claim__phase="Allocated").count()


def reclaim_exact(w: World, want: int, grace: int = 1) -> None:
    """One 8-GPU node filled by 8 one-GPU claims of ``default`` (nominal 0: it borrows all 8). team-a (nominal
    8) asks for ``want`` GPUs in one claim. Expected: exactly ``want`` notices, the claim allocated, no victim
    allocated again, all 8 GPUs in use, and nothing more decided one pass later."""
    s = f"reclaim-{want}"
    w.reset([("h100", 1)], default_grace=grace)
    w.queue(queue_body("team-a", namespaces=["a"], gpus=8))
    for i in range(8):
        w.claim("ci", f"{s}-ci{i}")
    assert w.wait(lambda: w.allocated("ci") == 8, 30) is not None, "the borrower did not fill the node"
    w.claim("a", s, want)
    placed = w.wait(lambda: w.allocated("a") == 1, grace + 3 * PASS_SECONDS)
    time.sleep(0 if w.small else PASS_SECONDS + 1)  # one more pass: nothing more is decided
    w.equal(s, "notices", notices_for("a", s), want)
    w.equal(s, "preemptor allocated", placed is not None, True)
    w.equal(s, "victims allocated again", victims_given_back("a", s), 0)
    w.equal(s, "GPUs in use (of 8)", devices_in_use(), 8)


def reclaim_mig(w: World) -> None:
    """One A100 node: ``default`` holds all 8 GPUs whole (8 x 7g.80gb, all the MIG memory). team-m (80Gi of MIG
    memory, no device count) asks for two 3g.40gb. Expected: 1 notice (one GPU holds both), both allocated, 7
    of default's claims still allocated, no victim allocated again."""
    s = "reclaim-mig"
    w.reset([("a100-mig", 1)], default_grace=1)
    w.queue(queue_body("team-m", namespaces=["m"], quotas=[
        {"deviceClassName": "mig.nvidia.com", "counters": {"memory": {"nominal": "80Gi"}}}]))
    for i in range(8):
        w.claim("ci", f"{s}-w{i}", body=mig_claim(f"{s}-w{i}", "7g.80gb"))
    assert w.wait(lambda: w.allocated("ci") == 8, 30) is not None, "the borrower did not fill the node"
    # In one request, so that one pass sees both waiting: arriving apart, the first would be given the whole GPU
    # and the second a victim of its own (each victim serves one preemptor), and the figure would hang on timing.
    w.batch("m", [mig_claim(f"{s}-h{i}", "3g.40gb") for i in range(2)], track=True)
    placed = w.wait(lambda: w.allocated("m") == 2, 1 + 3 * PASS_SECONDS)
    time.sleep(0 if w.small else PASS_SECONDS + 1)
    notices = notices_for("m", f"{s}-h0") + notices_for("m", f"{s}-h1")
    w.equal(s, "notices", notices, 1)
    w.equal(s, "both allocated", placed is not None, True)
    w.equal(s, "default's claims still allocated", w.allocated("ci"), 7)


def reclaim_gang_victims(w: World) -> None:
    """Two 8-GPU nodes filled by two gangs of ``default`` (2 members x 4 GPUs each). team-a (nominal 8) asks for
    4 GPUs. Expected: the victims are one whole gang (a gang is one candidate): exactly 2 notices (its two
    member claims), the claim allocated, the other gang's 2 members still allocated."""
    s = "reclaim-gang"
    w.reset([("h100", 2)], default_grace=1)
    w.queue(queue_body("team-a", namespaces=["a"], gpus=8))
    for g in ("g1", "g2"):
        w.gang("ci", f"{s}-{g}", 2, 4)
    assert w.wait(lambda: w.allocated("ci") == 4, 40) is not None, "the gangs were not placed"
    w.claim("a", s, 4)
    placed = w.wait(lambda: w.allocated("a") == 1, 1 + 3 * PASS_SECONDS)
    time.sleep(0 if w.small else PASS_SECONDS + 1)
    w.equal(s, "notices", notices_for("a", s), 2)
    w.equal(s, "preemptor allocated", placed is not None, True)
    w.equal(s, "gang members still allocated", w.allocated("ci"), 2)
    if notices_for("a", s) != 2:
        print_notices("a", s)


def sample_max(namespace: str, seconds: float, peak: int = 0) -> int:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        peak = max(peak, World.allocated(namespace))
        time.sleep(0.05)
    return peak


def tree(w: World, lending: int | None, grace: int = 1) -> None:
    """``org`` {nominal 8, borrowingLimit 0} with children ``c1`` {4} and ``c2`` {4, lendingLimit ``lending``}
    on 16 GPUs (only the quotas block). c1 submits 8 one-GPU claims, then c2 its 4. Expected with
    ``lendingLimit: 0``: c1 never above 4, c2's 4 served within grace + 2 s, no notice. Without it (c2 lends):
    c1 takes 8, and c2's 4 are served within grace + 2 s by exactly 4 notices, c1 back at 4."""
    s = "tree-lending0" if lending == 0 else "tree-reclaim"
    w.reset([("h100", 2)])
    pre = {"preemption": {"graceSeconds": grace, "minRuntimeSeconds": 0}}
    w.queue(queue_body("org", gpus=8, borrowing=0),
            queue_body("c1", namespaces=["c1"], parent="org", gpus=4, **pre),
            queue_body("c2", namespaces=["c2"], parent="org", gpus=4, lending=lending, **pre))
    for i in range(8):
        w.claim("c1", f"{s}-c1-{i}")
    c1_target = 4 if lending == 0 else 8
    w.wait(lambda: w.allocated("c1") >= c1_target, 20)
    peak = sample_max("c1", 0.5 if w.small else 2.0)
    for i in range(4):
        w.claim("c2", f"{s}-c2-{i}")
    served = w.wait(lambda: w.allocated("c2") == 4, grace + 3 * PASS_SECONDS, step=0.05)
    peak = sample_max("c1", 0.5 if w.small else PASS_SECONDS + 1, peak)
    from queues.models import Preemption

    if lending == 0:
        w.equal(s, "c1's peak", peak, 4)
        w.equal(s, "notices", Preemption.objects.filter(victim__namespace__name="c1").count(), 0)
    else:
        w.equal(s, "c1 at the end", w.allocated("c1"), 4)
        if not w.equal(s, "notices", Preemption.objects.filter(victim__namespace__name="c1").count(), 4):
            for p in Preemption.objects.filter(victim__namespace__name="c1").select_related("victim", "preemptor"):
                print(f"    notice {p.id}: {p.victim.name} for {p.preemptor.name if p.preemptor else None} "
                      f"{p.state} created {p.created_at:%H:%M:%S.%f} "
                      f"finished {p.finished_at and f'{p.finished_at:%H:%M:%S.%f}'}", flush=True)
    w.at_most(s, "seconds until c2's 4 claims run", served, grace + 2)


def fair_share(w: World, weights: tuple[int, int]) -> None:
    """``fa`` and ``fb`` on 16 GPUs, nominal 0 each (everything they use is borrowed), fair-share preemption with
    both strategies and weights ``weights``. fa fills the fleet with 16 one-GPU claims, then fb submits 16.
    Expected: fb's part of the fleet converges to weight_b / (weight_a + weight_b) within 5 pp, and stays there
    for the rest of the window (``w.small``: 30 s, else 10 minutes) with no claim preempted twice."""
    s = f"fair-{weights[0]}to{weights[1]}"
    w.reset([("h100", 2)])
    strategies = {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]}
    pre = {"preemption": {"graceSeconds": 1, "minRuntimeSeconds": 0}}
    w.queue(queue_body("fa", namespaces=["fa"], gpus=0, weight=weights[0], fairSharing=strategies, **pre),
            queue_body("fb", namespaces=["fb"], gpus=0, weight=weights[1], fairSharing=strategies, **pre))
    from benchmarks._queue_world import gpu_claim

    w.batch("fa", [gpu_claim(f"{s}-a{i}") for i in range(16)], track=True)
    assert w.wait(lambda: w.allocated("fa") == 16, 30) is not None, "fa did not fill the fleet"
    w.batch("fb", [gpu_claim(f"{s}-b{i}") for i in range(16)], track=True)
    target = 100 * weights[1] / sum(weights)
    window = 30 if w.small else 600
    started = time.monotonic()
    converged = None
    while time.monotonic() - started < window:
        a, b = w.allocated("fa"), w.allocated("fb")
        if converged is None and a + b == 16 and abs(100 * b / 16 - target) <= 5:
            converged = time.monotonic() - started
        time.sleep(0.5)
    from queues.models import Preemption

    noticed = list(Preemption.objects.filter(victim__namespace__name__in=["fa", "fb"])
                   .values_list("victim_id", flat=True))
    b = w.allocated("fb")
    w.record(s, "fb's part of the 16 GPUs at the end (%)", round(100 * b / 16, 1),
             f"{target:.0f} +- 5", abs(100 * b / 16 - target) <= 5)
    w.equal(s, "GPUs in use", w.allocated("fa") + b, 16)
    if not w.equal(s, "claims preempted twice in the window", len(noticed) - len(set(noticed)), 0):
        for p in Preemption.objects.filter(victim__namespace__name__in=["fa", "fb"]).select_related(
                "victim", "preemptor"):
            print(f"    notice {p.id}: {p.victim.name} for {p.preemptor.name if p.preemptor else None} {p.state} "
                  f"at {p.created_at:%H:%M:%S.%f}", flush=True)
    w.at_most(s, "seconds until converged", converged, 3 * PASS_SECONDS + 5)
