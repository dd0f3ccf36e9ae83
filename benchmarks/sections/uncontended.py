"""Section 2 — uncontended acquire+release, per library, and re-entrant acquire+release
(rlocks only: the other libraries are not re-entrant), and rlocks on a Quorum of 3 local
masters (issue 13); then the server work of rlocks' uncontended pair.

One lock object per library on the shared client; each sample is one ``acquire`` plus one
``release`` with nobody else wanting the lock, timed with ``perf_counter_ns``.  Libraries are
interleaved batch by batch (see ``harness.interleaved``).  The re-entrant figure is the
inner acquire+release while the same thread already holds the lock.

Targets (issue 38): rlocks' uncontended pair p50 <= redis-py ``Lock``'s pair p50 of the
same run, and its re-entrant pair p50 <= that same redis-py figure.

Server work (issue 38): ``SERVER_CYCLES`` pairs through the public API on a server with no
other client, between ``CONFIG RESETSTAT`` and ``INFO commandstats``; every command counted
there that is not the scripts' own call (``EVALSHA``/``EVAL``/``FCALL``) is one the
scripts ran inside the server.  Target: <= 8 such nested commands per pair, listed by
name.  The server with no other client is the run's own (the runner started it), or,
when the run was given a server with ``--url``, a throwaway one started for the count;
if none can be started the count runs on the given server without resetting its
statistics (deltas, the least of three windows: other clients' commands can only add).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..adapters import make_client, quorum_adapters
from ..harness import Context, interleaved
from ..redisinfo import command_stats
from ..stats import fmt_ns, fmt_ratio, ratio, summary, table
from . import SectionResult, Target, ratio_target

#: rlocks pairs run alone for the server-work count (and its scripts' server time)
SERVER_CYCLES = 2000
#: nested Redis commands an uncontended rlocks acquire+release may run (issue 38)
NESTED_LIMIT = 8
#: the commands a client sends to run a script (not nested commands)
SCRIPT_CALLS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")

KEY = "uncontended"
TITLE = "2. Uncontended acquire+release"
REENTRANT = "rlocks (re-entrant)"
PEER = "redis-py"


def _cycle(lock: Any) -> Callable[[], None]:
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
    for name, ns in samples.items():
        res.data[name] = summary(ns)
    peer = res.data.get(PEER)
    peer_p50 = peer["p50"] if isinstance(peer, dict) and "p50" in peer else math.nan
    rows: List[List[Any]] = []
    for a in ctx.adapters[:1] + quorum + ctx.adapters[1:]:
        if a in quorum and a.unavailable_reason() is not None:
            rows.append([a.key, f"unavailable: {a.unavailable_reason()}", "", "", "", "", ""])
            continue
        for name in [a.key] + ([REENTRANT] if a.reentrant else []):
            s = res.data.get(name)
            if isinstance(s, dict) and "p50" in s:
                rows.append([name, s["n"], fmt_ns(s["p50"]), fmt_ns(s["p99"]),
                             fmt_ratio(s["p50"], ping), fmt_ratio(s["p99"], ping),
                             fmt_ratio(s["p50"], peer_p50)])
            elif isinstance(s, dict) and "error" in s:
                rows.append([name, f"error: {s['error']}", "", "", "", "", ""])
    rows += ctx.unavailable_rows(7)
    res.lines = table(["library", "n", "p50", "p99", "p50/PING", "p99/PING",
                       f"p50/{PEER}"], rows)
    for q in quorum:  # issue 13: reported against the floor, no target set
        got = res.data.get(q.key)
        if isinstance(got, dict) and "p50" in got:
            res.lines.append(
                f"{q.key}: p50 {fmt_ratio(got['p50'], ping)} PING, "
                f"{fmt_ratio(got['p50'], ctx.evalsha_p50_ns)} EVALSHA p50")
    res.targets += pair_targets(res.data)
    if "rlocks" in fns:
        ctx.progress.step(f"server work: {SERVER_CYCLES:,} pairs, INFO commandstats")
        try:
            work = server_work(ctx)
        except Exception as exc:  # the timing figures above stand on their own
            work = {"error": f"{type(exc).__name__}: {exc}"}
        res.data["server_work"] = work
        res.lines += [""] + work_lines(work)
    else:
        res.data["server_work"] = {"error": "rlocks was not measured"}
    res.targets.append(work_target(res.data["server_work"]))
    return res


def pair_targets(data: Dict[str, Any]) -> List[Target]:
    """Issue 38, target 1, from the section's summaries (pure: the self-check tests it):
    rlocks' uncontended and re-entrant pair p50 <= redis-py's uncontended pair p50."""
    def p50(name: str) -> Optional[float]:
        got = data.get(name)
        return got["p50"] if isinstance(got, dict) and "p50" in got else None

    peer = p50(PEER)
    return [
        ratio_target("uncontended acquire+release p50 vs redis-py Lock (issue 38)",
                     ratio(p50("rlocks"), peer), 1.0, f"{PEER} p50"),
        ratio_target("re-entrant acquire+release p50 vs redis-py Lock (issue 38)",
                     ratio(p50(REENTRANT), peer), 1.0, f"{PEER} p50"),
    ]


# -- server work --------------------------------------------------------------------------

def nested_per_pair(before: Dict[str, Dict[str, int]], after: Dict[str, Dict[str, int]],
                    pairs: int) -> Dict[str, Any]:
    """From two ``INFO commandstats`` readings (``redisinfo.command_stats``) around
    ``pairs`` acquire+release pairs: nested commands per pair by name, the script calls
    (round trips) per pair and the scripts' server time per pair (µs). Pure."""
    calls: Dict[str, float] = {}
    script_calls = 0
    usec = 0
    for name, now in after.items():
        then = before.get(name, {"calls": 0, "usec": 0})
        n = now["calls"] - then["calls"]
        if n <= 0 or name.startswith(("info", "config")):
            continue
        if name in SCRIPT_CALLS:
            script_calls += n
            usec += now["usec"] - then["usec"]
        else:
            calls[name.upper()] = n / pairs
    return {"pairs": pairs, "by_command": dict(sorted(calls.items(), key=lambda kv: -kv[1])),
            "nested_per_pair": sum(calls.values()),
            "script_calls_per_pair": script_calls / pairs, "script_us_per_pair": usec / pairs}


def _count(client: Any, name: str, pairs: int, reset: bool,
           reentrant: bool) -> Dict[str, Any]:
    """``pairs`` rlocks acquire+release pairs (re-entrant ones: inside an outer hold) on
    ``client``, counted with INFO commandstats."""
    import rlocks

    lock = rlocks.RLock(name, client=client)
    cycle = _cycle(lock)
    for _ in range(20):  # the scripts are loaded, the slot's fencing counter exists
        cycle()
    if reentrant and not lock.acquire(timeout=5.0):
        raise RuntimeError("could not take the outer lock")
    try:
        if reset:
            client.config_resetstat()
        before = command_stats(client)
        for _ in range(pairs):
            cycle()
        after = command_stats(client)
    finally:
        if reentrant:
            lock.release()
    return nested_per_pair(before, after, pairs)


def _server(ctx: Context) -> Tuple[Any, str, bool, Any]:
    """(client, where, reset allowed, what to close): a server with no other client."""
    if ctx.own_server:
        return ctx.client, "the run's own server", True, None
    try:
        from rlocks.server import TemporaryRedisServer

        srv = TemporaryRedisServer()
        srv.__enter__()
    except Exception as exc:  # noqa: BLE001 - fall back to the given server, with care
        return ctx.client, f"the given server (no throwaway one: {exc}; the least of 3 " \
                           "windows, statistics not reset)", False, None
    return make_client(srv.url), "a throwaway server started for the count", True, srv


def server_work(ctx: Context) -> Dict[str, Any]:
    """Nested commands (by name) and script time per uncontended rlocks pair, and per
    re-entrant pair (no target), on a server no other client uses (see the docstring)."""
    client, where, reset, srv = _server(ctx)
    try:
        n = SERVER_CYCLES if not ctx.quick else SERVER_CYCLES // 4
        out: Dict[str, Any] = {"where": where}
        for label, reentrant in (("pair", False), ("reentrant", True)):
            windows = [_count(client, ctx.name("work", label), n, reset, reentrant)
                       for _ in range(1 if reset else 3)]
            out[label] = min(windows, key=lambda w: w["nested_per_pair"])
        return out
    finally:
        if srv is not None:
            client.close()
            srv.__exit__(None, None, None)


def _by_name(d: Dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in d["by_command"].items())


def work_lines(work: Dict[str, Any]) -> List[str]:
    if "error" in work:
        return [f"server work: not measured: {work['error']}"]
    out = [f"server work per rlocks acquire+release ({work['pair']['pairs']:,} pairs alone, "
           f"INFO commandstats, {work['where']}):"]
    rows = []
    for label, key in (("uncontended", "pair"), ("re-entrant", "reentrant")):
        d = work[key]
        rows.append([label, f"{d['script_calls_per_pair']:g}", f"{d['nested_per_pair']:g}",
                     f"{d['script_us_per_pair']:.1f} µs", _by_name(d)])
    out += table(["pair", "script calls", "nested commands", "script time", "by name"], rows)
    return out


def work_target(work: Dict[str, Any]) -> Target:
    """Issue 38, target 2 (pure): <= 8 nested commands per uncontended pair."""
    what = "server work: nested Redis commands per uncontended acquire+release (issue 38)"
    goal = f"<= {NESTED_LIMIT}"
    d = work.get("pair") if isinstance(work, dict) else None
    if not d:
        err = work.get("error", "-") if isinstance(work, dict) else "-"
        return Target(what, f"n/a: {err}"[:70] if err != "-" else "-", goal, None)
    n = d["nested_per_pair"]
    return Target(what, f"{n:g} ({_by_name(d)}; {d['script_calls_per_pair']:g} script calls)",
                  goal, n <= NESTED_LIMIT)
