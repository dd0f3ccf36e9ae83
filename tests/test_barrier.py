"""rlocks.Barrier and rlocks.asyncio.Barrier: CPython's BarrierTests, generations across
processes, a party killed while waiting, the action, re-sent scripts, misuse, lifetimes,
the asyncio twin.

Waits are for states (a party count, a report in a Redis list, a process's end), each
bounded; no test asserts how long something took.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import multiprocessing
import os
import signal
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

import pytest
import redis
import redis.asyncio

import rlocks
import rlocks.asyncio
from rlocks._engine import barrier as engine
from rlocks._engine.backends import backend_for
from rlocks._engine.scripts import GRANTED, LOST, MISMATCH, WAIT, Call, Reply
from rlocks.asyncio.barrier import Barrier as ABarrier
from rlocks.barrier import Barrier
from rlocks.errors import BrokenBarrierError

from ._procs import make_client
from ._servers import wait_until
from ._threads import joined, started
from .conftest import NAMESPACE, script_calls

lock_tests = pytest.importorskip(
    "test.lock_tests",
    reason="this Python has no stdlib test package (Debian: install libpython3-testsuite)",
)

from .test_lock_tests import _shared_client_and_warm_engine  # noqa: E402,F401 - autouse

SPAWN = multiprocessing.get_context("spawn")
EXIT_OK, EXIT_FAILED = 0, 3

_serial = itertools.count()


def _unique(prefix: str = "barrier") -> str:
    return f"{prefix}-{uuid.uuid4().hex}-{next(_serial)}"


# -- CPython's contract --------------------------------------------------------------------


def make_barrier(parties: int, action: Any = None, timeout: Optional[float] = None) -> Barrier:
    # A new name per call: setUp builds one, test_abort_and_reset a second.
    from . import test_lock_tests

    return Barrier(_unique("lock-tests"), parties, action, timeout,
                   client=test_lock_tests._client, namespace=NAMESPACE)


REPR_REASON = (
    "repr does no I/O, so it cannot say how many parties wait in other processes or "
    "whether the barrier is broken; it shows the name and parties instead of "
    "threading's 'waiters=2/3' / 'broken' (see test_repr_is_local_and_names_the_barrier)"
)


class TestBarrier(lock_tests.BarrierTests):
    barriertype = staticmethod(make_barrier)

    @pytest.mark.skip(reason=REPR_REASON)
    def test_repr(self) -> None:  # pragma: no cover
        pass


class TestThreadingBarrierControl(lock_tests.BarrierTests):
    """The control row: the same contract on ``threading.Barrier``."""

    barriertype = staticmethod(threading.Barrier)


def test_repr_is_local_and_names_the_barrier(client: Any, name: str) -> None:
    b = Barrier(name, 3, client=client, namespace=NAMESPACE)
    before = script_calls(client)
    text = repr(b)
    assert "rlocks.Barrier" in text and repr(name) in text and "parties=3" in text
    assert script_calls(client) == before
    assert b.parties == 3 and b.name == name and b.timeout is None and b.action is None


# -- helpers ---------------------------------------------------------------------------------


def fields(client: Any, b: Any) -> Dict[str, str]:
    """The barrier's hash, decoded (``lua/barrier_lib.lua``)."""
    return {k.decode(): v.decode() for k, v in client.hgetall(b._keys.hash).items()}


def parties_in(client: Any, b: Any) -> Dict[str, str]:
    """Each party's field: owner -> '<state> <gen> <index> <call> <lease ms>'."""
    return {k[2:]: v for k, v in fields(client, b).items() if k.startswith("a:")}


def waiting_threads(b: Barrier, n: int, timeout: Optional[float] = None,
                    ) -> List[Tuple[threading.Thread, Dict[str, Any]]]:
    """``n`` threads waiting on ``b`` (returned once all ``n`` arrived)."""
    threads = [started(lambda: b.wait(timeout)) for _ in range(n)]
    wait_until(lambda: b.n_waiting == n, 30, f"{n} parties waiting")
    return threads


# -- semantics -------------------------------------------------------------------------------


def test_indices_are_unique_per_generation_over_many_generations(client: Any, name: str) -> None:
    b = Barrier(name, 3, client=client, namespace=NAMESPACE)
    seen: List[List[int]] = [[], [], []]

    def party(i: int) -> None:
        for _ in range(30):
            seen[i].append(b.wait(timeout=30))

    threads = [started(lambda i=i: party(i)) for i in range(3)]
    for t in threads:
        joined(*t)
    for gen in range(30):
        assert sorted(s[gen] for s in seen) == [0, 1, 2]


def test_a_broken_barrier_refuses_at_once_until_reset(client: Any, name: str) -> None:
    b = Barrier(name, 2, client=client, namespace=NAMESPACE)
    b.abort()
    assert b.broken and b.n_waiting == 0
    with pytest.raises(threading.BrokenBarrierError, match=repr(name)) as caught:
        b.wait(timeout=30)
    assert isinstance(caught.value, BrokenBarrierError) and caught.value.name == name
    b.reset()
    assert not b.broken
    first = started(lambda: b.wait(timeout=30))
    assert b.wait(timeout=30) in (0, 1)
    assert joined(*first) in (0, 1)


def test_abort_wakes_every_waiting_party(client: Any, name: str) -> None:
    b = Barrier(name, 3, client=client, namespace=NAMESPACE)
    threads = waiting_threads(b, 2)
    b.abort()
    for t in threads:
        with pytest.raises(BrokenBarrierError):
            joined(*t)


def test_reset_breaks_the_waiting_parties_and_starts_afresh(client: Any, name: str) -> None:
    b = Barrier(name, 3, client=client, namespace=NAMESPACE)
    threads = waiting_threads(b, 2)
    b.reset()
    for t in threads:
        with pytest.raises(BrokenBarrierError):
            joined(*t)
    assert not b.broken and b.n_waiting == 0
    again = waiting_threads(b, 2)
    assert b.wait(timeout=30) == 2
    assert sorted(joined(*t) for t in again) == [0, 1]


def test_a_time_out_breaks_the_barrier_for_the_others(client: Any, name: str) -> None:
    b = Barrier(name, 3, client=client, namespace=NAMESPACE)
    other = waiting_threads(b, 1)
    with pytest.raises(BrokenBarrierError, match="timed out"):
        b.wait(timeout=0.05)
    with pytest.raises(BrokenBarrierError):
        joined(*other[0])
    assert b.broken


def test_action_runs_once_per_generation_before_any_wait_returns(
    client: Any, name: str
) -> None:
    ran: List[int] = []
    b = Barrier(name, 3, action=lambda: ran.append(1), client=client, namespace=NAMESPACE)
    seen: List[int] = []

    def party() -> None:
        for gen in range(10):
            b.wait(timeout=30)
            seen.append(len(ran))
            assert len(ran) == gen + 1

    for t in [started(party) for _ in range(3)]:
        joined(*t)
    assert len(ran) == 10


def test_an_action_that_raises_breaks_the_barrier_and_reaches_its_runner(
    client: Any, name: str
) -> None:
    class Boom(Exception):
        pass

    def action() -> None:
        raise Boom("from the action")

    b = Barrier(name, 3, action=action, client=client, namespace=NAMESPACE)
    threads = waiting_threads(b, 2)
    with pytest.raises(Boom):
        b.wait(timeout=30)  # the last: it runs the action
    for t in threads:
        with pytest.raises(BrokenBarrierError):
            joined(*t)
    assert b.broken


def test_a_time_out_while_the_action_runs_does_not_break_the_barrier(
    redis_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # threading: the action's generation is as good as passed.
    own = redis.Redis.from_url(redis_url, socket_timeout=10)  # (its backend: this test's)
    acting, timed_out = threading.Event(), threading.Event()
    original = backend_for(own).run

    def run(call: Call) -> Reply:
        first = threading.current_thread().name == "first"
        if first and call.script in (engine._LOOK, engine._BREAK):
            assert acting.wait(30)  # its looks and its time-out come once the action runs
        reply: Reply = original(call)
        if first and call.script is engine._BREAK:
            assert reply.status == WAIT  # kept waiting: the action runs
            timed_out.set()
        return reply

    def action() -> None:
        acting.set()
        assert timed_out.wait(30)  # until the first party's time-out ran out and it asked

    monkeypatch.setattr(backend_for(own), "run", run)
    b = Barrier(name, 2, action=action, client=own, namespace=NAMESPACE)
    out: Dict[str, Any] = {}
    first = threading.Thread(target=lambda: out.update(index=b.wait(0.1)), name="first")
    first.start()
    wait_until(lambda: b.n_waiting == 1, 30, "the first party")
    assert b.wait(30) == 1
    first.join(30)
    assert out == {"index": 0}
    assert not b.broken
    own.close()


def test_an_interrupted_wait_breaks_the_barrier_then_propagates(
    redis_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = redis.Redis.from_url(redis_url, socket_timeout=10)  # (its backend: this test's)
    original = backend_for(own).run

    def run(call: Call) -> Reply:
        if call.script is engine._LOOK and threading.current_thread().name == "interrupted":
            raise KeyboardInterrupt  # as a signal handler's would, inside the call
        return original(call)

    monkeypatch.setattr(backend_for(own), "run", run)
    b = Barrier(name, 3, client=own, namespace=NAMESPACE)
    other = waiting_threads(b, 1)
    out: Dict[str, Any] = {}

    def interrupted() -> None:
        try:
            b.wait(timeout=30)
        except BaseException as exc:  # noqa: BLE001 - looked at below
            out["error"] = exc

    thread = threading.Thread(target=interrupted, name="interrupted")
    thread.start()
    thread.join(30)
    assert isinstance(out.get("error"), KeyboardInterrupt)
    with pytest.raises(BrokenBarrierError):
        joined(*other[0])
    assert b.broken
    own.close()


def test_parties_must_match_across_objects(client: Any, name: str) -> None:
    two = Barrier(name, 2, client=client, namespace=NAMESPACE)
    three = Barrier(name, 3, client=client, namespace=NAMESPACE)
    waiting = waiting_threads(two, 1)
    for attempt in (lambda: three.wait(timeout=1), three.abort, three.reset,
                    lambda: three.n_waiting, lambda: three.broken):
        with pytest.raises(ValueError, match=r"parties=3.*parties=2") as caught:
            attempt()
        assert repr(name) in str(caught.value)
    assert two.n_waiting == 1 and not two.broken  # nothing changed
    assert two.wait(timeout=30) == 1
    assert joined(*waiting[0]) == 0


def test_single_party_with_action(client: Any, name: str) -> None:
    ran: List[int] = []
    b = Barrier(name, 1, action=lambda: ran.append(1), client=client, namespace=NAMESPACE)
    assert [b.wait(), b.wait(), b.wait()] == [0, 0, 0]
    assert ran == [1, 1, 1]


# -- misuse ----------------------------------------------------------------------------------


def test_bad_arguments_raise_before_any_redis_call(client: Any, name: str) -> None:
    before = script_calls(client)
    cases: List[Tuple[type, Any]] = [
        (TypeError, lambda: Barrier(name, "3", client=client)),
        (TypeError, lambda: Barrier(name, 2.0, client=client)),
        (TypeError, lambda: Barrier(name, True, client=client)),
        (ValueError, lambda: Barrier(name, 0, client=client)),
        (ValueError, lambda: Barrier(name, -2, client=client)),
        (TypeError, lambda: Barrier(name, 2, action=5, client=client)),
        (TypeError, lambda: Barrier(name, 2, timeout="1", client=client)),
        (ValueError, lambda: Barrier(name, 2, timeout=math.nan, client=client)),
        (OverflowError, lambda: Barrier(name, 2, timeout=1e300, client=client)),
        (ValueError, lambda: Barrier(name, 2, client=client, entry_lease=0)),
        (TypeError, lambda: Barrier(name, 2, client=client, entry_lease=True)),
        (ValueError, lambda: Barrier(name, 2, client=client, namespace="")),
        (TypeError, lambda: Barrier(name, 2, client=object())),
        (TypeError, lambda: Barrier(name, 2, client=redis.asyncio.Redis())),
        (TypeError, lambda: ABarrier(name, 2, client=client)),
        (ValueError, lambda: Barrier(name, 2, client=rlocks.Quorum(
            [redis.Redis(port=p) for p in (1, 2, 3)]))),
        (TypeError, lambda: Barrier(name, 2, client=client, ttl=3)),
        (TypeError, lambda: Barrier(name)),
    ]
    for kind, make in cases:
        with pytest.raises(kind, match=r"rlocks(\.asyncio)?\.Barrier\(") as caught:
            make()
        assert repr(name) in str(caught.value), caught.value
    for bad_name, kind in ((5, TypeError), ("", ValueError)):
        with pytest.raises(kind, match=r"rlocks\.Barrier"):
            Barrier(bad_name, 2, client=client)  # type: ignore[arg-type]
    b = Barrier(name, 2, client=client, namespace=NAMESPACE)
    for timeout, kind in (("1", TypeError), (math.nan, ValueError), (1e300, OverflowError)):
        with pytest.raises(kind, match=repr(name)):
            b.wait(timeout)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cannot pickle"):
        import copy

        copy.copy(b)
    assert script_calls(client) == before


# -- the scripts, one call at a time -----------------------------------------------------------


A, B, C = "h:1:aa:1", "h:2:bb:1", "h:3:cc:1"  # three owners of three processes


def _arrive(b: Barrier, owner: str, call_id: str, entry: int = 5000,
            action: bool = False) -> Reply:
    return b._call(engine._ARRIVE, owner, call_id, entry, 1 if action else 0, 5000)(b.client)


def _script(b: Barrier, script: Any, owner: str, *more: Any) -> Reply:
    return b._call(script, owner, *more)(b.client)


def test_scripts_a_resent_arrival_counts_once(client: Any, name: str) -> None:
    b = Barrier(name, 3, client=client, namespace=NAMESPACE)
    assert _arrive(b, A, "1") == Reply(WAIT, 0)
    assert _arrive(b, A, "1") == Reply(WAIT, 0)  # the same call again: recognised
    assert fields(client, b)["n"] == "1"
    assert _arrive(b, B, "1") == Reply(WAIT, 1)
    last = _arrive(b, C, "7")
    assert (last.status, last.a, last.b) == (GRANTED, 2, 0)
    assert sorted(last.woken) == [A, B]  # hinted, not the caller
    assert _arrive(b, C, "7") == Reply(GRANTED, 2, 0)  # re-sent after it passed: the same
    f = fields(client, b)
    assert (f["gen"], f["n"]) == ("1", "0")
    assert _script(b, engine._LOOK, A, "1", 5000) == Reply(GRANTED, 0, 0)
    assert _script(b, engine._LOOK, A, "1", 5000) == Reply(GRANTED, 0, 0)  # and again
    # A new wait of A (another call id) is a new arrival in the next generation.
    assert _arrive(b, A, "2") == Reply(WAIT, 0)
    assert fields(client, b)["n"] == "1"
    assert _script(b, engine._LOOK, B, "1", 5000) == Reply(GRANTED, 1, 0)


def test_scripts_the_action_and_its_pass_are_safe_to_send_again(
    client: Any, name: str
) -> None:
    b = Barrier(name, 2, client=client, namespace=NAMESPACE)
    assert _arrive(b, A, "1", action=True) == Reply(WAIT, 0)
    assert _arrive(b, B, "1", action=True) == Reply(GRANTED, 1, 1)  # run the action
    assert _arrive(b, B, "1", action=True) == Reply(GRANTED, 1, 1)  # asked again
    assert fields(client, b)["act"] == B
    assert _arrive(b, C, "1", action=True) == Reply(WAIT, -1)  # queued behind it
    assert _script(b, engine._BREAK, A, "1", "t") == Reply(WAIT, 0)  # no time-out now
    passed = _script(b, engine._PASS, B, "1")
    assert (passed.status, passed.a) == (GRANTED, 1) and sorted(passed.woken) == [A, C]
    assert _script(b, engine._PASS, B, "1") == Reply(GRANTED, 1, 0)
    assert fields(client, b)["gen"] == "1"
    assert _arrive(b, C, "1", action=True) == Reply(WAIT, 0)  # now it arrives
    assert _script(b, engine._LOOK, A, "1", 5000) == Reply(GRANTED, 0, 0)


def test_scripts_a_dead_waiting_party_breaks_the_barrier(client: Any, name: str) -> None:
    b = Barrier(name, 3, client=client, namespace=NAMESPACE)
    assert _arrive(b, A, "1", entry=5000) == Reply(WAIT, 0)
    assert _arrive(b, B, "1", entry=5000) == Reply(WAIT, 1)
    client.zadd(b._keys.leases, {A: 1})  # A's lease ended long ago: its process died
    broken = _script(b, engine._LOOK, B, "1", 5000)
    assert (broken.status, broken.a) == (LOST, 0)
    assert fields(client, b)["broken"] == "1" and A not in parties_in(client, b)
    assert _script(b, engine._LOOK, A, "1", 5000) == Reply(LOST, 1)  # A's entry is gone
    assert _arrive(b, C, "1") == Reply(LOST, 0)
    assert 86_000_000 < client.pttl(b._keys.hash)  # broken: kept a day


def test_scripts_mismatch_changes_nothing(client: Any, name: str) -> None:
    b = Barrier(name, 3, client=client, namespace=NAMESPACE)
    other = Barrier(name, 4, client=client, namespace=NAMESPACE)
    _arrive(b, A, "1")
    before = client.hgetall(b._keys.hash)
    for script in (engine._ARRIVE, engine._ABORT, engine._RESET, engine._PEEK):
        more = ("1", 5000, 0, 5000) if script is engine._ARRIVE else ()
        assert _script(other, script, B, *more) == Reply(MISMATCH, 3)
    assert client.hgetall(b._keys.hash) == before


# -- lifetimes -------------------------------------------------------------------------------


def test_an_idle_barrier_leaves_no_key(client: Any, name: str) -> None:
    b = Barrier(name, 2, client=client, namespace=NAMESPACE, entry_lease=0.2)

    def generation() -> None:
        other = started(lambda: b.wait(timeout=30))
        b.wait(timeout=30)
        joined(*other)

    generation()
    # The outcomes live out their leases (so a re-sent call finds them), then go.
    assert 0 < client.pttl(b._keys.hash) <= 200
    wait_until(lambda: not client.exists(b._keys.hash, b._keys.leases), 10, "the keys to go")
    generation()
    b.reset()  # every party collected its outcome: the keys go at once
    assert not client.exists(b._keys.hash, b._keys.leases)
    b.abort()
    assert client.pttl(b._keys.hash) > 86_000_000  # broken: kept a day
    b.reset()
    assert not client.exists(b._keys.hash, b._keys.leases)


def test_scripts_reset_does_not_undo_a_pass_not_yet_collected(client: Any, name: str) -> None:
    b = Barrier(name, 2, client=client, namespace=NAMESPACE)
    assert _arrive(b, A, "1") == Reply(WAIT, 0)
    assert _arrive(b, B, "1").status == GRANTED
    assert _script(b, engine._RESET, C) == Reply(GRANTED)
    assert _script(b, engine._LOOK, A, "1", 5000) == Reply(GRANTED, 0, 0)
    assert _script(b, engine._RESET, C) == Reply(GRANTED)  # all collected now: keys go
    assert not client.exists(b._keys.hash, b._keys.leases)


def test_a_lost_arrival_reply_is_sent_again_and_counts_once(
    redis_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = redis.Redis.from_url(redis_url, socket_timeout=10)  # (its backend: this test's)
    original = backend_for(own).run
    lost: List[Call] = []

    def run(call: Call) -> Reply:
        reply: Reply = original(call)
        if call.script is engine._ARRIVE and not lost:
            lost.append(call)
            raise redis.ConnectionError("the reply was lost (test)")
        return reply

    monkeypatch.setattr(backend_for(own), "run", run)
    b = Barrier(name, 2, client=own, namespace=NAMESPACE)
    first = started(lambda: b.wait(timeout=30))
    wait_until(lambda: bool(lost), 30, "the first arrival")
    # Sent again, it counted once: the generation waits for a second party.
    wait_until(lambda: b.n_waiting == 1, 30, "one party waiting")
    assert first[0].is_alive()
    assert b.wait(timeout=30) == 1
    assert joined(*first) == 0
    own.close()


# -- processes -------------------------------------------------------------------------------


def generations_worker(spec: Dict[str, Any], name: str, namespace: str, data: str,
                       parties: int, gens: int, with_action: bool) -> None:
    """``gens`` waits on ``Barrier(name, parties)``; pushes ``[pid, indices]`` to
    ``{data}:seen``. With an action (RPUSH ``{data}:actions``), checks after each wait
    that exactly one action per generation so far has run."""
    client = make_client(spec)
    try:
        def action() -> None:
            client.rpush(f"{data}:actions", os.getpid())

        b = Barrier(name, parties, action if with_action else None, client=client,
                    namespace=namespace)
        seen = []
        for gen in range(gens):
            seen.append(b.wait(timeout=60))
            if with_action:
                ran = client.llen(f"{data}:actions")
                assert ran == gen + 1, f"{ran} actions after generation {gen}"
        client.rpush(f"{data}:seen", json.dumps([os.getpid(), seen]))
    except BaseException:  # noqa: BLE001 - reported, then the exit code says it failed
        _report(client, data)
        os._exit(EXIT_FAILED)
    os._exit(EXIT_OK)


def _report(client: Any, data: str) -> None:
    import traceback

    try:
        client.rpush(f"{data}:errors", f"pid {os.getpid()}:\n{traceback.format_exc()}")
    except Exception:  # noqa: BLE001 - the exit code still says it failed
        pass


def _run(procs: List[Any], client: Any, data: str, timeout: float = 120) -> None:
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    errors = [e.decode() for e in client.lrange(f"{data}:errors", 0, -1)]
    assert not errors, "\n".join(errors)
    assert [p.exitcode for p in procs] == [EXIT_OK] * len(procs)


def test_four_processes_pass_a_thousand_generations(target: Tuple[Any, Dict[str, Any]],
                                                    name: str) -> None:
    client, spec = target
    data = f"{NAMESPACE}:data:{name}"
    procs = [SPAWN.Process(target=generations_worker,
                           args=(spec, name, NAMESPACE, data, 4, 1000, False))
             for _ in range(4)]
    for p in procs:
        p.start()
    _run(procs, client, data)
    seen = [json.loads(s)[1] for s in client.lrange(f"{data}:seen", 0, -1)]
    assert len(seen) == 4
    for gen in range(1000):
        assert sorted(s[gen] for s in seen) == [0, 1, 2, 3], f"generation {gen}"


def test_the_action_runs_once_per_generation_across_processes(
    client: Any, redis_url: str, name: str
) -> None:
    data = f"{NAMESPACE}:data:{name}"
    procs = [SPAWN.Process(target=generations_worker,
                           args=({"url": redis_url}, name, NAMESPACE, data, 3, 50, True))
             for _ in range(3)]
    for p in procs:
        p.start()
    _run(procs, client, data)
    assert client.llen(f"{data}:actions") == 50


def killed_party_worker(spec: Dict[str, Any], name: str, namespace: str, data: str,
                        role: str, gens: int, entry_lease: float, go: Any) -> None:
    """``gens`` generations of ``Barrier(name, 4)``, then by ``role``:

    (Each pushes its role to ``{data}:ready`` first.)

    - ``victim``: waits again (the test kills it while it waits);
    - ``waiter``: waits again: must raise BrokenBarrierError (pushes ``{data}:broken``);
    - ``late``: once ``go`` is set, waits: BrokenBarrierError at once; then reset().

    Survivors then pass ``gens`` generations of ``Barrier(name + "-3", 3)`` (pushes
    ``[pid, indices]`` to ``{data}:seen``).
    """
    client = make_client(spec)
    try:
        b = Barrier(name, 4, client=client, namespace=namespace, entry_lease=entry_lease)
        for _ in range(gens):
            b.wait(timeout=60)
        client.rpush(f"{data}:ready", role)
        if role == "late":
            assert go.wait(60), "the test never let the late party go"
        try:
            b.wait()  # no time-out: only a broken barrier ends this
            raise AssertionError(f"{role}: the barrier passed with a dead party")
        except BrokenBarrierError as exc:
            assert "this wait timed out" not in str(exc)
            client.rpush(f"{data}:broken", role)
        if role == "late":
            b.reset()
            assert not b.broken
        three = Barrier(name + "-3", 3, client=client, namespace=namespace,
                        entry_lease=entry_lease)
        seen = [three.wait(timeout=60) for _ in range(gens)]
        client.rpush(f"{data}:seen", json.dumps([os.getpid(), seen]))
    except BaseException:  # noqa: BLE001 - reported, then the exit code says it failed
        _report(client, data)
        os._exit(EXIT_FAILED)
    os._exit(EXIT_OK)


def test_a_party_killed_while_waiting_breaks_the_barrier_and_the_rest_go_on(
    target: Tuple[Any, Dict[str, Any]], name: str
) -> None:
    client, spec = target
    data = f"{NAMESPACE}:data:{name}"
    lease, gens = 0.5, 500  # 1,000 generations in all, the victim killed midway
    go = SPAWN.Event()
    roles = ["victim", "waiter", "waiter", "late"]
    procs = [SPAWN.Process(target=killed_party_worker,
                           args=(spec, name, NAMESPACE, data, role, gens, lease, go))
             for role in roles]
    for p in procs:
        p.start()
    watcher = Barrier(name, 4, client=client, namespace=NAMESPACE)
    try:
        # The victim and both waiters wait in generation `gens`; the late one holds back.
        wait_until(lambda: (client.llen(f"{data}:ready") == 4 and watcher.n_waiting == 3)
                   or any(p.exitcode is not None for p in procs), 120, "three parties waiting")
        assert all(p.exitcode is None for p in procs), client.lrange(f"{data}:errors", 0, -1)
        victim = procs[0]
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        assert victim.exitcode == -signal.SIGKILL
        # The two waiting parties break the barrier once the victim's lease ended.
        wait_until(lambda: client.llen(f"{data}:broken") == 2
                   or client.llen(f"{data}:errors") > 0, 60, "the waiters to break")
        go.set()
    finally:
        go.set()
        _run(procs[1:], client, data)
    assert sorted(r.decode() for r in client.lrange(f"{data}:broken", 0, -1)) == [
        "late", "waiter", "waiter"]
    seen = [json.loads(s)[1] for s in client.lrange(f"{data}:seen", 0, -1)]
    assert len(seen) == 3
    for gen in range(gens):
        assert sorted(s[gen] for s in seen) == [0, 1, 2], f"generation {gen}"


# -- asyncio ---------------------------------------------------------------------------------


def test_asyncio_parties_pass_abort_reset_and_peek(redis_url: str, name: str) -> None:
    async def main() -> None:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        try:
            ran: List[int] = []

            async def action() -> None:
                await asyncio.sleep(0)
                ran.append(1)

            b = ABarrier(name, 3, action, client=aclient, namespace=NAMESPACE)
            assert b.parties == 3
            for _ in range(3):
                got = await asyncio.gather(*(b.wait(30) for _ in range(3)))
                assert sorted(got) == [0, 1, 2]
            assert ran == [1, 1, 1]
            assert await b.n_waiting() == 0 and not await b.broken()
            task = asyncio.ensure_future(b.wait(30))
            while await b.n_waiting() != 1:
                await asyncio.sleep(0.01)
            await b.abort()
            with pytest.raises(asyncio.BrokenBarrierError):
                await task
            assert await b.broken()
            await b.reset()
            assert not await b.broken()
            with pytest.raises(BrokenBarrierError, match="timed out"):
                await b.wait(0.05)
            # client=None: the loop's own default client (RLOCKS_URL).
            alone = ABarrier(name + "-default", 1, namespace=NAMESPACE)
            assert [await alone.wait(), await alone.wait()] == [0, 0]
            assert alone.client is not None
            await alone.reset()
        finally:
            await aclient.aclose()
            await rlocks.asyncio.aclose()

    asyncio.run(main())


def test_asyncio_a_cancelled_wait_breaks_the_barrier(redis_url: str, name: str) -> None:
    async def main() -> None:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        try:
            b = ABarrier(name, 3, client=aclient, namespace=NAMESPACE)
            first = asyncio.ensure_future(b.wait())
            second = asyncio.ensure_future(b.wait())
            while await b.n_waiting() != 2:
                await asyncio.sleep(0.01)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            with pytest.raises(BrokenBarrierError):
                await asyncio.wait_for(second, 30)
            assert await b.broken()
        finally:
            await aclient.aclose()

    asyncio.run(main())


def test_threads_and_tasks_are_parties_of_one_barrier(
    client: Any, redis_url: str, name: str
) -> None:
    b = Barrier(name, 2, client=client, namespace=NAMESPACE)
    thread = waiting_threads(b, 1)

    async def main() -> int:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        try:
            return await ABarrier(name, 2, client=aclient, namespace=NAMESPACE).wait(30)
        finally:
            await aclient.aclose()

    assert asyncio.run(main()) == 1
    assert joined(*thread[0]) == 0


def test_scripts_a_wait_that_never_left_is_not_counted_again(client: Any, name: str) -> None:
    """A's wait arrived and its leaving never reached Redis (its break was lost with the
    link, or cut by an interrupt); A's next wait must not count on top of it (two waits
    would then pass a 3-party generation): it leaves then, breaking the barrier."""
    b = Barrier(name, 3, client=client, namespace=NAMESPACE)
    assert _arrive(b, A, "1") == Reply(WAIT, 0)
    assert _arrive(b, A, "2").status == LOST  # the earlier wait leaves: broken
    assert fields(client, b)["broken"] == "1"
    assert _arrive(b, B, "1").status == LOST


def test_scripts_a_runner_whose_action_never_ended_is_not_queued_behind_itself(
    client: Any, name: str
) -> None:
    """A ran the action and neither its pass nor its break reached Redis: its next wait
    breaks the barrier instead of queueing behind its own action (which would hang
    every party, time-outs included)."""
    b = Barrier(name, 2, client=client, namespace=NAMESPACE)
    assert _arrive(b, B, "1", action=True) == Reply(WAIT, 0)
    assert _arrive(b, A, "1", action=True) == Reply(GRANTED, 1, 1)  # run the action
    assert _arrive(b, A, "2", action=True).status == LOST
    f = fields(client, b)
    assert f["broken"] == "1" and "act" not in f
    assert _script(b, engine._LOOK, B, "1", 5000).status == LOST  # B hears it at once


def test_scripts_a_party_away_longer_than_its_lease_still_hears_its_generation_passed(
    client: Any, name: str
) -> None:
    b = Barrier(name, 2, client=client, namespace=NAMESPACE)
    assert _script(b, engine._ARRIVE, A, "1", 100, 0, 100) == Reply(WAIT, 0)  # 0.1 s lease
    assert _script(b, engine._ARRIVE, B, "1", 100, 0, 100).status == GRANTED  # passes
    time.sleep(0.3)  # A was stopped for longer than its lease
    assert _script(b, engine._PEEK, B).status in (GRANTED, WAIT)  # (tidies)
    assert _script(b, engine._LOOK, A, "1", 100) == Reply(GRANTED, 0, 0)  # not broken


def test_the_party_that_broke_the_barrier_needs_no_lease_to_leave_no_key(
    client: Any, name: str
) -> None:
    b = Barrier(name, 2, client=client, namespace=NAMESPACE, entry_lease=60)
    with pytest.raises(BrokenBarrierError):
        b.wait(timeout=0.05)  # times out: it breaks the barrier, and has its answer
    b.reset()
    assert client.exists(b._keys.hash, b._keys.queue) == 0


def test_a_time_out_that_came_while_the_action_ran_is_not_blamed(client: Any, name: str) -> None:
    """The waiter's time-out ran out while the action ran (which it waits for, as in
    threading); the action then raised: the waiter hears that the barrier broke, not that
    its own time-out broke it."""
    def action() -> None:
        time.sleep(0.6)
        raise RuntimeError("the action failed")

    b = Barrier(name, 2, action=action, client=client, namespace=NAMESPACE)
    errors: List[BaseException] = []

    def waiter() -> None:
        try:
            b.wait(timeout=0.3)
        except BrokenBarrierError as exc:
            errors.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_until(lambda: b.n_waiting == 1, 10, "the waiter arrived")
    with pytest.raises(RuntimeError, match="the action failed"):
        b.wait(timeout=30)
    thread.join(10)
    assert len(errors) == 1 and "this wait timed out" not in str(errors[0]), errors
    b.reset()
