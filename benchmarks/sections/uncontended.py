"""Section 2 — uncontended acquire+release, per library, and re-entrant acquire+release
(rlocks only: the other libraries are not re-entrant), and rlocks on a Quorum of 3 local
masters (issue 13).

One lock object per library on the shared client; each sample is one ``acquire`` plus one
``release`` with nobody else wanting the lock, timed with ``perf_counter_ns``.  Libraries are
interleaved batch by batch (see ``harness.interleaved``).  The re-entrant figure is the
inner acquire+release while the same thread already holds the lock.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

from ..adapters import quorum_adapters
from ..harness import Context, interleaved
from ..redisinfo import script_usec
from ..stats import fmt_ns, fmt_ratio, ratio, summary, table
from . import SectionResult, Target, ratio_target

#: rlocks cycles run alone after the interleaved samples, to read its scripts' server time
SCRIPT_CYCLES = 2000

KEY = "uncontended"
TITLE = "2. Uncontended acquire+release"
REENTRANT = "rlocks (re-entrant)"


def _cycle(lock) -> Callable[[], None]:
    def fn() -> None:
        if not lock.acquire(timeout=5.0):
            raise RuntimeError("uncontended acquire timed out")
        lock.release()
    return fn


def run(ctx: Context) -> SectionResult:
    res = SectionResult(KEY, TITLE)
    fns: Dict[str, Callable[[], None]] = {}
    outer = None
    quorum = quorum_adapters()
    for a in ctx.available() + [q for q in quorum if q.unavailable_reason() is None]:
        ctx.progress.step(f"warming {a.key}")
        try:
            lock = a.make(ctx.client, ctx.name("unc", a.key))
            fn = _cycle(lock)
            for _ in range(20):
                fn()
            fns[a.key] = fn
            if a.reentrant:
                outer = a.make(ctx.client, ctx.name("reent", a.key))
                if not outer.acquire(timeout=5.0):
                    raise RuntimeError("could not take the outer lock")
                inner = _cycle(outer)
                for _ in range(20):
                    inner()
                fns[REENTRANT] = inner
        except Exception as exc:
            res.data[a.key] = {"error": repr(exc)}
    p = ctx.params
    try:
        samples = interleaved(ctx, fns, p.unc_rounds, p.unc_batch, "acquire+release")
    finally:
        if outer is not None:
            outer.release()
    ping = ctx.ping_p50_ns
    rows: List[List[Any]] = []
    for a in ctx.adapters[:1] + quorum + ctx.adapters[1:]:
        if a in quorum and a.unavailable_reason() is not None:
            rows.append([a.key, f"unavailable: {a.unavailable_reason()}", "", "", "", ""])
            continue
        names = [a.key] + ([REENTRANT] if a.reentrant else [])
        for name in names:
            if name in samples:
                s = summary(samples[name])
                res.data[name] = s
                rows.append([name, s["n"], fmt_ns(s["p50"]), fmt_ns(s["p99"]),
                             fmt_ratio(s["p50"], ping), fmt_ratio(s["p99"], ping)])
            elif name in res.data:
                rows.append([name, f"error: {res.data[name]['error']}", "", "", "", ""])
    rows += ctx.unavailable_rows(6)
    res.lines = table(["library", "n", "p50", "p99", "p50/PING", "p99/PING"], rows)
    for name, label in (("rlocks", "uncontended acquire+release p50"),
                        (REENTRANT, "re-entrant acquire+release p50")):
        got: Any = res.data.get(name)
        val = got["p50"] / ping if got and "p50" in got else None
        res.targets.append(Target(label, f"{val:.2f}x PING" if val is not None else "-",
                                  "<= 2.0x PING", None if val is None else val <= 2.0))
    for q in quorum:  # issue 13: reported against the floor, no target set
        got = res.data.get(q.key)
        if got and "p50" in got:
            res.lines.append(
                f"{q.key}: p50 {fmt_ratio(got['p50'], ping)} PING, "
                f"{fmt_ratio(got['p50'], ctx.evalsha_p50_ns)} EVALSHA p50")
    if "rlocks" in fns:
        # Shown, no target: the server time of rlocks' two scripts alone (INFO
        # commandstats; the interleaved samples mix every library's scripts).
        before = script_usec(ctx.client)
        for _ in range(SCRIPT_CYCLES):
            fns["rlocks"]()
        per = (script_usec(ctx.client) - before) / SCRIPT_CYCLES
        res.data["rlocks_script_us"] = per
        res.lines.append(f"rlocks: server time in its scripts per acquire+release {per:.1f} µs "
                         f"({SCRIPT_CYCLES:,} cycles, INFO commandstats)")
    # issue 12: "stays at two trivial-EVALSHA round trips"
    got = res.data.get("rlocks")
    res.targets.append(ratio_target(
        "uncontended acquire+release p50 (issue 12)",
        ratio(got["p50"] if got and "p50" in got else None, ctx.evalsha_p50_ns), 2.0,
        "EVALSHA p50"))
    return res
