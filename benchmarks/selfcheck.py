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
from .sections.contended import judge, min_share
from .sections.handoff import handoff_targets
from .sections.holders import holders_targets, renewal_per_hold
from .sections.rwsem import class_stats, class_target
from .sections.scaling import scaling_targets
from .stats import fmt_ns, fmt_ratio, jain, longest_wait, percentile, ratio, summary, table, within


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
    _issue12_checks()


def _verdicts(targets: list) -> list:
    return [t.ok for t in targets]


def _issue12_checks() -> None:
    """The arithmetic and verdicts of the issue-12 targets, on made-up figures."""
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
    # m = per-worker min/max and the longest wait of one outcome
    o = ChainOutcome(ops=4, per_worker={"a": 3, "b": 1},
                     per_worker_max_wait_ns={"a": 10, "b": 70})
    j = o.to_json()
    assert j["worker_ops_min"] == 1 and j["worker_ops_max"] == 3
    assert j["longest_wait_ns"] == 70 and abs(j["jain"] - 0.8) < 1e-12
    m = merge([o, o])
    assert len(m.per_worker_max_wait_ns) == 4 and m.to_json()["longest_wait_ns"] == 70
    # target 1: hand-off ratios to the BLPOP floor
    assert _verdicts(handoff_targets({"n": 5, "p50": 100.0, "p99": 300.0}, 100.0, 200.0)) \
        == [True, True]
    assert _verdicts(handoff_targets({"n": 5, "p50": 101.0, "p99": 301.0}, 100.0, 200.0)) \
        == [False, False]
    assert _verdicts(handoff_targets(None, 100.0, 200.0)) == [None, None]
    # target 2: Jain, throughput vs fair peers, fair=False vs the best peer and 10 % floor
    assert min_share([1, 9]) == 0.2 and math.isnan(min_share([]))

    def lib(ops: float, j: float, share: float = 1.0) -> dict:
        return {"ops": 10, "ops_per_s": ops, "jain_worst_round": j,
                "min_share_worst_round": share}

    data = {"rlocks": lib(2000, 0.97), "redis-py": lib(3500, 0.6),
            "python-redis-lock": lib(1900, 0.99), "rlocks (fair=False)": lib(3600, 0.7, 0.2),
            "ref: BLPOP token": lib(5000, 1.0)}  # a reference row is never a peer
    assert _verdicts(judge(data)) == [True, True, True, True]
    data["python-redis-lock"] = lib(2100, 0.99)  # a fair peer beats rlocks
    data["rlocks (fair=False)"] = lib(3600, 0.7, 0.05)  # one worker starves
    assert _verdicts(judge(data)) == [True, False, True, False]
    data["rlocks"] = lib(2000, 0.80)
    assert _verdicts(judge(data))[0] is False
    del data["python-redis-lock"]  # no fair peer: nothing to beat
    assert judge(data)[1].ok is True
    un = judge(data, "rlocks.RLock has no fair= (issue 12)")
    assert _verdicts(un)[2:] == [None, None]
    assert un[2].measured == "unavailable: rlocks.RLock has no fair= (issue 12)"
    assert _verdicts(judge({})) == [None, None, None, None]
    v = variant_adapters()[0]
    assert v.key == "rlocks (fair=False)" and get_adapter(v.key) is v
    assert v.unavailable_reason() in (None, "rlocks.RLock has no fair= (issue 12)")
    q = quorum_adapters()[0]  # issue 13: without the runner's 2 more masters, says so
    assert q.key == "rlocks (Quorum, 3)" and get_adapter(q.key) is q and not q.reentrant
    if QUORUM_ENV not in os.environ:
        assert "2 more local masters" in (q.unavailable_reason() or ""), q.unavailable_reason()
    # target 3: 8 vs 1 waiting processes
    pts = [{"waiters": 1, "ops_per_s": 1000.0, "handoff_p50_ns": 100.0},
           {"waiters": 8, "ops_per_s": 900.0, "handoff_p50_ns": 120.0}]
    assert _verdicts(scaling_targets(pts)) == [True, True]
    pts[1] = {"waiters": 8, "ops_per_s": 360.0, "handoff_p50_ns": 121.0}
    assert _verdicts(scaling_targets(pts)) == [False, False]
    assert _verdicts(scaling_targets(pts[1:])) == [None, None]  # no 1-waiter point
    # target 4: Jain within a class of worker, longest wait per class
    st = class_stats([{"sections": 10, "max_wait_ns": 5, "timeouts": 0},
                      {"sections": 10, "max_wait_ns": 8, "timeouts": 1}], 2.0)
    assert st["jain"] == 1.0 and st["longest_wait_ns"] == 8 and st["sections_per_s"] == 10
    assert class_target("w", st).ok is True
    assert class_target("w", {"jain": 0.9}).ok is False and class_target("w", None).ok is None
    # target 5: cost with 1,000 holders vs 1, renewal per held primitive per ttl/3
    assert renewal_per_hold(120, 600, 2, 3.0, 0.5) == (10.0, 50.0)
    assert all(math.isnan(x) for x in renewal_per_hold(1, 1, 0, 1.0, 1.0))
    cyc = {"Semaphore, 1": {"p50": 100.0}, "Semaphore, 1000": {"p50": 130.0},
           "RWLock.read_lock, 1": {"p50": 100.0}, "RWLock.read_lock, 1000": {"p50": 660.0}}
    hd = {"holders": 1000, "cycles": cyc, "renewal_1": {"cmds_per_hold_per_period": 3.0},
          "renewal_1000": {"cmds_per_hold_per_period": 3.0}}
    assert _verdicts(holders_targets(hd)) == [True, False, True]
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
