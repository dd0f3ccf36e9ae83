"""Section 1 — the floor: a bare PING and a trivial EVALSHA (``return 1``), p50/p99.

Every other figure in the suite is also given as a ratio to the PING p50 measured here, in
the same run, on the same connection type: that ratio is what survives a change of machine.
Both are timed one call at a time with ``perf_counter_ns``, interleaved in rounds.
"""

from __future__ import annotations

from ..harness import Context, interleaved
from ..stats import fmt_ns, fmt_ratio, summary, table
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
    res.lines = table(["call", "n", "p50", "p99", "p50/PING", "p99/PING"], rows)
    return res
