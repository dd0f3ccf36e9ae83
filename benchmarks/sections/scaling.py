"""Section 6 — scaling with the number of waiters, and connections opened by waiters.

* vs waiting processes (1, 2, 4, 8): waiters+1 spawned processes of one thread each share
  one lock, in two runs per point.  Latency run: the "baton" rule (a releaser does not try
  again until someone else has taken the lock) and a random 2-6 ms hold make every
  acquisition a hand-off to waiters parked in ``acquire``; reported: hand-off p50.
  Throughput run: everyone loops acquire / GET+SET a counter / release with no rule;
  reported: critical sections per second (and lost updates, which must be 0), and the
  longest single wait of any worker (one ``acquire``, call to return, in either run).
  Targets (issue 38): throughput with 8 waiting processes >= 0.9x that with 1, hand-off
  p50 with 8 <= 1.2x that with 1 (both points must be in the run: ``--quick`` runs 1 and 8).
* vs waiting threads in one process (1..64): the same with waiters+1 threads in one process
  (rlocks shares one RLock object between them, the others build one object per thread on
  the process's shared client, as their docs require).
* connections: one process opens a client, then parks 64 threads in ``acquire`` on a lock
  held elsewhere; the growth of the server's ``CLIENT LIST`` (peak while they wait, minus
  the count with the process connected and idle) is what its waiters cost in connections.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import time
from typing import Any, Dict, List

from ..adapters import make_client, reference_adapters
from ..harness import Context, run_chain
from ..redisinfo import client_count, subscriber_count
from ..stats import fmt_ns, fmt_num, fmt_ratio, jain, longest_wait, ratio, summary, table
from ..workers import ChainConfig, drain, waiters_process
from . import SectionResult, Target, ratio_target

KEY = "scaling"
TITLE = "6. Scaling with waiters"


def _curve(ctx: Context, kind: str, points: List[int]) -> Dict[str, List[Dict[str, Any]]]:
    p = ctx.params
    out: Dict[str, List[Dict[str, Any]]] = {}
    libs = ctx.available()
    if kind == "processes":
        # The floor of a FIFO hand-off between processes: a token passed by BLPOP (Redis
        # serves blocked clients in arrival order) and LPUSH, no library.
        libs = libs + reference_adapters()
    for i, w in enumerate(points):
        for a in ctx.order(libs, i):
            ctx.progress.step(f"{w} waiting {kind}: {a.key}")
            procs, threads = (w + 1, 1) if kind == "processes" else (1, w + 1)
            # latency run: baton + a short random hold, so every waiter is parked in
            # acquire() when the holder lets go (without the hold, a releaser's successor
            # may not have asked yet, and the "hand-off" would be an uncontended acquire)
            lat = run_chain(ctx, ChainConfig(
                adapter=a.key, url=ctx.url, lock_name=ctx.name("scale", kind, w, a.key, "l"),
                threads=threads, baton=True, hold_ms=p.scale_hold_ms,
                duration_s=p.scale_duration_s, max_ops=p.scale_max_ops), procs)
            # throughput run: free-for-all, GET+SET of a counter in the lock
            tp = run_chain(ctx, ChainConfig(
                adapter=a.key, url=ctx.url, lock_name=ctx.name("scale", kind, w, a.key, "t"),
                threads=threads, counter_key=ctx.name("scale", kind, w, a.key, "n"),
                duration_s=p.scale_duration_s), procs)
            s = summary(lat.handoff_ns)
            out.setdefault(a.key, []).append({
                "waiters": w, "handoff_p50_ns": s["p50"], "handoff_p99_ns": s["p99"],
                "handoffs": s["n"], "ops_per_s": tp.throughput,
                "jain": jain(tp.per_worker.values()),
                "longest_wait_ns": longest_wait(list(lat.per_worker_max_wait_ns.values())
                                                + list(tp.per_worker_max_wait_ns.values())),
                "lost_updates": tp.lost_updates, "timeouts": lat.timeouts + tp.timeouts,
                "errors": sorted(set(lat.errors + tp.errors))[:3]})
    return out


def _latency_cell(x: Dict[str, Any], ping: float) -> str:
    cell = f"{fmt_ns(x['handoff_p50_ns'])} ({fmt_ratio(x['handoff_p50_ns'], ping)})"
    if x["handoffs"] < 10:
        cell += f" n={x['handoffs']}"
    return cell


def _connections(ctx: Context, a: Any, n: int) -> Dict[str, Any]:
    spawn = mp.get_context("spawn")
    ready, go, blocked = spawn.Event(), spawn.Event(), spawn.Event()
    q = spawn.Queue()
    holder_client = make_client(ctx.url)
    name = ctx.name("conns", a.key)
    holder = a.make(holder_client, name)
    if not holder.acquire(timeout=5.0):
        return {"error": "could not take the lock to park waiters on"}
    # waiters give up soon after the holder lets go; the process is stopped after that anyway
    proc = spawn.Process(target=waiters_process, daemon=True,
                         args=(a.key, ctx.url, name, n, ready, go, blocked, q, 3.0))
    try:
        proc.start()
        if not ready.wait(60):
            return {"error": "waiter process did not start"}
        time.sleep(0.1)
        base = client_count(ctx.client)
        base_sub = subscriber_count(ctx.client)
        go.set()
        if not blocked.wait(30):
            return {"error": "waiter threads did not start"}
        peak, peak_sub = base, base_sub
        for _ in range(6):  # sample while all are parked
            time.sleep(0.1)
            peak = max(peak, client_count(ctx.client))
            peak_sub = max(peak_sub, subscriber_count(ctx.client))
        early = drain(q, 1, 0.01)
        if early and "fatal" in early[0]:
            return {"error": early[0]["fatal"].strip().splitlines()[-1]}
        return {"threads": n, "baseline_clients": base, "peak_clients": peak,
                "extra_connections": peak - base, "extra_subscribers": peak_sub - base_sub}
    finally:
        # Stop our waiter process first (nothing more to learn from it), then let go: this
        # way no waiter ever ends up holding the lock, and no library's own acquire timeout
        # (sherlock: 10 s) has to run out.
        if proc.is_alive():
            proc.terminate()
        proc.join(5)
        try:
            holder.release()
        except Exception:
            pass
        holder_client.close()


def run(ctx: Context) -> SectionResult:
    res = SectionResult(KEY, TITLE)
    p = ctx.params
    ping = ctx.ping_p50_ns
    res.data["processes"] = _curve(ctx, "processes", list(p.scale_procs))
    res.data["threads"] = _curve(ctx, "threads", list(p.scale_threads))
    notes: List[str] = []
    for kind, points in (("processes", p.scale_procs), ("threads", p.scale_threads)):
        cols = [f"{w}" for w in points]
        rows_lat, rows_tp, rows_wait = [], [], []
        for a in list(ctx.adapters) + reference_adapters():
            pts = res.data[kind].get(a.key)
            if not pts:
                continue
            rows_lat.append([a.key] + [_latency_cell(x, ping) for x in pts])
            rows_tp.append([a.key] + [fmt_num(x["ops_per_s"]) for x in pts])
            rows_wait.append([a.key] + [fmt_ns(x["longest_wait_ns"]) for x in pts])
            for x in pts:
                if x["errors"] or x["lost_updates"] or x["timeouts"]:
                    notes.append(f"  {a.key}, {x['waiters']} waiting {kind}: "
                                 f"lost updates {x['lost_updates']}, timeouts {x['timeouts']}"
                                 + (f"; {'; '.join(x['errors'])[:90]}" if x["errors"] else ""))
        res.lines += [f"hand-off p50 (and /PING) vs waiting {kind}:"]
        res.lines += table(["library"] + cols, rows_lat + ctx.unavailable_rows(len(cols) + 1))
        res.lines += ["", f"throughput (critical sections/s, GET+SET inside) vs waiting {kind}:"]
        res.lines += table(["library"] + cols, rows_tp)
        res.lines += ["", f"longest single wait of any worker vs waiting {kind}:"]
        res.lines += table(["library"] + cols, rows_wait)
        res.lines.append("")
    if notes:
        res.lines += ["notes (a blocked acquire gives up after 10 s at most):"] + notes + [""]
    res.lines.append("(n=k: only k hand-offs fitted in the time; read such cells as rough)")
    res.lines.append("")
    conns: Dict[str, Any] = {}
    rows: List[List[Any]] = []
    for a in ctx.available():
        ctx.progress.step(f"connections with {p.conn_threads} waiting threads: {a.key}")
        c = _connections(ctx, a, p.conn_threads)
        conns[a.key] = c
        if "error" in c:
            rows.append([a.key, f"error: {c['error']}", "", "", ""])
        else:
            rows.append([a.key, c["baseline_clients"], c["peak_clients"], c["extra_connections"],
                         c["extra_subscribers"]])
    res.data["connections"] = conns
    res.lines += [f"connections opened by one process with {p.conn_threads} waiting threads "
                  "(CLIENT LIST):"]
    res.lines += table(["library", "clients idle", "clients waiting", "extra connections",
                        "of which pub/sub"], rows + ctx.unavailable_rows(5))
    d: Any = conns.get("rlocks")
    if d and "error" not in d:
        res.targets.append(Target(f"{p.conn_threads} waiting threads: extra connections",
                                  str(d["extra_connections"]), "<= 2",
                                  d["extra_connections"] <= 2))
    else:
        res.targets.append(Target("64 waiting threads: extra connections", "-", "<= 2", None))
    res.targets += scaling_targets(res.data["processes"].get("rlocks") or [])
    floor = scaling_targets(res.data["processes"].get(reference_adapters()[0].key) or [])
    res.lines.append("")
    res.lines.append("the floor's own scaling (ref: BLPOP token, no target): "
                     + "; ".join(f"{t.what.replace(' (issue 38)', '')} {t.measured}"
                                 for t in floor))
    res.lines.append("")
    return res


def scaling_targets(pts: List[Dict[str, Any]], lo: int = 1, hi: int = 8) -> List[Target]:
    """Issue 38, target 5 (second half), from rlocks' points vs waiting processes:
    throughput with ``hi`` waiting processes >= 0.9x that with ``lo``; hand-off p50 with
    ``hi`` <= 1.2x that with ``lo``.  A missing point gives ``n/a``."""
    by = {x["waiters"]: x for x in pts}
    a, b = by.get(lo), by.get(hi)

    def get(x: Any, k: str) -> Any:
        return x[k] if x else None

    return [
        ratio_target(f"throughput, {hi} vs {lo} waiting process (issue 38)",
                     ratio(get(b, "ops_per_s"), get(a, "ops_per_s")), 0.9,
                     f"{lo} waiting", at_least=True),
        ratio_target(f"hand-off p50, {hi} vs {lo} waiting process (issue 38)",
                     ratio(get(b, "handoff_p50_ns"), get(a, "handoff_p50_ns")), 1.2,
                     f"{lo} waiting"),
    ]


def plot(data: Dict[str, Any], path: str, ping_ns: float) -> str:
    """Write the four scaling curves to ``path`` (PNG).  Returns a message for the user."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "--plot skipped: matplotlib is not installed (pip install matplotlib)"
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    for col, kind in enumerate(("processes", "threads")):
        series = data.get(kind, {})
        ax_l, ax_t = axes[0][col], axes[1][col]
        for lib, pts in series.items():
            xs = [x["waiters"] for x in pts]
            lat = [x["handoff_p50_ns"] / ping_ns if not math.isnan(x["handoff_p50_ns"])
                   else math.nan for x in pts]
            ax_l.plot(xs, lat, marker="o", label=lib)
            ax_t.plot(xs, [x["ops_per_s"] for x in pts], marker="o", label=lib)
        ticks = sorted({x["waiters"] for pts in series.values() for x in pts})
        for ax in (ax_l, ax_t):
            ax.set_xscale("log", base=2)
            if ticks:
                ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.set_yscale("log")
            ax.set_xlabel(f"waiting {kind}")
            ax.grid(True, which="both", alpha=0.3)
        ax_l.set_title(f"hand-off p50 vs waiting {kind}")
        ax_l.set_ylabel("hand-off p50 / PING p50")
        ax_t.set_title(f"throughput vs waiting {kind}")
        ax_t.set_ylabel("critical sections / s")
        ax_l.legend(fontsize=8)
    fig.suptitle(f"rlocks benchmarks: scaling (PING p50 = {ping_ns / 1e3:.1f} µs)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"plot written to {path}"
