"""Section 1 — the floor: a bare PING and a trivial EVALSHA (``return 1``), p50/p99, and
the bare BLPOP/LPUSH hand-off between two processes.

Every other figure in the suite is also given as a ratio to the PING p50 measured here, in
the same run, on the same connection type: that ratio is what survives a change of machine.
Both are timed one call at a time with ``perf_counter_ns``, interleaved in rounds.

The hand-off floor is a token passed through a Redis list between two spawned processes
(BLPOP to take, LPUSH to give back) with the same baton rule and random hold as section 3:
the cheapest wake-up of another process through Redis.  It and the EVALSHA are context
rows (section 3 measures the token again, interleaved with the libraries); no target is a
ratio to them since issue 38, whose targets compare rlocks with its peers of the same run.
"""

from __future__ import annotations

from ..adapters import reference_adapters
from ..harness import Context, interleaved, merge, run_chain
from ..stats import fmt_ns, fmt_ratio, summary, table
from ..workers import ChainConfig
from . import SectionResult

KEY = "floor"
TITLE = "1. Floor: Redis round trips"


def run(ctx: Context) -> SectionResult:
    c = ctx.client
    sha = c.script_load("return 1")
    # warm the connection and the script cache before timing
    for _ in range(50):
        c.ping()
        c.evalsha(sha, 0)
    p = ctx.params
    samples = interleaved(ctx, {"PING": c.ping, "EVALSHA return 1": lambda: c.evalsha(sha, 0)},
                          p.floor_rounds, p.floor_batch, "floor")
    ping = summary(samples["PING"])
    ctx.ping_p50_ns = ping["p50"]
    res = SectionResult(KEY, TITLE)
    rows = []
    for name, ns in samples.items():
        s = summary(ns)
        res.data[name] = s
        rows.append([name, s["n"], fmt_ns(s["p50"]), fmt_ns(s["p99"]),
                     fmt_ratio(s["p50"], ctx.ping_p50_ns), fmt_ratio(s["p99"], ctx.ping_p50_ns)])
    res.data["ping_p50_ns"] = ctx.ping_p50_ns
    ctx.evalsha_p50_ns = summary(samples["EVALSHA return 1"])["p50"]
    ref = reference_adapters()[0]
    outs = []
    for r in range(p.rounds):
        ctx.progress.step(f"BLPOP/LPUSH hand-off between 2 processes ({r + 1}/{p.rounds})")
        outs.append(run_chain(ctx, ChainConfig(
            adapter=ref.key, url=ctx.url, lock_name=ctx.name("floor", "blpop", r), baton=True,
            hold_ms=p.handoff_hold_ms, duration_s=p.floor_handoff_s / p.rounds,
            max_ops=p.floor_handoff_max // p.rounds + 1), procs=2))
    h = summary(merge(outs).handoff_ns)
    ctx.blpop_p50_ns, ctx.blpop_p99_ns = h["p50"], h["p99"]
    res.data["BLPOP/LPUSH hand-off"] = h
    rows.append(["BLPOP/LPUSH hand-off, 2 processes", h["n"], fmt_ns(h["p50"]),
                 fmt_ns(h["p99"]), fmt_ratio(h["p50"], ctx.ping_p50_ns),
                 fmt_ratio(h["p99"], ctx.ping_p50_ns)])
    res.lines = table(["call", "n", "p50", "p99", "p50/PING", "p99/PING"], rows)
    return res
