"""Section 4 — contended throughput: 4 processes x 2 threads hammer one lock, each critical
section a GET and a SET of a shared counter (a read-modify-write that loses updates unless
the lock is exclusive).

Reported: completed critical sections per second, lost updates (sections completed minus
the counter's final value: must be 0), and fairness across the 8 workers: min and max
sections per worker and Jain's index (1.0 = perfectly even; 0.125 = one worker got all).
There is no baton rule here: a releasing thread may re-take the lock at once, as it would in
an application.  With ``rounds`` > 1 the run is split into rounds interleaved across
libraries; throughput is pooled, fairness is the worst round.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List

from ..harness import ChainOutcome, Context, merge, run_chain
from ..stats import fmt_num, jain, table
from ..workers import ChainConfig
from . import SectionResult, Target

KEY = "contended"
TITLE = "4. Contended throughput (4 processes x 2 threads, GET+SET counter in the lock)"
PROCS, THREADS = 4, 2


def run(ctx: Context) -> SectionResult:
    res = SectionResult(KEY, TITLE)
    p = ctx.params
    rounds: Dict[str, List[ChainOutcome]] = {}
    libs = ctx.available()
    for r in range(p.rounds):
        for a in ctx.order(libs, r):
            ctx.progress.step(f"{a.key} (round {r + 1}/{p.rounds})")
            cfg = ChainConfig(adapter=a.key, url=ctx.url, lock_name=ctx.name("cont", a.key),
                              threads=THREADS, counter_key=ctx.name("cont", a.key, "counter", r),
                              duration_s=p.contended_duration_s / p.rounds)
            rounds.setdefault(a.key, []).append(run_chain(ctx, cfg, procs=PROCS))
    ping_s = ctx.ping_p50_ns / 1e9
    rows: List[List[Any]] = []
    for a in ctx.adapters:
        if a.key not in rounds:
            continue
        rs = rounds[a.key]
        o = merge(rs)
        jains = [jain(x.per_worker.values()) for x in rs if x.per_worker]
        worst = min(jains) if jains else math.nan
        # per-worker rate, so rounds of different lengths compare
        rates = [n / x.span_s for x in rs if x.span_s and not math.isnan(x.span_s)
                 for n in x.per_worker.values()]
        dj = o.to_json()
        dj.update({"jain_worst_round": worst, "worker_ops_per_s_min": min(rates, default=math.nan),
                  "worker_ops_per_s_max": max(rates, default=math.nan)})
        res.data[a.key] = dj
        note = "; ".join(sorted(set(o.errors)))[:50] if o.errors else ""
        rows.append([a.key, fmt_num(o.throughput), fmt_num(o.throughput * ping_s, 3),
                     "-" if o.lost_updates is None else o.lost_updates,
                     fmt_num(dj["worker_ops_per_s_min"], 1), fmt_num(dj["worker_ops_per_s_max"], 1),
                     fmt_num(worst, 3), o.timeouts, note])
    rows += ctx.unavailable_rows(9)
    res.lines = table(["library", "ops/s", "ops per PING", "lost", "worker min/s",
                       "worker max/s", "Jain", "timeouts", "errors"], rows)
    res.lines.append("(ops per PING = ops/s x PING p50: 1.0 would be one critical section per "
                     "bare round trip)")
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
    return res
