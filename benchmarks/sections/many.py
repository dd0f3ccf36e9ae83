"""Section 5 — many locks held at once (10,000 distinct names; 1,000 with --quick).

A fresh spawned process builds N lock objects, then acquires them one after another (each
timed), holds them all for a quiet window, then releases them (each timed).  Measured:

* time per acquire and per release (p50, and mean), raw and / PING p50;
* acquire of one lock at a time: ``many_single`` other names, each acquired (timed) and
  released at once, half before the N are taken and half after they were released (one
  lock held at a time), and all of them again while the N are held: the acquire p50 with
  N held against one lock's (issue 38);
* Redis ``used_memory`` growth while all are held, divided by N: keys, values, TTLs and
  any bookkeeping the library keeps on the server.  Before each library the run's earlier
  keys are deleted, because some libraries leave short-lived keys behind after a release
  (python-redis-lock's 1 s signal lists) whose expiry would otherwise land in the next
  library's measurement.  For rlocks every name is first taken and released once, so the
  fencing counters (one per cluster slot and namespace, kept for good, shared by every
  name of the slot) exist before the reading: the figure is the held locks' own;
* keys per held lock (a SCAN for the names while all are held: the most any one lock has,
  and the mean), and the keys left ``many_keys_after_s`` (1 s) after the last release;
* renewal cost while everything is held and nothing else runs: commands the server executed
  in the window (INFO commandstats, INFO itself excluded) per second, and
  the CPU used by the holding process and by redis-server, as % of one core.

rlocks renews held locks in the background; so that at least one renewal period falls in
the window it is built here with a short ``ttl`` (shown in the output; default 30 s). Its
renewal traffic per lock scales with 1/ttl.  The peers do not renew at their defaults, so
their window is shorter.  portalocker keeps a pub/sub connection and a thread per held lock,
so it is run with fewer locks (noted) rather than 10,000 connections.

Targets (issue 38), for rlocks: at most 2 keys per held lock; <= 250 bytes of
``used_memory`` growth per held lock (fencing counters excluded, as above); no key left by
a released name after 1 s; acquire p50 with N held <= 1.3x one lock's.
"""

from __future__ import annotations

import math
import multiprocessing as mp
from typing import Any, Dict, List

from ..harness import Context, cleanup_keys
from ..stats import fmt_ns, fmt_num, fmt_ratio, ratio, summary, table
from ..workers import drain, many_locks_process
from . import SectionResult, Target, ratio_target

KEY = "many"
TITLE = "5. Many locks held at once"
#: keys one held RLock may have (its fencing counter, shared by its slot, not counted)
KEYS_LIMIT = 2
#: used_memory growth per held RLock, bytes
BYTES_LIMIT = 250
#: acquire p50 with N locks held vs one lock's
HELD_LIMIT = 1.3


def _one(ctx: Context, adapter: Any) -> Dict[str, Any]:
    p = ctx.params
    count = p.many_count
    if adapter.key == "portalocker":
        count = min(count, p.many_portalocker_cap)
    is_rlocks = adapter.key == "rlocks"
    single = p.many_single if adapter.key != "portalocker" else min(p.many_single, 10)
    ttl = p.many_rlocks_ttl if is_rlocks else None
    window = p.many_window_s if is_rlocks else p.many_peer_window_s
    cleanup_keys(ctx)
    spawn = mp.get_context("spawn")
    q = spawn.Queue()
    proc = spawn.Process(target=many_locks_process, daemon=True,
                         args=(adapter.key, ctx.url, ctx.name("many", adapter.key), count,
                               single, ttl, window, is_rlocks, p.many_keys_after_s, q))
    proc.start()
    # bounded: generous per-lock allowance (twice for the first pass) plus the window
    got = drain(q, 1, 60 + window + (count + 3 * single) * 0.02)
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
        "count": count, "ttl": ttl, "window_s": w, "prewarmed": is_rlocks,
        "acquire_ns": acq, "release_ns": rel,
        "one_lock_acquire_ns": summary(r["one_lock_acquire_ns"]),
        "with_held_acquire_ns": summary(r["with_held_acquire_ns"]),
        "keys_per_lock": r["keys_held"] / count, "keys_max_per_lock": r["keys_max_per_lock"],
        "locks_without_key": r["locks_without_key"],
        "keys_left": r["keys_left"], "names_left": r["names_left"],
        "keys_after_s": p.many_keys_after_s,
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
            rows.append([a.key, d["count"], f"error: {d['error']}"] + [""] * 11)
            continue
        label = a.key + (f" (ttl={d['ttl']:g}s)" if d["ttl"] else "")
        one, held = d["one_lock_acquire_ns"]["p50"], d["with_held_acquire_ns"]["p50"]
        rows.append([label, d["count"], fmt_ns(d["acquire_ns"]["p50"]),
                     fmt_ratio(d["acquire_ns"]["p50"], ping), fmt_ns(one), fmt_ns(held),
                     fmt_num(ratio(held, one), 2) + "x",
                     fmt_ns(d["release_ns"]["p50"]), fmt_ratio(d["release_ns"]["p50"], ping),
                     fmt_num(d["bytes_per_lock"]),
                     f"{d['keys_per_lock']:.2f} / {d['keys_max_per_lock']}",
                     d["keys_left"], fmt_num(d["extra_cmds_per_s"], 1),
                     f"{d['client_cpu_pct']:.1f}% / {d['server_cpu_pct']:.1f}%"])
    rows += ctx.unavailable_rows(14)
    res.lines = table(["library", "locks", "acq p50", "acq/PING", "acq 1 lock", "acq N held",
                       "N held/1", "rel p50", "rel/PING", "bytes/lock", "keys/lock mean/max",
                       "keys left", "cmds/s held", "CPU client/server"], rows)
    res.lines.append("(acq p50: the N acquires in a row; acq 1 lock: other names one at a "
                     "time, before and after the N; acq N held: the same names while the N "
                     "are held; keys left: keys of the N names "
                     f"{ctx.params.many_keys_after_s:g} s after the last release; bytes/lock: "
                     "used_memory growth while all are held (rlocks: every name taken and "
                     "released once first, so the per-slot fencing counters are not in it); "
                     "cmds/s held, CPU: with every lock held and nothing else running, i.e. "
                     "the cost of keeping them)")
    for a in ctx.available():
        lib = res.data.get(a.key, {})
        by = lib.get("extra_by_command")
        if by:
            top = sorted(by.items(), key=lambda kv: -kv[1])[:4]
            per_lock = lib["extra_cmds_per_s"] / lib["count"]
            res.lines.append(f"  {a.key}: {per_lock:.3f} commands/s per held lock over "
                             f"{lib['window_s']:.1f} s: "
                             + ", ".join(f"{k} {v:,}" for k, v in top))
    res.targets += many_targets(res.data.get("rlocks"))
    return res


def many_targets(d: Any) -> List[Target]:
    """Issue 38, target 3, from rlocks' row of the section (pure: the self-check tests
    it; ``None`` or an error: every row ``n/a``)."""
    ok = isinstance(d, dict) and "error" not in d and d.get("count")
    n = f"{d['count']:,}" if ok else "N"
    err = f"n/a: {d['error']}"[:60] if isinstance(d, dict) and "error" in d else "-"
    keys_what = f"{n} RLocks held: keys per held lock (issue 38)"
    mem_what = f"{n} RLocks held: used_memory growth per lock, fencing counters excluded " \
               "(issue 38)"
    left_what = "released names: keys left after 1 s (issue 38)"
    acq_what = f"{n} RLocks held: acquire p50 vs one lock's (issue 38)"
    if not ok:
        return [Target(keys_what, err, f"<= {KEYS_LIMIT}", None),
                Target(mem_what, err, f"<= {BYTES_LIMIT} B", None),
                Target(left_what, err, "0", None),
                ratio_target(acq_what, math.nan, HELD_LIMIT, "one lock")]
    kmax, b = d["keys_max_per_lock"], d["bytes_per_lock"]
    return [
        Target(keys_what, f"at most {kmax} (mean {d['keys_per_lock']:.2f}; "
               f"{d['locks_without_key']:,} held locks without a key)", f"<= {KEYS_LIMIT}",
               kmax <= KEYS_LIMIT and d["locks_without_key"] == 0),
        Target(mem_what, "-" if math.isnan(b) else f"{b:.0f} B", f"<= {BYTES_LIMIT} B",
               None if math.isnan(b) else b <= BYTES_LIMIT),
        Target(left_what, f"{d['keys_left']:,} keys of {d['names_left']:,} names "
               f"{d['keys_after_s']:g} s after the last release", "0", d["keys_left"] == 0),
        ratio_target(acq_what, ratio(d["with_held_acquire_ns"]["p50"],
                                     d["one_lock_acquire_ns"]["p50"]), HELD_LIMIT,
                     "one lock's p50",
                     note=f"{fmt_ns(d['with_held_acquire_ns']['p50'])} vs "
                          f"{fmt_ns(d['one_lock_acquire_ns']['p50'])}"),
    ]
