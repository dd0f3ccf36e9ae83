"""Section 5 — many locks held at once (10,000 distinct names; 1,000 with --quick).

A fresh spawned process builds N lock objects, then acquires them one after another (each
timed), holds them all for a quiet window, then releases them (each timed).  Measured:

* time per acquire and per release (p50, and mean), raw and / PING p50;
* Redis ``used_memory`` growth while all are held, divided by N: keys, values, TTLs and
  any bookkeeping the library keeps on the server.  Before each library the run's earlier
  keys are deleted, because some libraries leave short-lived keys behind after a release
  (python-redis-lock's 1 s signal lists) whose expiry would otherwise land in the next
  library's measurement;
* renewal cost while everything is held and nothing else runs: commands the server executed
  in the window (INFO commandstats, INFO itself excluded) per second, and
  the CPU used by the holding process and by redis-server, as % of one core.

rlocks renews held locks in the background; so that at least one renewal period falls in
the window it is built here with a short ``ttl`` (shown in the output; default 30 s). Its
renewal traffic per lock scales with 1/ttl.  The peers do not renew at their defaults, so
their window is shorter.  portalocker keeps a pub/sub connection and a thread per held lock,
so it is run with fewer locks (noted) rather than 10,000 connections.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any, Dict, List

from ..harness import Context, cleanup_keys
from ..stats import fmt_ns, fmt_num, fmt_ratio, summary, table
from ..workers import drain, many_locks_process
from . import SectionResult, Target

KEY = "many"
TITLE = "5. Many locks held at once"


def _one(ctx: Context, adapter: Any) -> Dict[str, Any]:
    p = ctx.params
    count = p.many_count
    if adapter.key == "portalocker":
        count = min(count, p.many_portalocker_cap)
    is_rlocks = adapter.key == "rlocks"
    ttl = p.many_rlocks_ttl if is_rlocks else None
    window = p.many_window_s if is_rlocks else p.many_peer_window_s
    cleanup_keys(ctx)
    spawn = mp.get_context("spawn")
    q = spawn.Queue()
    proc = spawn.Process(target=many_locks_process, daemon=True,
                         args=(adapter.key, ctx.url, ctx.name("many", adapter.key), count, ttl,
                               window, q))
    proc.start()
    # bounded: generous per-lock allowance plus the window
    got = drain(q, 1, 60 + window + count * 0.01)
    proc.join(10)
    if proc.is_alive():
        proc.terminate()
        proc.join(5)
    if not got:
        return {"error": "worker did not report in time", "count": count}
    r = got[0]
    if "fatal" in r:
        return {"error": r["fatal"].strip().splitlines()[-1], "count": count}
    acq, rel = summary(r["acquire_ns"]), summary(r["release_ns"])
    w = r["window_s"]
    return {
        "count": count, "ttl": ttl, "window_s": w,
        "acquire_ns": acq, "release_ns": rel,
        "bytes_per_lock": r["mem_delta"] / count,
        "used_memory": [r["mem_before"], r["mem_held"], r["mem_after"]],
        "extra_cmds_per_s": r["extra_cmds"] / w,
        "extra_by_command": r["extra_by_command"],
        "client_cpu_pct": 100 * r["client_cpu_s"] / w,
        "server_cpu_pct": 100 * r["server_cpu_s"] / w,
    }


def run(ctx: Context) -> SectionResult:
    res = SectionResult(KEY, TITLE)
    ping = ctx.ping_p50_ns
    rows: List[List[Any]] = []
    for a in ctx.available():
        ctx.progress.step(f"{a.key}")
        d: Dict[str, Any] = _one(ctx, a)
        res.data[a.key] = d
        if "error" in d:
            rows.append([a.key, d["count"], f"error: {d['error']}"] + [""] * 8)
            continue
        label = a.key + (f" (ttl={d['ttl']:g}s)" if d["ttl"] else "")
        rows.append([label, d["count"], fmt_ns(d["acquire_ns"]["p50"]),
                     fmt_ratio(d["acquire_ns"]["p50"], ping),
                     fmt_ratio(d["acquire_ns"]["mean"], ping),
                     fmt_ns(d["release_ns"]["p50"]), fmt_ratio(d["release_ns"]["p50"], ping),
                     fmt_num(d["bytes_per_lock"]), fmt_num(d["extra_cmds_per_s"], 1),
                     f"{d['client_cpu_pct']:.1f}%", f"{d['server_cpu_pct']:.1f}%"])
    rows += ctx.unavailable_rows(11)
    res.lines = table(["library", "locks", "acq p50", "acq/PING", "acq mean/PING", "rel p50",
                       "rel/PING", "bytes/lock", "cmds/s held", "client CPU", "server CPU"],
                      rows)
    res.lines.append("(cmds/s held, client CPU, server CPU: measured with every lock held and "
                     "nothing else running, i.e. the cost of keeping them)")
    for a in ctx.available():
        lib = res.data.get(a.key, {})
        by = lib.get("extra_by_command")
        if by:
            top = sorted(by.items(), key=lambda kv: -kv[1])[:4]
            per_lock = lib["extra_cmds_per_s"] / lib["count"]
            res.lines.append(f"  {a.key}: {per_lock:.3f} commands/s per held lock over "
                             f"{lib['window_s']:.1f} s: "
                             + ", ".join(f"{k} {v:,}" for k, v in top))
    d = res.data.get("rlocks") or {}
    if d and "error" not in d:
        acq = d["acquire_ns"]["p50"] / ping
        res.targets.append(Target(f"{d['count']:,} locks: acquire p50", f"{acq:.2f}x PING",
                                  "<= 1.3x PING", acq <= 1.3))
        b = d["bytes_per_lock"]
        res.targets.append(Target(f"{d['count']:,} locks: memory per held lock", f"{b:.0f} B",
                                  "<= 150 B", b <= 150))
    else:
        res.targets.append(Target("many locks: acquire p50", "-", "<= 1.3x PING", None))
        res.targets.append(Target("many locks: memory per held lock", "-", "<= 150 B", None))
    return res
