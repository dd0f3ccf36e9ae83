"""Section 8 — cost with many live holders: a Semaphore and an RWLock read side.

Issue 38 (target 6, as issue 12's target 5 before it) asks that acquire and release of a
Semaphore or of an RWLock's read side do not cost more when many others hold it; issue 12
asked the same of their renewal (that row stays).  Measured here:

* acquire+release p50 of one permit of ``Semaphore(name, N + 10)`` and of ``read_lock``
  from this process while a helper process keeps 1 other holder, and while another keeps
  ``N`` (1,000) other holders, on separate names; the four cycles are timed interleaved in
  rounds (``harness.interleaved``) so drift is shared.  Target: the N-holder cost <= 1.3x
  the 1-holder cost, for each primitive.  (The 1,000 holders' renewals run meanwhile, as
  they would in production; they load both sides of the ratio alike.)
* renewal: with only the helper holding (this process idle), the commands the server runs
  in a window of a whole number of renewal periods (``ttl / 3``), from INFO commandstats
  deltas (INFO excluded; commands run inside scripts count too), per held primitive and
  per ``ttl / 3``.  Target: with N holders <= 1.2x the figure with 1 holder (a window of
  k periods sees every periodic renewal k times whatever its phase; a renewal delayed
  across the window's edge moves the 1-holder figure by 1/k, hence the margin).  The
  server time spent in scripts per held primitive and per ``ttl / 3`` is shown beside it
  (not a target): a script that reads the whole hash shows there, not in the count.

Both are judged only if every hold is still alive when the figure was taken (checked with
``statistics()`` after the timed cycles and after each window): a hold that expired
because its renewal fell behind makes the figures incomparable, and the target says so.

How the holders are made: helper processes acquire each hold through the public API
(``Semaphore.acquire``, ``RWLock.read_lock.acquire`` on objects of its own) under a
distinct owner id, by substituting ``rlocks._engine.identity``'s owner functions while it
acquires (and releases) that hold.  To the server they are N owners, each with its lease,
renewed by its helper's own renewer, as N threads or processes holding would be (both
owner functions are substituted, whichever the primitive asks); it costs
``holders_procs`` processes (1), not 1,000.
The holds use rlocks' default ttl of 30 s (``holders_ttl``, shown): a shorter one would
renew 2,000 holds so often that, on a loaded 2-core machine, the holds risk expiring,
which would measure the machine, not the scripts.
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

        real = identity.thread_owner

        def as_owner(owner: str) -> None:
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
            identity.thread_owner = real
        out_q.put({"ready": True, "acquire_s": time.monotonic() - t0, "pid": os.getpid()})
        ready.set()
        release.wait(hold_for)
        try:
            for owner, sem, rw in held:
                as_owner(owner)
                rw.read_lock.release()
                sem.release()
        finally:
            identity.thread_owner = real
        out_q.put({"released": len(held)})
    except Exception:
        out_q.put({"fatal": traceback.format_exc(limit=4)})
        ready.set()


def _start(ctx: Context, n: int, tag: str, value: int, procs: int) -> Dict[str, Any]:
    """Spread ``n`` holders over ``procs`` helper processes; wait until all hold."""
    spawn = mp.get_context("spawn")
    release, q = spawn.Event(), spawn.Queue()
    names = (ctx.name("holders", tag, "sem"), ctx.name("holders", tag, "rw"))
    shares = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    shares = [k for k in shares if k]
    readies = [spawn.Event() for _ in shares]
    ps = [spawn.Process(target=holders_process, daemon=True,
                        args=(ctx.url, *names, k, value, ctx.params.holders_ttl, ready,
                              release, q, 600.0))
          for k, ready in zip(shares, readies)]
    for proc in ps:
        proc.start()
    h: Dict[str, Any] = {"n": n, "procs": ps, "release": release, "q": q, "names": names}
    deadline = time.monotonic() + 60 + n * 0.1
    for ready in readies:
        if not ready.wait(max(0.0, deadline - time.monotonic())):
            h["error"] = "a helper did not report its holds in time"
            return h
    got = drain(q, len(ps), 5)
    fatal = [g["fatal"].strip().splitlines()[-1] for g in got if "fatal" in g]
    if fatal or len(got) < len(ps):
        h["error"] = fatal[0] if fatal else "a helper did not report"
    else:
        h["acquire_s"] = max(g["acquire_s"] for g in got)
    return h


def _stop(h: Dict[str, Any]) -> None:
    h["release"].set()
    drain(h["q"], len(h["procs"]), 30 + h["n"] * 0.05)
    for proc in h["procs"]:
        proc.join(10)
        if proc.is_alive():  # bounded: never leave a helper behind
            proc.terminate()
            proc.join(5)


def _alive(ctx: Context, h: Dict[str, Any], value: int) -> int:
    """Live holds of the helpers' owners right now (permits + read holds), from Redis."""
    import rlocks

    sem = rlocks.Semaphore(h["names"][0], value, client=ctx.client).statistics()
    rw = rlocks.RWLock(h["names"][1], client=ctx.client).statistics()
    mine = ":bench-holder-"
    return (sum(x.count for x in sem.holders if mine in x.owner)
            + sum(1 for x in rw.holders if mine in x.owner))


def renewal_per_hold(cmds: int, usec: int, holds: int, window_s: float,
                     period_s: float) -> Tuple[float, float]:
    """(commands, script µs) per held primitive per renewal period, from window deltas."""
    if holds <= 0 or window_s <= 0 or period_s <= 0:
        return math.nan, math.nan
    periods = window_s / period_s
    return cmds / holds / periods, usec / holds / periods


def _window(ctx: Context, h: Dict[str, Any], value: int) -> Dict[str, Any]:
    """Count what the server runs while only the helpers' renewers are active."""
    holds = 2 * h["n"]
    p = ctx.params
    period = p.holders_ttl / 3.0
    # Start half a period after the last hold was taken: a lone holder renews at
    # grant + k periods, so both window edges stay half a period from its renewals and a
    # renewal running a little late still lands inside.  (Many holders' phases are spread:
    # a whole number of periods counts each of them once per period whatever its phase.)
    time.sleep(period / 2)
    c0, u0 = command_breakdown(ctx.client), script_usec(ctx.client)
    w0 = time.monotonic()
    time.sleep(period * p.holders_periods)
    w = time.monotonic() - w0
    per = breakdown_delta(c0, command_breakdown(ctx.client))
    usec = script_usec(ctx.client) - u0
    cmds, us = renewal_per_hold(sum(per.values()), usec, holds, w, period)
    return {"window_s": w, "commands": per, "cmds_per_hold_per_period": cmds,
            "script_us_per_hold_per_period": us, "holds": holds,
            "alive_after": _alive(ctx, h, value)}


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
        one = _start(ctx, 1, "one", value, 1)
        helpers.append(one)
        if "error" in one:
            raise RuntimeError(f"1-holder helper: {one['error']}")
        ctx.progress.step("1 holder: renewal window")
        res.data["renewal_1"] = _window(ctx, one, value)
        ctx.progress.step(f"{n} holders: starting the helper")
        many = _start(ctx, n, "many", value, p.holders_procs)
        helpers.append(many)
        if "error" in many:
            raise RuntimeError(f"{n}-holder helper: {many['error']}")
        res.data["helper_acquire_s"] = many["acquire_s"]
        try:  # the renewal window below is still worth measuring if the cycles fail
            _cycles(ctx, res, rlocks, (one, many), value)
        except Exception as exc:
            res.data["cycles_error"] = f"{type(exc).__name__}: {exc}"
            res.lines.append(f"acquire+release cycles failed: {exc!r}")
        _stop(one)
        helpers.remove(one)
        ctx.progress.step(f"{n} holders: renewal window")
        res.data[f"renewal_{n}"] = _window(ctx, many, value)
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


def _cycles(ctx: Context, res: SectionResult, rlocks: Any, helpers: Tuple[Any, Any],
            value: int) -> None:
    """Time acquire+release of both primitives next to 1 and N holders, interleaved."""
    p = ctx.params
    fns = {}
    for h in helpers:
        sem = rlocks.Semaphore(h["names"][0], value, client=ctx.client)
        rw = rlocks.RWLock(h["names"][1], client=ctx.client)
        fns[f"Semaphore, {h['n']}"] = _cycle(sem)
        fns[f"RWLock.read_lock, {h['n']}"] = _cycle(rw.read_lock)
    for fn in fns.values():
        for _ in range(10):
            fn()
    samples = interleaved(ctx, fns, p.unc_rounds, p.unc_batch, "acquire+release")
    res.data["cycles"] = {k: summary(v) for k, v in samples.items()}
    res.data["alive_after_cycles"] = [_alive(ctx, h, value) for h in helpers]
    res.data["holds"] = [2 * h["n"] for h in helpers]


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
        res.lines += table(["holders", "window", "commands", "script time",
                            "holds alive after"], [
            [label, f"{r['window_s']:.1f} s", fmt_num(r["cmds_per_hold_per_period"], 2),
             f"{r['script_us_per_hold_per_period']:.1f} µs",
             f"{r['alive_after']:,} of {r['holds']:,}"]
            for label, r in (("1", r1), (f"{n:,}", rn))])
        top = sorted(rn["commands"].items(), key=lambda kv: -kv[1])[:5]
        res.lines.append(f"  with {n:,} holders: " + ", ".join(f"{k} {v:,}" for k, v in top))
    if "alive_after_cycles" in res.data:
        a1, an = res.data["alive_after_cycles"]
        res.lines.append(f"(holds alive after the timed cycles: {a1} of 2, {an:,} of {2 * n:,})")
    if "helper_acquire_s" in res.data:
        res.lines.append(f"(the helper took {res.data['helper_acquire_s']:.1f} s to take "
                         f"{2 * n:,} holds)")


def _lost(alive: Any, holds: Any) -> str:
    """Why a figure is not comparable (holds expired meanwhile), or ``""``."""
    if alive is None or holds is None or alive >= holds:
        return ""
    return f"n/a: {holds - alive:,} of {holds:,} holds expired meanwhile"


def holders_targets(data: Dict[str, Any]) -> List[Target]:
    """Issue 38, target 6 (and issue 12's renewal row), from the section's data (pure: the
    self-check tests it).  A
    figure taken while some holds had expired is not judged (``n/a``, with the reason)."""
    n = data.get("holders", 1000)
    cyc = data.get("cycles", {})
    alive, holds = data.get("alive_after_cycles"), data.get("holds")
    lost = ""
    if alive and holds:
        lost = _lost(alive[0], holds[0]) or _lost(alive[1], holds[1])
    err = data.get("cycles_error") or data.get("error")
    if err and not cyc:
        lost = f"n/a: {err}"[:60]
    out = []
    for prim in ("Semaphore", "RWLock.read_lock"):
        a, b = cyc.get(f"{prim}, 1"), cyc.get(f"{prim}, {n}")
        what = f"{prim} acquire+release, {n:,} holders (issue 38)"
        if lost:
            out.append(Target(what, lost, f"<= {COST_LIMIT:g}x 1 holder", None))
            continue
        out.append(ratio_target(what, ratio(b["p50"] if b else None, a["p50"] if a else None),
                                COST_LIMIT, "1 holder"))
    r1, rn = data.get("renewal_1"), data.get(f"renewal_{n}")
    what = f"renewal commands per held primitive per ttl/3, {n:,} holders (issue 12)"
    lost = f"n/a: {data['error']}"[:60] if data.get("error") and not rn else ""
    for r in (r1, rn):
        if r and not lost:
            lost = _lost(r.get("alive_after"), r.get("holds"))
    if lost:
        out.append(Target(what, lost, f"<= {RENEW_LIMIT:g}x 1 holder", None))
        return out
    out.append(ratio_target(
        what, ratio(rn["cmds_per_hold_per_period"] if rn else None,
                    r1["cmds_per_hold_per_period"] if r1 else None), RENEW_LIMIT, "1 holder"))
    return out
