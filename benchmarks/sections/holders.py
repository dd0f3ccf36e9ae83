"""Section 8 — cost with many live holders: a Semaphore and an RWLock read side.

Issue 12 (target 5) asks that acquire, release and renewal of a Semaphore or of an RWLock's
read side do not cost more when many others hold it: today every such script reads the
whole hash.  Measured here:

* acquire+release p50 of one permit of ``Semaphore(name, N + 10)`` and of ``read_lock``
  from this process while a helper process keeps 1 other holder, and while another keeps
  ``N`` (1,000) other holders, on separate names; the four cycles are timed interleaved in
  rounds (``harness.interleaved``) so drift is shared.  Target: the N-holder cost <= 1.3x
  the 1-holder cost, for each primitive.
* renewal: with only the helper holding (this process idle), the commands the server runs
  in a window of a whole number of renewal periods (``ttl / 3``), from INFO commandstats
  deltas (INFO excluded; commands run inside scripts count too), per held primitive and
  per ``ttl / 3``.  Target: with N holders <= 1.2x the figure with 1 holder (a window of
  k periods sees every periodic renewal k times whatever its phase; a renewal delayed
  across the window's edge moves the 1-holder figure by 1/k, hence the margin).  The
  server time spent in scripts per held primitive and per ``ttl / 3`` is shown beside it
  (not a target): a script that reads the whole hash shows there, not in the count.

How the holders are made: one helper process acquires each hold through the public API
(``Semaphore.acquire``, ``RWLock.read_lock.acquire`` on objects of its own) under a
distinct owner id, by substituting ``rlocks._engine.identity``'s owner functions while it
acquires (and releases) that hold.  To the server they are N owners, each with its lease,
renewed by the helper's own renewer, as N processes (semaphore permits belong to a process)
or N threads (read holds belong to a thread) would be; it costs one process, not 1,000.
The holds are built with a short ttl (``holders_ttl``, shown) so renewal falls in the window.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import time
import traceback
from typing import Any, Dict, List, Tuple

from ..adapters import make_client
from ..harness import Context, interleaved
from ..redisinfo import breakdown_delta, command_breakdown, script_usec
from ..stats import fmt_ns, fmt_num, fmt_ratio, ratio, summary, table
from ..workers import drain
from . import SectionResult, Target, ratio_target

KEY = "holders"
TITLE = "8. Cost with many live holders (Semaphore, RWLock read side; rlocks only)"
#: the N-holder acquire+release may cost at most this multiple of the 1-holder one
COST_LIMIT = 1.3
#: renewal commands per held primitive per ttl/3, N holders vs 1 (see the module docstring)
RENEW_LIMIT = 1.2


# -- the helper process (module level: started with spawn) ------------------------------
def holders_process(url: str, sem_name: str, rw_name: str, n: int, value: int, ttl: float,
                    ready: Any, release: Any, out_q: Any, hold_for: float) -> None:
    """Hold one permit of ``sem_name`` and one read hold of ``rw_name`` for each of ``n``
    distinct owners until ``release`` is set (or ``hold_for`` s pass), then release all."""
    held: List[Tuple[str, Any, Any]] = []
    try:
        import rlocks
        from rlocks._engine import identity

        real = (identity.process_owner, identity.thread_owner)

        def as_owner(owner: str) -> None:
            identity.process_owner = lambda: owner
            identity.thread_owner = lambda: owner

        client = make_client(url)
        t0 = time.monotonic()
        try:
            for i in range(n):
                owner = f"{identity.process_token()}:bench-holder-{i}"
                as_owner(owner)
                sem = rlocks.Semaphore(sem_name, value, client=client, ttl=ttl)
                rw = rlocks.RWLock(rw_name, client=client, ttl=ttl)
                if not sem.acquire(timeout=10) or not rw.read_lock.acquire(timeout=10):
                    raise RuntimeError(f"holder {i} could not take its hold")
                held.append((owner, sem, rw))
        finally:
            identity.process_owner = real[0]
            identity.thread_owner = real[1]
        out_q.put({"ready": True, "acquire_s": time.monotonic() - t0, "pid": os.getpid()})
        ready.set()
        release.wait(hold_for)
        try:
            for owner, sem, rw in held:
                as_owner(owner)
                rw.read_lock.release()
                sem.release()
        finally:
            identity.process_owner = real[0]
            identity.thread_owner = real[1]
        out_q.put({"released": len(held)})
    except Exception:
        out_q.put({"fatal": traceback.format_exc(limit=4)})
        ready.set()


def _start(ctx: Context, n: int, tag: str, value: int) -> Dict[str, Any]:
    spawn = mp.get_context("spawn")
    ready, release, q = spawn.Event(), spawn.Event(), spawn.Queue()
    names = (ctx.name("holders", tag, "sem"), ctx.name("holders", tag, "rw"))
    proc = spawn.Process(target=holders_process, daemon=True,
                         args=(ctx.url, *names, n, value, ctx.params.holders_ttl, ready,
                               release, q, 300.0))
    proc.start()
    h = {"n": n, "proc": proc, "release": release, "q": q, "names": names}
    if not ready.wait(60 + n * 0.05):
        h["error"] = "helper did not report its holds in time"
        return h
    got = drain(q, 1, 5)
    if not got or "fatal" in got[0]:
        h["error"] = got[0]["fatal"].strip().splitlines()[-1] if got else "no report"
    else:
        h["acquire_s"] = got[0]["acquire_s"]
    return h


def _stop(h: Dict[str, Any]) -> None:
    h["release"].set()
    drain(h["q"], 1, 30 + h["n"] * 0.02)
    h["proc"].join(10)
    if h["proc"].is_alive():  # bounded: never leave a helper behind
        h["proc"].terminate()
        h["proc"].join(5)


def renewal_per_hold(cmds: int, usec: int, holds: int, window_s: float,
                     period_s: float) -> Tuple[float, float]:
    """(commands, script µs) per held primitive per renewal period, from window deltas."""
    if holds <= 0 or window_s <= 0 or period_s <= 0:
        return math.nan, math.nan
    periods = window_s / period_s
    return cmds / holds / periods, usec / holds / periods


def _window(ctx: Context, holds: int) -> Dict[str, Any]:
    """Count what the server runs while only the helper's renewer is active."""
    p = ctx.params
    period = p.holders_ttl / 3.0
    time.sleep(period)  # let the acquisition burst's first renewals pass the edge
    c0, u0 = command_breakdown(ctx.client), script_usec(ctx.client)
    w0 = time.monotonic()
    time.sleep(period * p.holders_periods)
    w = time.monotonic() - w0
    per = breakdown_delta(c0, command_breakdown(ctx.client))
    usec = script_usec(ctx.client) - u0
    cmds, us = renewal_per_hold(sum(per.values()), usec, holds, w, period)
    return {"window_s": w, "commands": per, "cmds_per_hold_per_period": cmds,
            "script_us_per_hold_per_period": us}


def run(ctx: Context) -> SectionResult:
    res = SectionResult(KEY, TITLE)
    p = ctx.params
    n = p.holders_count
    value = n + 10
    try:
        import rlocks

        if not (hasattr(rlocks, "Semaphore") and hasattr(rlocks, "RWLock")):
            raise ImportError("rlocks.Semaphore / rlocks.RWLock not available")
    except Exception as exc:
        res.lines.append(f"not measured: {exc}")
        res.targets += holders_targets({})
        return res
    helpers: List[Dict[str, Any]] = []
    try:
        ctx.progress.step("1 holder: starting the helper")
        one = _start(ctx, 1, "one", value)
        helpers.append(one)
        if "error" in one:
            raise RuntimeError(f"1-holder helper: {one['error']}")
        ctx.progress.step("1 holder: renewal window")
        res.data["renewal_1"] = _window(ctx, 2)
        ctx.progress.step(f"{n} holders: starting the helper")
        many = _start(ctx, n, "many", value)
        helpers.append(many)
        if "error" in many:
            raise RuntimeError(f"{n}-holder helper: {many['error']}")
        res.data["helper_acquire_s"] = many["acquire_s"]
        fns = {}
        for tag, h in (("1", one), (str(n), many)):
            sem = rlocks.Semaphore(h["names"][0], value, client=ctx.client)
            rw = rlocks.RWLock(h["names"][1], client=ctx.client)
            fns[f"Semaphore, {tag}"] = _cycle(sem)
            fns[f"RWLock.read_lock, {tag}"] = _cycle(rw.read_lock)
        for fn in fns.values():
            for _ in range(10):
                fn()
        samples = interleaved(ctx, fns, p.unc_rounds, p.unc_batch, "acquire+release")
        res.data["cycles"] = {k: summary(v) for k, v in samples.items()}
        _stop(one)
        helpers.remove(one)
        ctx.progress.step(f"{n} holders: renewal window")
        res.data[f"renewal_{n}"] = _window(ctx, 2 * n)
    except Exception as exc:
        res.data["error"] = repr(exc)
        res.lines.append(f"error: {exc!r}")
    finally:
        for h in helpers:
            _stop(h)
    res.data["holders"] = n
    res.data["ttl"] = p.holders_ttl
    _report(ctx, res, n)
    res.targets += holders_targets(res.data)
    return res


def _cycle(side: Any) -> Any:
    def fn() -> None:
        if not side.acquire(timeout=5):
            raise RuntimeError("acquire with free permits / no writer timed out")
        side.release()
    return fn


def _report(ctx: Context, res: SectionResult, n: int) -> None:
    ping = ctx.ping_p50_ns
    cyc = res.data.get("cycles", {})
    rows = []
    for prim in ("Semaphore", "RWLock.read_lock"):
        a, b = cyc.get(f"{prim}, 1"), cyc.get(f"{prim}, {n}")
        if not a or not b:
            continue
        rows.append([prim, fmt_ns(a["p50"]), fmt_ratio(a["p50"], ping), fmt_ns(b["p50"]),
                     fmt_ratio(b["p50"], ping), fmt_num(ratio(b["p50"], a["p50"]), 2) + "x"])
    if rows:
        res.lines += [f"acquire+release p50 with other live holders (ttl "
                      f"{ctx.params.holders_ttl:g} s):"]
        res.lines += table(["primitive", "1 holder", "/PING", f"{n:,} holders", "/PING",
                            "ratio"], rows)
    r1, rn = res.data.get("renewal_1"), res.data.get(f"renewal_{n}")
    if r1 and rn:
        res.lines += ["", "renewal while only the holders run (Semaphore + read side, per "
                      "held primitive per ttl/3):"]
        res.lines += table(["holders", "window", "commands", "script time"], [
            [label, f"{r['window_s']:.1f} s", fmt_num(r["cmds_per_hold_per_period"], 2),
             f"{r['script_us_per_hold_per_period']:.1f} µs"]
            for label, r in (("1", r1), (f"{n:,}", rn))])
        top = sorted(rn["commands"].items(), key=lambda kv: -kv[1])[:5]
        res.lines.append(f"  with {n:,} holders: " + ", ".join(f"{k} {v:,}" for k, v in top))
    if "helper_acquire_s" in res.data:
        res.lines.append(f"(the helper took {res.data['helper_acquire_s']:.1f} s to take "
                         f"{2 * n:,} holds)")


def holders_targets(data: Dict[str, Any]) -> List[Target]:
    """Issue 12, target 5, from the section's data (pure: the self-check tests it)."""
    n = data.get("holders", 1000)
    cyc = data.get("cycles", {})
    out = []
    for prim in ("Semaphore", "RWLock.read_lock"):
        a, b = cyc.get(f"{prim}, 1"), cyc.get(f"{prim}, {n}")
        out.append(ratio_target(f"{prim} acquire+release, {n:,} holders (issue 12)",
                                ratio(b["p50"] if b else None, a["p50"] if a else None),
                                COST_LIMIT, "1 holder"))
    r1, rn = data.get("renewal_1"), data.get(f"renewal_{n}")
    out.append(ratio_target(
        f"renewal commands per held primitive per ttl/3, {n:,} holders (issue 12)",
        ratio(rn["cmds_per_hold_per_period"] if rn else None,
              r1["cmds_per_hold_per_period"] if r1 else None), RENEW_LIMIT, "1 holder"))
    return out
