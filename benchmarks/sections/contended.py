"""Section 4 — contended throughput: 4 processes x 2 threads hammer one lock, each critical
section a GET and a SET of a shared counter (a read-modify-write that loses updates unless
the lock is exclusive).

Reported: completed critical sections per second, lost updates (sections completed minus
the counter's final value: must be 0), and fairness across the 8 workers: min and max
sections per worker, Jain's index (1.0 = perfectly even; 0.125 = one worker got all) and
the longest single wait of any worker (one blocking ``acquire``, from call to return:
starvation shows there first).  There is no baton rule here: a releasing thread may re-take
the lock at once, as it would in an application.  With ``rounds`` > 1 the run is split into
rounds interleaved across libraries; throughput is pooled, fairness is the worst round.

``rlocks (fair=False)`` is rlocks built with ``fair=False`` (issue 12); until
``rlocks.RLock`` accepts that option its row says why it is unavailable.

``ref: BLPOP token`` is no library: the token of section 3 (acquire = BLPOP it, release =
LPUSH it back), under the same load. Redis answers blocked BLPOPs in arrival order, so it
is a strict-FIFO lock with nothing else to do: no script, lease, owner or re-entry, and
no safety (a holder that dies takes the token with it). Its row is the ceiling of a fair
lock's throughput here; it is context, not a peer, and no target compares with it.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List

from ..adapters import reference_adapters, variant_adapters
from ..harness import ChainOutcome, Context, merge, run_chain
from ..redisinfo import server_cpu_s
from ..stats import fmt_ns, fmt_num, jain, ratio, table
from ..workers import ChainConfig
from . import SectionResult, Target, ratio_target

KEY = "contended"
TITLE = "4. Contended throughput (4 processes x 2 threads, GET+SET counter in the lock)"
PROCS, THREADS = 4, 2
FAIR_JAIN = 0.95
UNFAIR = "rlocks (fair=False)"
#: a worker of ``fair=False`` may not fall below this share of the mean worker's sections
MIN_SHARE = 0.10
#: the prefix of a reference row (no library: never a peer)
REF = "ref:"


def min_share(counts: List[int]) -> float:
    """The slowest worker's sections as a share of the mean worker's (``nan`` if none)."""
    if not counts or sum(counts) == 0:
        return math.nan
    return min(counts) / (sum(counts) / len(counts))


def judge(data: Dict[str, Any], unfair_reason: Any = None) -> List[Target]:
    """Issue 12, target 2, from the section's per-library figures (``data[key]`` has
    ``ops_per_s``, ``jain_worst_round`` and ``min_share_worst_round``; a library missing
    from ``data`` was not measured).  Pure, so the self-check can test the verdicts."""
    out: List[Target] = []
    peers = {k: d for k, d in data.items() if not k.startswith(("rlocks", REF))
             and isinstance(d, dict) and d.get("ops")}
    rl = data.get("rlocks") if isinstance(data.get("rlocks"), dict) else None
    rl_ok = bool(rl and rl.get("ops"))
    j = rl["jain_worst_round"] if rl_ok else math.nan
    out.append(Target("contended: rlocks Jain over 8 workers (issue 12)",
                      f"{j:.3f}" if rl_ok else "-", f">= {FAIR_JAIN}",
                      None if not rl_ok or math.isnan(j) else j >= FAIR_JAIN))
    fair = {k: d for k, d in peers.items() if d["jain_worst_round"] >= FAIR_JAIN}
    what = "contended: rlocks throughput vs every fair peer (issue 12)"
    if not rl_ok:
        out.append(Target(what, "-", ">= 1x the best fair peer", None))
    elif not fair:
        out.append(Target(what, "no peer has Jain >= 0.95 in this run",
                          ">= 1x the best fair peer", True))
    else:
        best = max(fair, key=lambda k: fair[k]["ops_per_s"])
        out.append(ratio_target(what, ratio(rl["ops_per_s"], fair[best]["ops_per_s"]), 1.0,
                                "the best fair peer", at_least=True, note=best))
    u = data.get(UNFAIR) if isinstance(data.get(UNFAIR), dict) else None
    what = f"contended: {UNFAIR} throughput vs the best peer (issue 12)"
    what2 = f"contended: {UNFAIR} slowest worker vs the mean (issue 12)"
    if unfair_reason or not (u and u.get("ops")):
        why = f"unavailable: {unfair_reason}" if unfair_reason else "-"
        out.append(Target(what, why, ">= 1x the best peer", None))
        out.append(Target(what2, why, f">= {MIN_SHARE:.0%} of the mean", None))
        return out
    best = max(peers, key=lambda k: peers[k]["ops_per_s"]) if peers else None
    out.append(ratio_target(what, ratio(u["ops_per_s"], peers[best]["ops_per_s"])
                            if best else math.nan, 1.0, "the best peer", at_least=True,
                            note=best or "no peer measured"))
    share = u["min_share_worst_round"]
    out.append(Target(what2, "-" if math.isnan(share) else f"{share:.0%} of the mean",
                      f">= {MIN_SHARE:.0%} of the mean",
                      None if math.isnan(share) else share >= MIN_SHARE))
    return out


def run(ctx: Context) -> SectionResult:
    res = SectionResult(KEY, TITLE)
    p = ctx.params
    rounds: Dict[str, List[ChainOutcome]] = {}
    cpu: Dict[str, float] = {}  # the server's CPU seconds during each library's rounds
    variants = variant_adapters()
    refs = reference_adapters()
    libs = (ctx.available() + [v for v in variants if v.unavailable_reason() is None]
            + refs)
    for r in range(p.rounds):
        for a in ctx.order(libs, r):
            ctx.progress.step(f"{a.key} (round {r + 1}/{p.rounds})")
            cfg = ChainConfig(adapter=a.key, url=ctx.url, lock_name=ctx.name("cont", a.key),
                              threads=THREADS, counter_key=ctx.name("cont", a.key, "counter", r),
                              duration_s=p.contended_duration_s / p.rounds)
            before = server_cpu_s(ctx.client)
            rounds.setdefault(a.key, []).append(run_chain(ctx, cfg, procs=PROCS))
            cpu[a.key] = cpu.get(a.key, 0.0) + server_cpu_s(ctx.client) - before
    ping_s = ctx.ping_p50_ns / 1e9
    rows: List[List[Any]] = []
    for a in ctx.adapters[:1] + variants + ctx.adapters[1:] + refs:
        if a.key not in rounds:
            if a in variants:
                rows.append([a.key, f"unavailable: {a.unavailable_reason()}"] + [""] * 8)
            continue
        rs = rounds[a.key]
        o = merge(rs)
        jains = [jain(x.per_worker.values()) for x in rs if x.per_worker]
        worst = min(jains) if jains else math.nan
        shares = [min_share(list(x.per_worker.values())) for x in rs if x.per_worker]
        # per-worker rate, so rounds of different lengths compare
        rates = [n / x.span_s for x in rs if x.span_s and not math.isnan(x.span_s)
                 for n in x.per_worker.values()]
        dj = o.to_json()
        server_us = 1e6 * cpu[a.key] / o.ops if o.ops else math.nan
        dj.update({"jain_worst_round": worst, "server_cpu_us_per_op": server_us,
                   "min_share_worst_round": min(shares) if shares else math.nan,
                   "worker_ops_per_s_min": min(rates, default=math.nan),
                   "worker_ops_per_s_max": max(rates, default=math.nan)})
        res.data[a.key] = dj
        note = "; ".join(sorted(set(o.errors)))[:50] if o.errors else ""
        counts = list(o.per_worker.values())
        rows.append([a.key, fmt_num(o.throughput), fmt_num(o.throughput * ping_s, 3),
                     "-" if o.lost_updates is None else o.lost_updates,
                     f"{min(counts, default=0)}/{max(counts, default=0)}",
                     fmt_num(worst, 3), fmt_ns(dj["longest_wait_ns"]),
                     fmt_ns(server_us * 1000), o.timeouts, note])
    rows += ctx.unavailable_rows(10)
    res.lines = table(["library", "ops/s", "ops per PING", "lost", "sections min/max",
                       "Jain", "longest wait", "server CPU/op", "timeouts", "errors"], rows)
    res.lines.append("(ops per PING = ops/s x PING p50: 1.0 would be one critical section per "
                     "bare round trip; sections min/max per worker"
                     + (" and round" if p.rounds > 1 else "") + "; Jain: worst round; "
                     "longest wait: one acquire, call to return; server CPU/op: the Redis "
                     "server's CPU time per critical section, on a machine whose cores the "
                     "workers share with it)")
    d: Any = res.data.get("rlocks")
    if d and d["ops"]:
        per_ping = d["ops_per_s"] * ping_s
        ok = per_ping >= 0.25 and d["jain_worst_round"] >= 0.95 and d["lost_updates"] == 0
        res.targets.append(Target(
            "contended throughput, fairness, no lost updates",
            f"{per_ping:.3f} ops/PING, Jain {d['jain_worst_round']:.3f}, lost {d['lost_updates']}",
            ">= 0.25 ops/PING (1/(4 x PING) ops/s), Jain >= 0.95, lost 0", ok))
    else:
        res.targets.append(Target("contended throughput, fairness, no lost updates", "-",
                                  ">= 0.25 ops/PING, Jain >= 0.95, lost 0", None))
    res.targets += judge(res.data, variants[0].unavailable_reason())
    return res
