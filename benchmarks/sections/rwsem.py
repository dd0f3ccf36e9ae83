"""Section 7 — rlocks' read/write lock and semaphore, when the library has them.

Guarded by ``hasattr(rlocks, "RWLock")`` / ``hasattr(rlocks, "Semaphore")``: until they land
the section says "not available yet" and reports no figure.

* RW, uncontended: acquire+release of ``read_lock`` and of ``write_lock`` (interleaved).
* RW, contended: 6 reader processes and 2 writer processes (one thread each) on one
  RWLock; a reader takes ``read_lock``, GETs the counter and holds ~1 ms; a writer takes
  ``write_lock``, GET+SETs the counter and holds ~1 ms.  Reported per class of worker
  (readers, writers): sections/s, min/max sections per worker, Jain's index within the
  class and the longest single wait (one ``acquire``, call to return); lost updates
  (writes minus the counter's final value: must be 0).
* Semaphore, uncontended: acquire+release of one permit of ``Semaphore(name, 3)``.
* Semaphore pool: 8 processes x 2 threads share ``Semaphore(name, 3)``, each holding a
  permit ~1 ms.  Reported: permits taken per second, the largest number of simultaneous
  holders seen (a shared-memory counter; must be <= 3), Jain's index over the 16 workers and
  the longest single wait.

Targets (issue 12, target 4): Jain >= 0.95 within each class of worker.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import threading
import time
import traceback
from typing import Any, Dict, List, Tuple

from ..adapters import make_client
from ..harness import Context, interleaved
from ..stats import fmt_ns, fmt_num, fmt_ratio, jain, longest_wait, summary, table
from ..workers import drain
from . import SectionResult, Target

KEY = "rwsem"
TITLE = "7. RW lock and semaphore (rlocks only)"
RW_READERS, RW_WRITERS = 6, 2
SEM_PROCS, SEM_THREADS, SEM_VALUE = 8, 2, 3
HOLD_S = 0.001
FAIR_JAIN = 0.95


def _rlocks() -> Any:
    try:
        import rlocks

        return rlocks
    except Exception:
        return None


# -- worker processes (module level: they are started with spawn) -----------------------
def class_process(url: str, kind: str, name: str, counter: str, threads: int,
                  duration: float, inside: Any, peak: Any, barrier: Any, out_q: Any) -> None:
    """``threads`` workers of one class (``read``, ``write`` or ``sem``) looping acquire /
    critical section (~1 ms) / release on one primitive until ``duration`` ends.  Reports
    per worker: sections, timeouts and the longest single acquire (ns)."""
    try:
        import rlocks

        client = make_client(url)
        if kind == "sem":
            side: Any = rlocks.Semaphore(name, SEM_VALUE, client=client)
        else:
            rw = rlocks.RWLock(name, client=client)
            side = rw.read_lock if kind == "read" else rw.write_lock
        client.ping()
    except Exception:
        barrier.abort()
        out_q.put({"fatal": traceback.format_exc(limit=3)})
        return
    barrier.wait(120)
    end = time.monotonic() + duration
    workers: List[Dict[str, Any]] = [
        {"cls": kind, "sections": 0, "timeouts": 0, "max_wait_ns": 0, "errors": []}
        for _ in range(threads)]

    def loop(w: Dict[str, Any]) -> None:
        try:
            while time.monotonic() < end:
                t0 = time.monotonic_ns()
                got = side.acquire(timeout=10)
                waited = time.monotonic_ns() - t0
                w["max_wait_ns"] = max(w["max_wait_ns"], waited)
                if not got:
                    w["timeouts"] += 1
                    continue
                with inside.get_lock():
                    inside.value += 1
                    peak.value = max(peak.value, inside.value)
                if kind == "write":
                    v = client.get(counter)
                    client.set(counter, int(v or 0) + 1)
                elif kind == "read":
                    client.get(counter)
                time.sleep(HOLD_S)
                with inside.get_lock():
                    inside.value -= 1
                side.release()
                w["sections"] += 1
        except Exception:
            w["errors"].append(traceback.format_exc(limit=3).strip().splitlines()[-1])

    ts = [threading.Thread(target=loop, args=(w,), daemon=True) for w in workers]
    for t in ts:
        t.start()
    for t in ts:
        t.join(duration + 20)  # bounded: a blocked acquire gives up after 10 s
    out_q.put({"workers": workers, "stuck_threads": sum(t.is_alive() for t in ts)})


def class_stats(workers: List[Dict[str, Any]], duration: float) -> Dict[str, Any]:
    """Figures of one class of worker: sections/s, min/max sections, Jain, longest wait."""
    counts = [w["sections"] for w in workers]
    return {"workers": len(workers), "sections_per_s": sum(counts) / duration,
            "sections_min": min(counts, default=0), "sections_max": max(counts, default=0),
            "jain": jain(counts) if counts else math.nan,
            "longest_wait_ns": longest_wait(w["max_wait_ns"] for w in workers),
            "timeouts": sum(w["timeouts"] for w in workers)}


def class_target(what: str, d: Any) -> Target:
    """Jain >= 0.95 within one class of worker (``n/a`` when it was not measured)."""
    j = d.get("jain", math.nan) if isinstance(d, dict) else math.nan
    return Target(what, "-" if math.isnan(j) else f"Jain {j:.3f}", f"Jain >= {FAIR_JAIN}",
                  None if math.isnan(j) else j >= FAIR_JAIN)


def _spawn_all(target: Any, argsets: List[tuple], timeout: float) -> List[Dict[str, Any]]:
    spawn = mp.get_context("spawn")
    barrier = spawn.Barrier(len(argsets) + 1)
    q = spawn.Queue()
    ps = [spawn.Process(target=target, args=(*a, barrier, q), daemon=True) for a in argsets]
    for p in ps:
        p.start()
    try:
        barrier.wait(120)
    except Exception:
        pass
    got = drain(q, len(ps), timeout)
    for p in ps:
        p.join(5)
        if p.is_alive():
            p.terminate()
            p.join(5)
    return got


# -- the section ------------------------------------------------------------------------
def _rw(ctx: Context, rlocks: Any, res: SectionResult) -> None:
    c, ping = ctx.client, ctx.ping_p50_ns
    rw = rlocks.RWLock(ctx.name("rw", "unc"), client=c)

    def cycle(side: Any) -> Any:
        def fn() -> None:
            if not side.acquire(timeout=5):
                raise RuntimeError("uncontended acquire timed out")
            side.release()
        return fn

    fns = {"read_lock": cycle(rw.read_lock), "write_lock": cycle(rw.write_lock)}
    for fn in fns.values():
        for _ in range(10):
            fn()
    p = ctx.params
    samples = interleaved(ctx, fns, p.unc_rounds, p.unc_batch, "RW uncontended")
    rows = []
    for k, ns in samples.items():
        s = summary(ns)
        res.data[f"rw_{k}"] = s
        rows.append([f"RWLock.{k}", s["n"], fmt_ns(s["p50"]), fmt_ns(s["p99"]),
                     fmt_ratio(s["p50"], ping), fmt_ratio(s["p99"], ping)])
    res.lines += table(["acquire+release", "n", "p50", "p99", "p50/PING", "p99/PING"], rows)
    ctx.progress.step(f"RW {RW_READERS} readers + {RW_WRITERS} writers")
    counter = ctx.name("rw", "counter")
    c.set(counter, 0)
    spawn = mp.get_context("spawn")
    inside, peak = spawn.Value("i", 0), spawn.Value("i", 0)
    name = ctx.name("rw", "mixed")
    kinds = ["read"] * RW_READERS + ["write"] * RW_WRITERS
    got = _spawn_all(class_process, [(ctx.url, k, name, counter, 1, p.rw_duration_s, inside,
                                      peak) for k in kinds], p.rw_duration_s + 60)
    fatal, by = _gather(got)
    writes = sum(w["sections"] for w in by.get("write", []))
    lost = writes - int(c.get(counter) or 0)
    d: Dict[str, Any] = {"lost_updates": lost, "errors": fatal}
    rows = []
    for k, label in (("read", "readers"), ("write", "writers")):
        st = class_stats(by.get(k, []), p.rw_duration_s)
        d[label] = st
        rows.append(_class_row(label, st))
    res.data["rw_contended"] = d
    res.lines += ["", f"RWLock, {RW_READERS} reader + {RW_WRITERS} writer processes, ~1 ms "
                  f"holds; lost updates {lost}"
                  + (f"; errors: {'; '.join(fatal)[:80]}" if fatal else "") + ":"]
    res.lines += table(_CLASS_HEADERS, rows)
    res.targets.append(class_target("RWLock readers: fairness among the 6 (issue 12)",
                                    d["readers"]))
    res.targets.append(class_target("RWLock writers: fairness among the 2 (issue 12)",
                                    d["writers"]))


_CLASS_HEADERS = ["workers", "n", "sections/s", "sections min/max", "Jain", "longest wait",
                  "timeouts"]


def _class_row(label: str, st: Dict[str, Any]) -> List[Any]:
    return [label, st["workers"], fmt_num(st["sections_per_s"]),
            f"{st['sections_min']}/{st['sections_max']}", fmt_num(st["jain"], 3),
            fmt_ns(st["longest_wait_ns"]), st["timeouts"]]


def _gather(got: List[Dict[str, Any]]) -> Tuple[List[str], Dict[str, List[Dict[str, Any]]]]:
    """Fatal errors, and the workers of every process grouped by class."""
    fatal = [g["fatal"].strip().splitlines()[-1] for g in got if "fatal" in g]
    by: Dict[str, List[Dict[str, Any]]] = {}
    for g in got:
        for w in g.get("workers", []):
            by.setdefault(w["cls"], []).append(w)
            fatal.extend(w["errors"])
        if g.get("stuck_threads"):
            fatal.append(f"{g['stuck_threads']} thread(s) still blocked at the end")
    return fatal, by


def _sem(ctx: Context, rlocks: Any, res: SectionResult) -> None:
    c, ping, p = ctx.client, ctx.ping_p50_ns, ctx.params
    sem = rlocks.Semaphore(ctx.name("sem", "unc"), SEM_VALUE, client=c)

    def fn() -> None:
        if not sem.acquire(blocking=True, timeout=5):
            raise RuntimeError("uncontended acquire timed out")
        sem.release()

    for _ in range(10):
        fn()
    s = summary(interleaved(ctx, {"permit": fn}, p.unc_rounds, p.unc_batch,
                            "semaphore uncontended")["permit"])
    res.data["sem_uncontended"] = s
    res.lines += ["", f"Semaphore({SEM_VALUE}), one permit, uncontended:"]
    res.lines += table(["acquire+release", "n", "p50", "p99", "p50/PING", "p99/PING"],
                       [["Semaphore", s["n"], fmt_ns(s["p50"]), fmt_ns(s["p99"]),
                         fmt_ratio(s["p50"], ping), fmt_ratio(s["p99"], ping)]])
    ctx.progress.step(f"semaphore of {SEM_VALUE}, {SEM_PROCS} processes x {SEM_THREADS}")
    spawn = mp.get_context("spawn")
    inside, peak = spawn.Value("i", 0), spawn.Value("i", 0)
    got = _spawn_all(class_process, [(ctx.url, "sem", ctx.name("sem", "pool"), "",
                                      SEM_THREADS, p.rw_duration_s, inside, peak)
                                     for _ in range(SEM_PROCS)], p.rw_duration_s + 60)
    fatal, by = _gather(got)
    st = class_stats(by.get("sem", []), p.rw_duration_s)
    d = {**st, "peak_holders": peak.value, "errors": fatal}
    res.data["sem_pool"] = d
    res.lines += ["", f"Semaphore({SEM_VALUE}) shared by {SEM_PROCS} processes x {SEM_THREADS} "
                  f"threads, ~1 ms holds; peak holders {peak.value} (max {SEM_VALUE})"
                  + (f"; errors: {'; '.join(fatal)[:80]}" if fatal else "") + ":"]
    res.lines += table(_CLASS_HEADERS, [_class_row("permit takers", st)])
    res.targets.append(class_target(
        f"Semaphore({SEM_VALUE}), {SEM_PROCS}x{SEM_THREADS} workers: fairness (issue 12)", d))


def run(ctx: Context) -> SectionResult:
    res = SectionResult(KEY, TITLE)
    rlocks = _rlocks()
    for attr, fn in (("RWLock", _rw), ("Semaphore", _sem)):
        if rlocks is None or not hasattr(rlocks, attr):
            res.data[attr] = "not available yet"
            res.lines.append(f"rlocks.{attr}: not available yet")
            res.targets.append(Target(f"rlocks.{attr}: fairness (issue 12)",
                                      "not available yet", f"Jain >= {FAIR_JAIN}", None))
            continue
        try:
            fn(ctx, rlocks, res)
        except Exception as exc:
            res.data[attr] = {"error": repr(exc)}
            res.lines.append(f"rlocks.{attr}: error: {exc!r}")
    return res
