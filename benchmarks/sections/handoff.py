"""Section 3 — cross-process hand-off latency, each library at its defaults.

Two spawned processes share one lock.  Whoever holds it keeps it for a random 2-12 ms (so a
polling waiter is caught at a random point of its sleep), stamps ``monotonic_ns`` and
releases; it then does not try again until the other process has taken the lock ("baton"
rule), so every acquisition is a hand-off to a waiter already blocked in ``acquire``.  The
hand-off latency is (waiter's acquire returned) - (holder's stamp just before release), both
on the system-wide monotonic clock.  Rounds are interleaved across libraries.

The ``ref: BLPOP token`` row is no library: a token passed through a Redis list (BLPOP to
take, LPUSH to give back), i.e. the cheapest Redis hand-off between two redis-py processes
on this machine.  It shows how much of a library's figure is the machine itself
(context: no target compares with it).

Target (issue 38): rlocks' hand-off p50 <= python-redis-lock's p50 of the same run.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List

from ..adapters import quorum_adapters, reference_adapters
from ..harness import ChainOutcome, Context, merge, run_chain
from ..stats import fmt_ns, fmt_ratio, ratio, summary, table
from ..workers import ChainConfig
from . import SectionResult, Target, ratio_target

#: the peer whose hand-off rlocks' must match (a waiter blocked in BLPOP, no polling)
PEER = "python-redis-lock"
KEY = "handoff"
TITLE = "3. Cross-process hand-off latency (2 processes, library defaults)"


def run(ctx: Context) -> SectionResult:
    res = SectionResult(KEY, TITLE)
    p = ctx.params
    rounds: Dict[str, List[ChainOutcome]] = {}
    refs = reference_adapters()
    quorum = quorum_adapters()  # issue 13: rlocks on a Quorum of 3 local masters
    libs = ctx.available() + [q for q in quorum if q.unavailable_reason() is None] + refs
    for r in range(p.rounds):
        for a in ctx.order(libs, r):
            ctx.progress.step(f"{a.key} (round {r + 1}/{p.rounds})")
            cfg = ChainConfig(adapter=a.key, url=ctx.url, lock_name=ctx.name("handoff", a.key),
                              baton=True, hold_ms=p.handoff_hold_ms,
                              duration_s=p.handoff_duration_s / p.rounds,
                              max_ops=p.handoff_max // p.rounds + 1)
            rounds.setdefault(a.key, []).append(run_chain(ctx, cfg, procs=2))
    ping = ctx.ping_p50_ns
    ref_key = refs[0].key if refs else None
    ref = summary(merge(rounds[ref_key]).handoff_ns) if ref_key in rounds else {}
    ref_p50, ref_p99 = ref.get("p50", math.nan), ref.get("p99", math.nan)
    if math.isnan(ref_p50):  # the interleaved reference failed: fall back to the floor's
        ref_p50, ref_p99 = ctx.blpop_p50_ns, ctx.blpop_p99_ns
    res.data["reference_p50_ns"] = ref_p50
    res.data["reference_p99_ns"] = ref_p99
    peer_p50 = summary(merge(rounds[PEER]).handoff_ns)["p50"] if PEER in rounds else math.nan
    rows: List[List[Any]] = []
    for a in ctx.adapters[:1] + quorum + ctx.adapters[1:] + refs:
        if a.key not in rounds:
            if a in quorum:
                rows.append([a.key, f"unavailable: {a.unavailable_reason()}"] + [""] * 8)
            continue
        o = merge(rounds[a.key])
        s = summary(o.handoff_ns)
        res.data[a.key] = {"defaults": a.defaults, **o.to_json()}
        note = "; ".join(sorted(set(o.errors)))[:60] if o.errors else ""
        rows.append([a.key, s["n"], fmt_ns(s["p50"]), fmt_ns(s["p99"]),
                     fmt_ratio(s["p50"], ping), fmt_ratio(s["p99"], ping),
                     fmt_ratio(s["p50"], ref_p50), fmt_ratio(s["p50"], peer_p50), o.timeouts,
                     note])
    rows += ctx.unavailable_rows(10)
    res.lines = table(["library", "n", "p50", "p99", "p50/PING", "p99/PING", "p50/ref",
                       f"p50/{PEER}", "timeouts", "errors"], rows)
    res.lines.append("")
    res.lines.append("defaults used:")
    for a in ctx.available() + quorum + refs:
        res.lines.append(f"  {a.key:<18} {a.defaults}")
    res.targets += handoff_targets(res.data.get("rlocks"), res.data.get(PEER))
    return res


def handoff_targets(rl: Any, peer: Any) -> List[Target]:
    """Issue 38, target 5 (first half): rlocks' hand-off p50 <= python-redis-lock's of the
    same run. ``rl`` and ``peer`` are the section's rows (``None``: not measured)."""
    def p50(d: Any) -> Any:
        ok = isinstance(d, dict) and d.get("handoff_ns", {}).get("n")
        return d["handoff_ns"]["p50"] if ok else None

    return [ratio_target(f"hand-off p50 vs {PEER} (issue 38)", ratio(p50(rl), p50(peer)), 1.0,
                         f"{PEER} p50")]
