"""A tiny, pytest-free self-check of the suite's own arithmetic and plumbing (no Redis, no
timing): ``python -m benchmarks.selfcheck``.  Exit status 0 when everything holds."""

from __future__ import annotations

import math
import os
import sys

from .__main__ import _clean, selected_sections
from .adapters import QUORUM_ENV, all_adapters, get_adapter, quorum_adapters, variant_adapters
from .harness import ChainOutcome, Params, merge
from .redisinfo import breakdown_delta, is_loopback_url
from .sections import ORDER, ratio_target
from .sections.contended import judge, median_of, min_share, runs_figures
from .sections.handoff import handoff_targets
from .sections.holders import holders_targets, renewal_per_hold
from .sections.many import many_targets
from .sections.rwsem import class_stats, class_target
from .sections.scaling import scaling_targets
from .sections.size import class_lengths, count_lines, size_targets
from .sections.uncontended import nested_per_pair, pair_targets, work_target
from .stats import fmt_ns, fmt_ratio, jain, longest_wait, percentile, ratio, summary, table, within
from .workers import keys_per_lock


def _checks() -> None:
    assert percentile([1, 2, 3, 4, 5], 50) == 3
    assert percentile([1, 2], 50) == 1.5
    assert percentile([10], 99) == 10
    assert math.isnan(percentile([], 50))
    assert percentile(list(range(101)), 99) == 99
    assert summary([])["n"] == 0
    assert abs(jain([5, 5, 5, 5]) - 1.0) < 1e-12
    assert abs(jain([1, 0, 0, 0]) - 0.25) < 1e-12
    assert fmt_ns(1500) == "1.5 µs" and fmt_ns(2_500_000) == "2.50 ms"
    assert fmt_ratio(150.0, 50.0) == "3.00x" and fmt_ratio(math.nan, 50.0) == "-"
    lines = table(["a", "bb"], [["x", 1], ["yy", 22]])
    assert len(lines) == 4 and lines[2].startswith("x ")
    assert selected_sections(None) == ORDER
    assert selected_sections("4,many") == ["floor", "contended", "many"]
    assert selected_sections("code") == ["floor", "size"] and ORDER[8] == "size"
    for bad in ("nope",):
        try:
            selected_sections(bad)
        except SystemExit:
            pass
        else:
            raise AssertionError("unknown section accepted")
    assert is_loopback_url("redis://127.0.0.1:6379/0") and is_loopback_url("redis://localhost")
    assert not is_loopback_url("redis://10.0.0.5:6379") and not is_loopback_url("redis://x.io")
    assert breakdown_delta({"get": 1}, {"get": 3, "set": 2}) == {"get": 2, "set": 2}
    assert _clean({"a": math.nan, "b": [1.0, math.inf]}) == {"a": None, "b": [1.0, None]}
    m = merge([ChainOutcome(ops=10, span_s=1.0, lost_updates=0, handoff_ns=[1, 2]),
               ChainOutcome(ops=30, span_s=1.0, lost_updates=0, handoff_ns=[3])])
    assert m.ops == 40 and m.throughput == 20.0 and m.handoff_ns == [1, 2, 3]
    q, f = Params.quick(), Params()
    assert q.many_count < f.many_count and q.scale_duration_s < f.scale_duration_s
    keys = [a.key for a in all_adapters()]
    assert keys[0] == "rlocks" and len(set(keys)) == len(keys) == 6
    for a in all_adapters():  # every library is either usable or says why not
        assert a.unavailable_reason() is None or a.unavailable_reason()
        assert a.defaults
    _shared_checks()
    _issue38_checks()


def _verdicts(targets: list) -> list:
    return [t.ok for t in targets]


def _shared_checks() -> None:
    """Ratios, verdicts and the helpers the targets are built with."""
    assert abs(jain([3, 1]) - 0.8) < 1e-12 and math.isnan(jain([0, 0]))
    assert longest_wait([5, 9, 2]) == 9 and math.isnan(longest_wait([]))
    assert ratio(3.0, 2.0) == 1.5 and math.isnan(ratio(1.0, 0.0))
    assert math.isnan(ratio(None, 2.0)) and math.isnan(ratio(1.0, math.nan))
    assert within(1.0, 1.0) is True and within(1.01, 1.0) is False
    assert within(0.9, 0.9, at_least=True) is True and within(math.nan, 1.0) is None
    t = ratio_target("x", 1.2, 1.2, "ref")
    assert t.ok is True and t.measured == "1.20x ref" and t.goal == "<= 1.2x ref"
    assert ratio_target("x", math.nan, 1.0, "ref").ok is None  # never a pass on no data
    assert ratio_target("x", 0.5, 0.9, "ref", at_least=True).ok is False
    # per-worker min/max and the longest wait of one outcome
    o = ChainOutcome(ops=4, per_worker={"a": 3, "b": 1},
                     per_worker_max_wait_ns={"a": 10, "b": 70})
    j = o.to_json()
    assert j["worker_ops_min"] == 1 and j["worker_ops_max"] == 3
    assert j["longest_wait_ns"] == 70 and abs(j["jain"] - 0.8) < 1e-12
    m = merge([o, o])
    assert len(m.per_worker_max_wait_ns) == 4 and m.to_json()["longest_wait_ns"] == 70
    v = variant_adapters()[0]
    assert v.key == "rlocks (fair=False)" and get_adapter(v.key) is v
    assert v.unavailable_reason() in (None, "rlocks.RLock has no fair=")
    q = quorum_adapters()[0]  # issue 13: without the runner's 2 more masters, says so
    assert q.key == "rlocks (Quorum, 3)" and get_adapter(q.key) is q and not q.reentrant
    if QUORUM_ENV not in os.environ:
        assert "2 more local masters" in (q.unavailable_reason() or ""), q.unavailable_reason()


def _issue38_checks() -> None:
    """The arithmetic and verdicts of the issue-38 targets (and of the rows kept from
    before), on made-up figures."""
    # 1: uncontended and re-entrant pair p50 vs redis-py's pair p50
    unc = {"rlocks": {"p50": 90.0}, "rlocks (re-entrant)": {"p50": 100.0},
           "redis-py": {"p50": 100.0}}
    assert _verdicts(pair_targets(unc)) == [True, True]
    unc["rlocks (re-entrant)"] = {"p50": 101.0}
    assert _verdicts(pair_targets(unc)) == [True, False]
    assert _verdicts(pair_targets({"rlocks": {"p50": 1.0}})) == [None, None]  # no peer
    assert _verdicts(pair_targets({"redis-py": {"error": "x"}})) == [None, None]
    # 2: nested commands per uncontended pair, from two commandstats readings
    before = {"evalsha": {"calls": 10, "usec": 100}, "exists": {"calls": 4, "usec": 4},
              "info": {"calls": 3, "usec": 30}}
    after = {"evalsha": {"calls": 14, "usec": 160}, "exists": {"calls": 8, "usec": 8},
             "incr": {"calls": 2, "usec": 2}, "hset": {"calls": 2, "usec": 2},
             "pexpire": {"calls": 2, "usec": 2}, "hget": {"calls": 2, "usec": 2},
             "del": {"calls": 2, "usec": 2}, "info": {"calls": 5, "usec": 50},
             "config|resetstat": {"calls": 1, "usec": 1}}
    w = nested_per_pair(before, after, 2)
    assert w["nested_per_pair"] == 7 and w["by_command"]["EXISTS"] == 2
    assert w["script_calls_per_pair"] == 2 and w["script_us_per_pair"] == 30
    assert "INFO" not in w["by_command"] and "CONFIG|RESETSTAT" not in w["by_command"]
    assert list(w["by_command"])[0] == "EXISTS"  # most first
    t = work_target({"pair": w})
    assert t.ok is True and t.measured.startswith("7 (EXISTS 2, ") and t.goal == "<= 8"
    assert work_target({"pair": {**w, "nested_per_pair": 9}}).ok is False
    assert work_target({"error": "no server"}).ok is None
    assert work_target({}).ok is None
    # 3: keys per lock, memory per lock, keys left, acquire with N held vs one lock
    ks = ["rlocks:rlock:{p:7}", "rlocks:rlock:{p:7}:q", "rlocks:rlock:{p:17}",
          "rlocks:fence:{abcd}", "rlocks:rlock:{p-one:7}"]
    assert keys_per_lock(ks, "p") == {7: 2, 17: 1}
    md = {"count": 10000, "keys_per_lock": 1.0, "keys_max_per_lock": 1,
          "locks_without_key": 0, "bytes_per_lock": 180.0, "keys_left": 0, "names_left": 0,
          "keys_after_s": 1.0, "one_lock_acquire_ns": {"p50": 100.0},
          "with_held_acquire_ns": {"p50": 130.0}}
    assert _verdicts(many_targets(md)) == [True, True, True, True]
    md.update(keys_max_per_lock=3, bytes_per_lock=251.0, keys_left=2, names_left=1,
              with_held_acquire_ns={"p50": 131.0})
    assert _verdicts(many_targets(md)) == [False, False, False, False]
    md.update(keys_max_per_lock=1, locks_without_key=5)  # a held lock with no key: a miss
    assert _verdicts(many_targets(md))[0] is False
    assert _verdicts(many_targets(None)) == [None, None, None, None]
    err = many_targets({"error": "worker did not report in time", "count": 10})
    assert _verdicts(err) == [None] * 4 and err[0].measured.startswith("n/a: worker")
    # 4: medians of 3 runs; fair vs the best fair peer, fair=False vs the best peer
    assert median_of([3.0, 1.0, 2.0]) == 2.0 and median_of([1.0, math.nan, 3.0]) == 2.0
    assert math.isnan(median_of([])) and min_share([1, 9]) == 0.2
    assert math.isnan(min_share([]))
    rf = runs_figures([ChainOutcome(throughput=t, per_worker={"a": a, "b": 4}, lost_updates=0)
                       for t, a in ((900.0, 4), (1000.0, 1), (1100.0, 3))])
    assert rf["ops_per_s"] == 1000.0 and rf["ops_per_s_runs"] == [900.0, 1000.0, 1100.0]
    assert abs(rf["jain"] - jain([3, 4])) < 1e-12 and rf["min_share"] == 3 / 3.5

    def lib(ops: float, j: float, share: float = 1.0, lost: int = 0) -> dict:
        return {"ops": 10, "ops_per_s": ops, "ops_per_s_runs": [ops] * 3, "jain": j,
                "jain_runs": [j] * 3, "min_share": share, "min_share_runs": [share] * 3,
                "lost_updates_runs": [lost, 0, 0]}

    data = {"rlocks": lib(2000, 0.97), "redis-py": lib(3500, 0.6),
            "python-redis-lock": lib(1900, 0.99), "rlocks (fair=False)": lib(3325, 0.7, 0.2),
            "ref: BLPOP token": lib(5000, 1.0)}  # a reference row is never a peer
    got = judge(data)
    assert _verdicts(got) == [True, True, True, True, True]
    assert "python-redis-lock" in got[0].measured and "redis-py" in got[2].measured
    assert "runs 2,000 / 2,000 / 2,000" in got[0].measured
    data["python-redis-lock"] = lib(2100, 0.99)  # a fair peer beats rlocks
    data["rlocks (fair=False)"] = lib(3324, 0.7, 0.05)  # < 0.95x redis-py; one worker starves
    data["rlocks"] = lib(2000, 0.97, lost=1)
    assert _verdicts(judge(data)) == [False, True, False, False, False]
    data["rlocks"] = lib(2000, 0.80)
    assert _verdicts(judge(data))[1] is False
    del data["python-redis-lock"]  # no fair peer: nothing to beat
    assert judge(data)[0].ok is True
    un = judge(data, "rlocks.RLock has no fair=")
    assert _verdicts(un)[2:4] == [None, None]
    assert un[2].measured == "unavailable: rlocks.RLock has no fair="
    assert _verdicts(judge({})) == [None, None, None, None, None]
    # 5: hand-off vs python-redis-lock; 8 vs 1 waiting processes
    def h(p50: float, n: int = 5) -> dict:
        return {"handoff_ns": {"n": n, "p50": p50}}

    assert _verdicts(handoff_targets(h(100.0), h(100.0))) == [True]
    assert _verdicts(handoff_targets(h(101.0), h(100.0))) == [False]
    assert _verdicts(handoff_targets(h(50.0), None)) == [None]
    assert _verdicts(handoff_targets(h(50.0, 0), h(100.0))) == [None]
    pts = [{"waiters": 1, "ops_per_s": 1000.0, "handoff_p50_ns": 100.0},
           {"waiters": 8, "ops_per_s": 900.0, "handoff_p50_ns": 120.0}]
    assert _verdicts(scaling_targets(pts)) == [True, True]
    pts[1] = {"waiters": 8, "ops_per_s": 360.0, "handoff_p50_ns": 121.0}
    assert _verdicts(scaling_targets(pts)) == [False, False]
    assert _verdicts(scaling_targets(pts[1:])) == [None, None]  # no 1-waiter point
    # kept from issue 12: Jain within a class of worker, longest wait per class
    st = class_stats([{"sections": 10, "max_wait_ns": 5, "timeouts": 0},
                      {"sections": 10, "max_wait_ns": 8, "timeouts": 1}], 2.0)
    assert st["jain"] == 1.0 and st["longest_wait_ns"] == 8 and st["sections_per_s"] == 10
    assert class_target("w", st).ok is True
    assert class_target("w", {"jain": 0.9}).ok is False and class_target("w", None).ok is None
    # 6: cost with 1,000 holders vs 1 (and issue 12's renewal per held primitive per ttl/3)
    assert renewal_per_hold(120, 600, 2, 3.0, 0.5) == (10.0, 50.0)
    assert all(math.isnan(x) for x in renewal_per_hold(1, 1, 0, 1.0, 1.0))
    cyc = {"Semaphore, 1": {"p50": 100.0}, "Semaphore, 1000": {"p50": 130.0},
           "RWLock.read_lock, 1": {"p50": 100.0}, "RWLock.read_lock, 1000": {"p50": 660.0}}
    hd = {"holders": 1000, "cycles": cyc, "renewal_1": {"cmds_per_hold_per_period": 3.0},
          "renewal_1000": {"cmds_per_hold_per_period": 3.0}}
    assert _verdicts(holders_targets(hd)) == [True, False, True]
    assert "(issue 38)" in holders_targets(hd)[0].what
    hd["renewal_1000"] = {"cmds_per_hold_per_period": 4.0}
    assert _verdicts(holders_targets(hd))[2] is False
    assert _verdicts(holders_targets({})) == [None, None, None]
    err = holders_targets({"cycles_error": "TimeoutError: x", "error": "RuntimeError: y"})
    assert err[0].measured == "n/a: TimeoutError: x" and err[2].measured == "n/a: RuntimeError: y"
    hd["alive_after_cycles"], hd["holds"] = [2, 1999], [2, 2000]  # one hold expired
    assert _verdicts(holders_targets(hd))[:2] == [None, None]
    hd["renewal_1000"] = {"cmds_per_hold_per_period": 3.0, "alive_after": 1500, "holds": 2000}
    t = holders_targets(hd)[2]
    assert t.ok is None and t.measured == "n/a: 500 of 2,000 holds expired meanwhile"
    # 7: code size: lines, the longest class by the ast module
    assert count_lines("a\nb\n") == 2 and count_lines("a\nb") == 2 and count_lines("") == 0
    src = "@dec\nclass A:\n    x = 1\n\n    class B:\n        y = 2\n\n\ndef f():\n" \
          "    class C:\n        pass\n"
    assert class_lengths(src) == [("A", 1, 6), ("A.B", 5, 2), ("f.<locals>.C", 10, 2)]
    sd = {"engine": {"python": 6000, "lua": 1000, "total": 7000},
          "classes": [{"class": "A", "file": "rlocks/a.py", "line": 1, "lines": 500}]}
    assert _verdicts(size_targets(sd)) == [True, True]
    sd["engine"]["total"], sd["classes"][0]["lines"] = 7001, 501
    assert _verdicts(size_targets(sd)) == [False, False]
    assert _verdicts(size_targets({})) == [None, None]


def main() -> int:
    try:
        _checks()
    except AssertionError:
        import traceback

        traceback.print_exc()
        print("benchmarks self-check: 0 passed, 1 failed")
        return 1
    print("benchmarks self-check: 1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
