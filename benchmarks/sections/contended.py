"""Section 4 — contended throughput: 4 processes x 2 threads hammer one lock, each critical
section a GET and a SET of a shared counter (a read-modify-write that loses updates unless
the lock is exclusive).

Every library is run ``contended_runs`` (3) times, the runs interleaved across libraries in
a rotating order; every figure is the MEDIAN of its runs, printed with the runs' own
values (a contended run on a 2-core machine swings by more than the targets' margins, so
one run settles nothing). Per run: completed critical sections per second, lost updates
(sections completed minus the counter's final value: must be 0), and fairness across the
8 workers: min and max sections per worker, Jain's index (1.0 = perfectly even; 0.125 = one
worker got all), the slowest worker's share of the mean worker's sections, and the
longest single wait of any worker (one blocking ``acquire``, from call to return:
starvation shows there first). There is no baton rule here: a releasing thread may re-take
the lock at once, as it would in an application.

``rlocks (fair=False)`` is rlocks built with ``fair=False``.

``ref: BLPOP token`` is no library: the token of section 3 (acquire = BLPOP it, release =
LPUSH it back), under the same load. Redis answers blocked BLPOPs in arrival order, so it
is a strict-FIFO lock with nothing else to do: no script, lease, owner or re-entry, and
no safety (a holder that dies takes the token with it). Its row is the ceiling of a fair
lock's throughput here; it is context, not a peer, and no target compares with it.

Targets (issue 38), from the medians: the fair default's throughput >= the best fair
peer's (a peer whose median Jain is >= 0.95; python-redis-lock in practice) with its own
Jain >= 0.95; ``fair=False`` >= 0.95x the best peer's throughput (any Jain; redis-py in
practice) with no worker below 10 % of the mean worker's sections; and no lost update in
any run of an rlocks row.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Sequence

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
#: fair=False's throughput against the best peer's
UNFAIR_RATIO = 0.95
#: a worker of ``fair=False`` may not fall below this share of the mean worker's sections
MIN_SHARE = 0.10
#: the prefix of a reference row (no library: never a peer)
REF = "ref:"


def min_share(counts: List[int]) -> float:
    """The slowest worker's sections as a share of the mean worker's (``nan`` if none)."""
    if not counts or sum(counts) == 0:
        return math.nan
    return min(counts) / (sum(counts) / len(counts))


def median_of(values: Sequence[float]) -> float:
    """The median of the runs' figures that were measured (``nan`` if none was)."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(vals) if vals else math.nan


def runs_figures(outcomes: Sequence[ChainOutcome]) -> Dict[str, Any]:
    """Per-run throughput, Jain and slowest worker's share, and their medians (pure)."""
    tp = [o.throughput for o in outcomes]
    js = [jain(o.per_worker.values()) if o.per_worker else math.nan for o in outcomes]
    sh = [min_share(list(o.per_worker.values())) for o in outcomes]
    return {"ops_per_s_runs": tp, "ops_per_s": median_of(tp),
            "jain_runs": js, "jain": median_of(js),
            "min_share_runs": sh, "min_share": median_of(sh),
            "lost_updates_runs": [o.lost_updates for o in outcomes]}


def _runs(d: Dict[str, Any], key: str, fmt: str) -> str:
    vals = d.get(key) or []
    return " / ".join("-" if v is None or math.isnan(v) else format(v, fmt) for v in vals)


def judge(data: Dict[str, Any], unfair_reason: Any = None) -> List[Target]:
    """Issue 38, target 4, from the section's per-library figures (``data[key]`` as
    :func:`runs_figures` gives them, plus ``ops``; a library missing from ``data`` was not
    measured). Pure, so the self-check can test the verdicts."""
    out: List[Target] = []
    peers = {k: d for k, d in data.items() if not k.startswith(("rlocks", REF))
             and isinstance(d, dict) and d.get("ops")}
    rl = data.get("rlocks") if isinstance(data.get("rlocks"), dict) else None
    rl_ok = bool(rl and rl.get("ops"))
    fair = {k: d for k, d in peers.items() if d["jain"] >= FAIR_JAIN}
    what = "contended (fair): throughput vs the best fair peer, median of runs (issue 38)"
    goal = f">= 1x the best fair peer (Jain >= {FAIR_JAIN})"
    if not rl_ok:
        out.append(Target(what, "-", goal, None))
    elif not fair:
        out.append(Target(what, f"no peer has Jain >= {FAIR_JAIN} in this run", goal, True))
    else:
        best = max(fair, key=lambda k: fair[k]["ops_per_s"])
        out.append(ratio_target(
            what, ratio(rl["ops_per_s"], fair[best]["ops_per_s"]), 1.0, "the best fair peer",
            at_least=True, note=f"{best}; {fmt_num(rl['ops_per_s'])} vs "
                                f"{fmt_num(fair[best]['ops_per_s'])}/s; runs "
                                f"{_runs(rl, 'ops_per_s_runs', ',.0f')} vs "
                                f"{_runs(fair[best], 'ops_per_s_runs', ',.0f')}"))
    j = rl["jain"] if rl_ok else math.nan
    out.append(Target("contended (fair): Jain over 8 workers, median of runs (issue 38)",
                      f"{j:.3f} (runs {_runs(rl, 'jain_runs', '.3f')})" if rl_ok and
                      not math.isnan(j) else "-", f">= {FAIR_JAIN}",
                      None if not rl_ok or math.isnan(j) else j >= FAIR_JAIN))
    u = data.get(UNFAIR) if isinstance(data.get(UNFAIR), dict) else None
    what = f"contended {UNFAIR}: throughput vs the best peer, median of runs (issue 38)"
    what2 = f"contended {UNFAIR}: slowest worker vs the mean, median of runs (issue 38)"
    if unfair_reason or not (u and u.get("ops")):
        why = f"unavailable: {unfair_reason}" if unfair_reason else "-"
        out.append(Target(what, why, f">= {UNFAIR_RATIO:g}x the best peer", None))
        out.append(Target(what2, why, f">= {MIN_SHARE:.0%} of the mean", None))
    else:
        best = max(peers, key=lambda k: peers[k]["ops_per_s"]) if peers else None
        note = (f"{best}; {fmt_num(u['ops_per_s'])} vs {fmt_num(peers[best]['ops_per_s'])}/s; "
                f"runs {_runs(u, 'ops_per_s_runs', ',.0f')} vs "
                f"{_runs(peers[best], 'ops_per_s_runs', ',.0f')}" if best
                else "no peer measured")
        out.append(ratio_target(what, ratio(u["ops_per_s"], peers[best]["ops_per_s"])
                                if best else math.nan, UNFAIR_RATIO, "the best peer",
                                at_least=True, note=note))
        share = u["min_share"]
        out.append(Target(what2, "-" if math.isnan(share) else
                          f"{share:.0%} of the mean (runs {_runs(u, 'min_share_runs', '.0%')})",
                          f">= {MIN_SHARE:.0%} of the mean",
                          None if math.isnan(share) else share >= MIN_SHARE))
    mine = {k: d for k, d in data.items() if k.startswith("rlocks") and isinstance(d, dict)
            and d.get("ops")}
    lost = {k: sum(x or 0 for x in d.get("lost_updates_runs", [])) for k, d in mine.items()}
    out.append(Target("contended: lost updates, every run of the rlocks rows",
                      ", ".join(f"{k} {v}" for k, v in lost.items()) or "-", "0",
                      None if not lost else not any(lost.values())))
    return out


def run(ctx: Context) -> SectionResult:
    res = SectionResult(KEY, TITLE)
    p = ctx.params
    runs: Dict[str, List[ChainOutcome]] = {}
    cpu: Dict[str, float] = {}  # the server's CPU seconds during each library's runs
    variants = variant_adapters()
    refs = reference_adapters()
    libs = (ctx.available() + [v for v in variants if v.unavailable_reason() is None]
            + refs)
    n_runs = p.contended_runs
    for r in range(n_runs):
        for a in ctx.order(libs, r):
            ctx.progress.step(f"{a.key} (run {r + 1}/{n_runs})")
            cfg = ChainConfig(adapter=a.key, url=ctx.url, lock_name=ctx.name("cont", a.key),
                              threads=THREADS, counter_key=ctx.name("cont", a.key, "counter", r),
                              duration_s=p.contended_duration_s)
            before = server_cpu_s(ctx.client)
            runs.setdefault(a.key, []).append(run_chain(ctx, cfg, procs=PROCS))
            cpu[a.key] = cpu.get(a.key, 0.0) + server_cpu_s(ctx.client) - before
    ping_s = ctx.ping_p50_ns / 1e9
    rows: List[List[Any]] = []
    for a in ctx.adapters[:1] + variants + ctx.adapters[1:] + refs:
        if a.key not in runs:
            if a in variants:
                rows.append([a.key, f"unavailable: {a.unavailable_reason()}"] + [""] * 11)
            continue
        rs = runs[a.key]
        o = merge(rs)
        dj = o.to_json()
        dj.update(runs_figures(rs))
        server_us = 1e6 * cpu[a.key] / o.ops if o.ops else math.nan
        dj["server_cpu_us_per_op"] = server_us
        res.data[a.key] = dj
        note = "; ".join(sorted(set(o.errors)))[:50] if o.errors else ""
        counts = list(o.per_worker.values())
        rows.append([a.key, fmt_num(dj["ops_per_s"]), _runs(dj, "ops_per_s_runs", ",.0f"),
                     fmt_num(dj["ops_per_s"] * ping_s, 3),
                     "-" if o.lost_updates is None else o.lost_updates,
                     f"{min(counts, default=0)}/{max(counts, default=0)}",
                     fmt_num(dj["jain"], 3), _runs(dj, "jain_runs", ".3f"),
                     "-" if math.isnan(dj["min_share"]) else f"{dj['min_share']:.0%}",
                     fmt_ns(dj["longest_wait_ns"]), fmt_ns(server_us * 1000), o.timeouts,
                     note])
    rows += ctx.unavailable_rows(13)
    res.lines = table(["library", "ops/s", f"runs ({n_runs})", "ops per PING", "lost",
                       "sections min/max", "Jain", "Jain runs", "slowest", "longest wait",
                       "server CPU/op", "timeouts", "errors"], rows)
    res.lines.append(f"(ops/s, Jain, slowest: the median of {n_runs} runs of "
                     f"{p.contended_duration_s:g} s, each run's own value beside it; ops per "
                     "PING = ops/s x PING p50: 1.0 would be one critical section per bare "
                     "round trip; sections min/max per worker and run; slowest: the slowest "
                     "worker's sections as a share of the mean worker's; longest wait: one "
                     "acquire, call to return, any run; server CPU/op: the Redis server's CPU "
                     "time per critical section, on a machine whose cores the workers share "
                     "with it)")
    res.targets += judge(res.data, variants[0].unavailable_reason())
    return res
