"""The history checker (tests/history): its rules on made-up histories, then short seeded
runs of every primitive under every fault, on one server and on a cluster, with threads
and with asyncio tasks.

The made-up histories show each rule can fail: a history that breaks it is caught, and
the nearest one that keeps it passes. The runs are the referee's short version (the
soak, ``python -m tests.history``, runs any length); they are marked ``history`` so that
lanes other than the README command's may leave them out.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest

from tests._servers import server_version
from tests.history.check import Params, check
from tests.history.run import RunConfig, run

P = Params(ttl=1.0, entry_lease=0.5, permits=2)


def acq(w: str, th: str, h: str, inv: float, ret: float, *, p: str = "rlock", s: str = "x",
        o: str = "ok", d: int = 1, new: bool = True, tok: Optional[int] = None) -> Dict[str, Any]:
    return dict(a="acquire", w=w, th=th, p=p, s=s, h=h, d=d, new=new, inv=inv, ret=ret, o=o,
                tok=tok)


def rel(w: str, th: str, h: str, t: float, *, p: str = "rlock", s: str = "x",
        o: str = "ok") -> List[Dict[str, Any]]:
    return [dict(a="release_call", w=w, th=th, p=p, s=s, h=h, inv=t),
            dict(a="release", w=w, th=th, p=p, s=s, h=h, end=True, inv=t, ret=t + 0.001, o=o)]


def hold(w: str, th: str, h: str, start: float, end: float, **kw: Any) -> List[Dict[str, Any]]:
    o = kw.pop("o", "ok")
    return [acq(w, th, h, start - 0.01, start, **kw)] + rel(
        w, th, h, end, **{k: v for k, v in kw.items() if k in ("p", "s")}, o=o)


def fault(kind: str, inv: float, ret: float, target: Optional[str] = None) -> Dict[str, Any]:
    return dict(a="fault", w="nemesis", k=kind, target=target, inv=inv, ret=ret, recover=0.0)


def rules(events: List[Dict[str, Any]], params: Params = P, log=()) -> List[str]:
    return sorted({v.rule for v in check(events, params, log).violations})


# -- safety ------------------------------------------------------------------------------------


def test_holds_in_turn_pass():
    events = hold("w1", "t1", "a", 1.0, 1.2, tok=1) + hold("w2", "t1", "b", 1.3, 1.5, tok=2)
    assert rules(events) == []


def test_two_untold_holds_that_overlap_break_exclusion():
    events = hold("w1", "t1", "a", 1.0, 1.2) + hold("w2", "t1", "b", 1.1, 1.5)
    assert rules(events) == ["exclusion"]


def test_an_overlapped_hold_must_be_the_one_told():
    told_later = hold("w1", "t1", "a", 1.0, 1.2) + hold("w2", "t1", "b", 1.1, 1.5, o="lost")
    assert "untold-loss" in rules(told_later)
    told_first = hold("w1", "t1", "a", 1.0, 1.2, o="lost") + hold("w2", "t1", "b", 1.1, 1.5)
    stop = [fault("stop_worker", 0.5, 1.15, "w1")]
    assert rules(told_first + stop) == []


def test_when_a_failover_forked_two_grants_either_may_be_the_one_told():
    # The later hold's token is smaller: its server had not seen the earlier grant. Which
    # one the surviving server kept, the order of the returns cannot tell: one told will
    # do (rule 1). Without the failover, or with tokens in grant order, rule 5 stands.
    def run(first_tok: int, later_tok: int, failover: bool) -> List[str]:
        events = (hold("w1", "t1", "a", 1.0, 1.2, tok=first_tok)
                  + hold("w2", "t1", "b", 1.1, 1.5, o="lost", tok=later_tok)
                  + [fault("failover" if failover else "stop_worker", 0.9, 1.3,
                           None if failover else "w2")])
        return rules(events)

    assert run(10, 8, failover=True) == []
    assert "untold-loss" in run(10, 8, failover=False)
    assert "untold-loss" in run(8, 10, failover=True)


def test_on_lost_soon_after_a_release_cut_short_tells_that_hold():
    # A cancelled release settles the hold after it returns; a loss it finds is told by
    # on_lost alone. A release that finished, or an on_lost long after, tells nothing.
    def run(release_o: str, on_lost_at: float) -> List[str]:
        events = (hold("w1", "t1", "a", 1.0, 1.2, o=release_o)
                  + [dict(a="on_lost", w="w1", p="rlock", obj="a", t=on_lost_at)]
                  + hold("w2", "t1", "b", 1.1, 1.5)
                  + [fault("stop_worker", 0.5, 1.05, "w1")])
        return rules(events)

    assert run("cancelled", 1.25) == []
    assert "exclusion" in run("ok", 1.25)
    assert "exclusion" in run("cancelled", 2.5)


def test_a_hold_is_told_by_owned_on_lost_or_a_reentry():
    for telling in (dict(a="owned", w="w1", th="t1", p="rlock", s="x", h="a", t=1.15, o="false"),
                    dict(a="on_lost", w="w1", p="rlock", obj="a", t=1.15),
                    acq("w1", "t1", "a", 1.15, 1.16, o="lost", d=2, new=False)):
        events = (hold("w1", "t1", "a", 1.0, 1.2) + [telling] + hold("w2", "t1", "b", 1.1, 1.5)
                  + [fault("stop_worker", 0.5, 1.05, "w1")])
        assert rules(events) == [], telling


def test_a_killed_holder_holds_until_it_was_reaped():
    events = [acq("w1", "t1", "a", 0.9, 1.0), fault("kill_worker", 1.5, 1.6, "w1")]
    assert rules(events + hold("w2", "t1", "b", 2.7, 2.8)) == []
    assert rules(events + hold("w2", "t1", "b", 1.55, 2.8)) == ["exclusion"]


def test_readers_share_and_a_writer_excludes():
    readers = hold("w1", "t1", "a", 1.0, 1.5, p="rw", s="r") + hold("w2", "t1", "b", 1.1, 1.2, p="rw", s="r")
    assert rules(readers) == []
    writer = hold("w3", "t1", "c", 1.3, 1.4, p="rw", s="w")
    assert rules(readers + writer) == ["exclusion"]


def test_permits_cap_untold_holds():
    two = hold("w1", "t1", "a", 1.0, 1.5, p="sem", s="p") + hold("w2", "t1", "b", 1.1, 1.6, p="sem", s="p")
    assert rules(two) == []
    assert rules(two + hold("w3", "t1", "c", 1.2, 1.3, p="sem", s="p")) == ["permits"]


def test_a_bounded_semaphore_refuses_a_release_of_nobodys_permit():
    ok = dict(a="spurious", w="w1", th="t1", p="bsem", s="p", inv=1.0, ret=1.01, o="ok")
    assert rules([ok]) == ["bounded"]
    assert rules([dict(ok, o="refused")]) == []


def test_tokens_grow_with_the_grants():
    assert rules(hold("w1", "t1", "a", 1.0, 1.1, tok=5) + hold("w2", "t1", "b", 1.3, 1.4, tok=4)) \
        == ["token-order"]
    assert rules(hold("w1", "t1", "a", 1.0, 1.1, tok=5) + hold("w2", "t1", "b", 1.3, 1.4, tok=5)) \
        == ["token-order"]
    # Asked for before the other returned: no order is known between the two grants.
    overlapping = hold("w1", "t1", "a", 1.0, 1.1, tok=5) + [acq("w2", "t1", "b", 0.95, 1.2, tok=4)]
    assert rules(overlapping + rel("w2", "t1", "b", 1.3)) == []


def test_the_fenced_store_takes_no_late_write():
    events = hold("w1", "t1", "a", 1.0, 1.1, tok=1) + hold("w2", "t1", "b", 1.3, 1.4, tok=2)
    refused = dict(a="write", w="w1", th="t1", p="rlock", s="x", h="a", tok=1, inv=1.05,
                   ret=1.06, o="refused")
    assert rules(events + [refused]) == ["fence"]
    assert rules(events, log=[("rlock", 1, "a"), ("rlock", 2, "b")]) == []
    assert rules(events, log=[("rlock", 2, "b"), ("rlock", 2, "a")]) == ["fence"]


def test_a_release_that_failed_on_the_link_in_a_fault_tells_its_hold():
    # w1's grant was lost with its master (killed); w2 is granted by the promoted replica
    # while w1 still holds; w1's release then meets the dead master: an error, unanswered.
    events = hold("w1", "t1", "a", 1.0, 1.5, p="bsem", s="p") + hold(
        "w2", "t1", "b", 1.2, 1.6, p="bsem", s="p") + hold(
        "w3", "t1", "c", 1.3, 1.7, p="bsem", s="p")
    for e in events:
        if e["a"] == "release" and e["h"] == "a":
            e["o"] = "error"
    assert rules(events) == ["error", "permits"]  # no fault: both are violations
    assert rules(events + [fault("kill_master", 1.1, 1.4)]) == []


def test_a_loss_with_no_fault_near_it_is_false():
    lost = hold("w1", "t1", "a", 1.0, 1.1, o="lost")
    assert rules(lost) == ["false-loss"]
    assert rules(lost + [fault("client_kill", 0.5, 0.51)]) == []
    assert rules(lost + [fault("stop_worker", 0.5, 0.9, "w2")]) == ["false-loss"]
    callback = [dict(a="on_lost", w="w1", p="rlock", obj="a", t=1.5)]
    assert rules(hold("w1", "t1", "a", 1.0, 1.1) + callback) == ["false-loss"]


def test_a_call_that_fails_outside_the_faults_is_an_error():
    failed = [acq("w1", "t1", "a", 1.0, 1.1, o="error")]
    assert rules(failed) == ["error"]
    assert rules(failed + [fault("restart", 0.5, 0.6)]) == []


# -- liveness ----------------------------------------------------------------------------------


def test_a_free_lock_with_a_waiter_stalls():
    waited = [acq("w1", "t1", "a", 1.0, 9.0, o="false")]
    assert rules(waited) == ["stall"]
    assert rules(waited + [fault("kill_master", 1.0, 6.0)]) == []
    # Out of the faults' reach long enough on both sides of one: still a stall.
    assert rules(waited + [fault("pause_server", 4.5, 4.6)]) == ["stall"]
    held = hold("w2", "t1", "b", 0.5, 8.9)
    assert rules(waited + held) == []


def test_a_fair_lock_serves_waiters_in_order_of_arrival():
    warm = hold("w1", "t1", "a0", 0.1, 0.2)  # w1.t1's first call: its arrival is unknown
    first = [acq("w1", "t1", "a", 1.0, 3.0)] + rel("w1", "t1", "a", 3.1)
    overtaker = [acq("w2", "t1", "b", 1.5, 2.0)] + rel("w2", "t1", "b", 2.9)
    holder = hold("w3", "t1", "c", 0.5, 1.9)
    assert rules(warm + first + overtaker + holder) == ["fifo"]
    assert rules(warm + first + overtaker + holder, Params(1.0, 0.5, 2, fair=False)) == []
    close = [acq("w2", "t1", "b", 1.1, 2.0)] + rel("w2", "t1", "b", 2.9)
    assert rules(warm + first + close + holder) == []
    # A thread's first call may spend its first moments connecting and loading scripts
    # before it reaches the queue: it is not judged as the earlier one.
    assert rules(first + overtaker + holder) == []


def test_a_notification_reaches_a_waiter():
    waiter = hold("w1", "t1", "a", 1.0, 1.05, p="cond") + [
        dict(a="wait_call", w="w1", th="t1", p="cond", s="x", h="a", inv=1.05, to=20.0)]
    notify = hold("w2", "t1", "n", 2.0, 2.1, p="cond") + [
        dict(a="notify", w="w2", th="t1", p="cond", s="x", h="n", n=1, inv=2.05, ret=2.06, o="ok")]
    end = [dict(a="exit", w="w3", t=30.0)]

    def woken(o: str, ret: float) -> List[Dict[str, Any]]:
        return [dict(a="wait", w="w1", th="t1", p="cond", s="x", h="a", new="a2", inv=1.05,
                     ret=ret, o=o, to=20.0)] + rel("w1", "t1", "a2", ret + 0.01, p="cond")

    assert rules(waiter + notify + woken("ok", 2.2) + end) == []
    assert rules(waiter + notify + woken("false", 21.05) + end) == ["notify"]


def test_a_worker_that_does_not_stop_is_hung():
    assert rules([dict(a="hung", w="nemesis", target="w1", t=5.0)]) == ["hung"]


# -- the Barrier ----------------------------------------------------------------------------


def generation(first: float, parties: int = 3, *, ran: bool = True, o: str = "ok",
               gen: int = 0) -> List[Dict[str, Any]]:
    """``parties`` threads (of workers w1, w2, ...) wait from ``first`` on; the last runs
    the action (when ``ran``) at ``first + 0.1``; each returns ``o`` at ``first + 0.2``."""
    events: List[Dict[str, Any]] = []
    for i in range(parties):
        w, th, inv = f"w{i + 1}", f"b{gen}", first + 0.01 * i
        events.append(dict(a="bwait_call", w=w, th=th, inv=inv, obj="a", to=3.0, tid=i))
        events.append(dict(a="bwait", w=w, th=th, inv=inv, ret=first + 0.2, o=o,
                           idx=i if o == "ok" else None, obj="a"))
    if ran:
        events.append(dict(a="bpass", w=f"w{parties}", p="barrier", obj="a", t=first + 0.1,
                           tid=parties - 1))
    return events


def test_generations_that_pass_in_turn_keep_the_barrier_rules():
    events = generation(1.0) + generation(2.0, gen=1) + generation(3.0, ran=False, o="broken",
                                                                   gen=2)
    assert rules(events) == []


def test_a_generation_that_passes_before_every_party_arrived_is_early():
    events = generation(1.0)
    late = [e for e in events if e["a"] == "bwait_call" and e["w"] == "w1"][0]
    late["inv"] = 1.15  # its wait was called after the action ran
    assert rules(events) == ["barrier-early"]


def test_a_wait_that_returns_before_any_action_ran_is_counted_out():
    events = generation(1.0)
    for e in events:
        if e["a"] == "bpass":
            e["t"] = 1.25  # the action ran after the waits returned
    assert rules(events) == ["barrier-count"]


def test_an_action_whose_generation_then_broke_is_not_a_pass():
    # The action ran, then the generation broke (every wait broken): not a pass, so a
    # next generation that passes with fewer calls than two generations' is not early.
    events = generation(1.0, ran=True, o="broken") + generation(2.0, gen=1)
    assert rules(events) == []
    events = generation(1.0, ran=True, o="ok") + generation(2.0, gen=1)
    for e in events:
        if e["a"] == "bwait_call" and e["th"] == "b1" and e["w"] == "w3":
            e["inv"] = 2.15  # late for the second generation
    assert rules(events) == ["barrier-early"]


def test_a_pass_a_failover_lost_may_pass_again_after_it():
    # A, B, C arrive; C, last, runs the action and returns; the pass is lost with the
    # master (A and B never heard it): on the promoted replica A and B wait on, and pass
    # with D. Four waits, two passes: early, unless a fault that may lose writes is near.
    def call(w: str, inv: float, tid: int) -> Dict[str, Any]:
        return dict(a="bwait_call", w=w, th="t", inv=inv, obj="a", to=3.0, tid=tid)

    def ret(w: str, inv: float, at: float, idx: int) -> Dict[str, Any]:
        return dict(a="bwait", w=w, th="t", inv=inv, ret=at, o="ok", idx=idx, obj="a")

    events = [call("A", 1.0, 1), call("B", 1.01, 2), call("C", 1.02, 3),
              dict(a="bpass", w="C", p="barrier", obj="a", t=1.1, tid=3),
              ret("C", 1.02, 1.2, 2),
              call("D", 1.6, 4), dict(a="bpass", w="D", p="barrier", obj="a", t=1.7, tid=4),
              ret("A", 1.0, 1.8, 0), ret("B", 1.01, 1.8, 1), ret("D", 1.6, 1.8, 2)]
    assert rules(events) == ["barrier-early"]
    assert rules(events + [fault("failover", 1.15, 1.5)]) == []
    assert rules(events + [fault("client_kill", 1.15, 1.5)]) == ["barrier-early"]


def test_a_party_whose_passed_outcome_a_restart_lost_may_hear_broken():
    # The generation passed (its runner returned), then Redis restarted without
    # persistence before w1 and w2 looked: they hear "broken" for waits that arrived.
    events = generation(1.0)
    for e in events:
        if e["a"] == "bwait" and e["w"] in ("w1", "w2"):
            e.update(o="broken", idx=None, ret=1.5)
    assert rules(events) == ["barrier-early"]
    assert rules(events + [fault("restart", 1.2, 1.4)]) == []


def test_a_barrier_wait_long_past_its_timeout_is_slow_unless_a_fault_was_near():
    events = generation(1.0)
    for e in events:
        if e["a"] == "bwait" and e["w"] == "w1":
            e["ret"] = 9.0
    assert rules(events) == ["barrier-slow"]
    assert rules(events + [fault("stop_worker", 2.0, 3.0, target="w2")]) == []


# -- the runs ----------------------------------------------------------------------------------


def _judge(result: Any) -> None:
    assert result.ok, (f"{result.report.summary(40)}\n(history in {result.folder})")
    stats = result.report.stats
    kinds = ("rlock", "lock", "rw", "sem", "bsem", "cond", "barrier")
    assert all(stats["sections"].get(k, 0) > 10 for k in kinds), stats


@pytest.mark.history
@pytest.mark.parametrize("driver, persist, seed", [("thread", True, 11), ("asyncio", False, 12)])
def test_history_single_server(driver: str, persist: bool, seed: int, tmp_path) -> None:
    cfg = RunConfig(seed=seed, seconds=22, driver=driver, persist=persist, quiet=(0.8, 1.6),
                    out=str(tmp_path))
    result = run(cfg)
    _judge(result)
    assert set(result.report.stats["faults"]) == set(cfg.fault_kinds()), result.report.stats


@pytest.mark.history
@pytest.mark.parametrize("driver, seed", [("thread", 13), ("asyncio", 14)])
def test_history_cluster(driver: str, seed: int, tmp_path) -> None:
    if server_version() < (7, 0):
        pytest.skip(f"the cluster needs redis-server 7.0 or newer; found {server_version()}")
    cfg = RunConfig(seed=seed, seconds=36, driver=driver, topology="cluster", quiet=(0.8, 1.6),
                    out=str(tmp_path))
    result = run(cfg)
    _judge(result)
    assert set(result.report.stats["faults"]) == set(cfg.fault_kinds()), result.report.stats
