"""rlocks Semaphore / BoundedSemaphore on a real Redis: semantics, bad input, leases,
value mismatch, and permits across real processes (spawned, killed)."""

from __future__ import annotations

import math
import multiprocessing
import os
import re
import signal
import threading
import time
from typing import Any, List

import pytest
import redis

from rlocks._engine import dialogues, identity
from rlocks._engine.holds import HELD
from rlocks._engine.scripts import WAIT
from rlocks.errors import LockLostError
from rlocks.semaphore import BoundedSemaphore, Semaphore

from ._servers import RENEWED_TTL, wait_renewed, wait_until
from ._threads import hub_waiters
from ._threads import in_thread as _run_thread
from ._threads import joined as _joined
from ._threads import started as _started
from .conftest import NAMESPACE, snapshot

SPAWN = multiprocessing.get_context("spawn")


def key(name: str) -> str:
    return f"{NAMESPACE}:sem:{{{name}}}"


def free(client: Any, name: str) -> int:
    """Permits free now (``sem_lib.lua``: the value ``#v`` less those held ``#h``)."""
    value, held = client.hmget(key(name), "#v", "#h")
    return int(value or 0) - int(held or 0)


def make(name: str, client: Any, value: int = 1, bounded: bool = False, **kw: Any) -> Semaphore:
    cls = BoundedSemaphore if bounded else Semaphore
    return cls(name, value, client=client, namespace=NAMESPACE, **kw)


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


# -- workers (top level: picklable under "spawn") ------------------------------------------


def pool_worker(url: str, name: str, gauge: str, peaks: str, rounds: int, start: Any) -> None:
    client = redis.Redis.from_url(url, socket_timeout=10)
    sem = BoundedSemaphore(name, 2, client=client, ttl=10.0, namespace=NAMESPACE)
    start.wait(60)
    peak = 0
    for _ in range(rounds):
        with sem:
            peak = max(peak, client.incr(gauge))
            time.sleep(0.01)
            client.decr(gauge)
    client.rpush(peaks, peak)
    os._exit(0)


def holding_worker(url: str, name: str, value: int, take: int, ttl: float, held: Any) -> None:
    client = redis.Redis.from_url(url, socket_timeout=10)
    sem = BoundedSemaphore(name, value, client=client, ttl=ttl, namespace=NAMESPACE)
    for _ in range(take):
        assert sem.acquire(timeout=10)
    held.set()
    time.sleep(120)  # killed long before this ends
    os._exit(0)


# -- threading semantics -------------------------------------------------------------------


def test_acquire_release_and_layout(client: "redis.Redis[bytes]", name: str) -> None:
    sem = make(name, client, 3)
    assert sem.acquire() and sem.acquire(blocking=False)
    owner = identity.thread_owner().encode()
    state = client.hgetall(key(name))
    assert state[owner] == b"2"
    # sem_lib.lua: initial value, kind, value, permits held; free = value - held
    assert (state[b"#i"], state[b"#b"], state[b"#v"], state[b"#h"]) == (b"3", b"0", b"3", b"2")
    assert free(client, name) == 1
    assert (client.zscore(sem._keys.leases, owner) or 0) > 0  # lease ends: a ZSET
    assert 0 < client.pttl(key(name)) <= 30_000  # recovery would restore the initial value
    sem.release(2)
    assert not client.exists(key(name)), "a semaphore at rest leaves nothing behind"


def test_permits_belong_to_the_process(client: "redis.Redis[bytes]", name: str) -> None:
    sem = make(name, client, 1, bounded=True)
    assert sem.acquire()
    other = threading.Thread(target=sem.release)  # threading allows this; so do we
    other.start()
    other.join()
    assert not client.exists(key(name))
    assert sem.acquire(blocking=False)
    sem.release()


def test_unbounded_release_grows_and_persists(client: "redis.Redis[bytes]", name: str) -> None:
    sem = make(name, client, 0)
    assert not sem.acquire(blocking=False)
    assert not client.exists(key(name)), "a failed try must not create state"
    sem.release(2)
    assert free(client, name) == 2
    assert client.pttl(key(name)) == -1, "released permits must not expire"
    assert sem.acquire(blocking=False) and sem.acquire(blocking=False)
    assert not sem.acquire(blocking=False)
    sem.release(2)
    assert free(client, name) == 2
    client.delete(key(name), sem._keys.leases)


@pytest.mark.parametrize("bounded", [False, True])
def test_a_value_of_zero_queues_as_threading_waits(
    client: "redis.Redis[bytes]", name: str, bounded: bool
) -> None:
    """Semaphore(0): a waiter queues until a release, which lets it take the permit.
    BoundedSemaphore(0): a waiter can never be served and times out leaving no entry;
    release() raises ValueError and changes nothing (threading's semantics)."""
    sem = make(name, client, 0, bounded=bounded)
    queue = sem._keys.queue
    results: list = []

    def waiter() -> None:
        try:
            results.append(sem.acquire(timeout=3 if bounded else 30))
            if results[-1]:
                sem.release()
        except BaseException as exc:  # noqa: BLE001 - checked in the main thread
            results.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        wait_for(lambda: client.zcard(queue) == 1, 10, "the waiter to queue")
        if bounded:
            with pytest.raises(ValueError, match="released too many times"):
                sem.release()
            assert client.zcard(queue) == 1, "a refused release must change nothing"
        else:
            sem.release()
    finally:
        thread.join(30)
    assert results == [not bounded], results
    assert client.zcard(queue) == 0
    if bounded:
        assert not client.exists(key(name), queue)
    else:
        assert free(client, name) == 1  # the released permit came back
        client.delete(key(name), sem._keys.leases)


def test_release_wakes_exactly_the_processes_its_permits_cover(
    client: "redis.Redis[bytes]", name: str
) -> None:
    """A release wakes the queued waiters its permits cover, in arrival order, each on its
    own process's channel (not a count for every process to race for, nor a message
    every waiting process must read); the next waiter's process hears nothing."""
    sem = make(name, client, 0)
    for ghost in ("ghost:1:a", "ghost:2:b", "ghost:3:c"):
        # A waiter of another process queues (its acquire script, as that process sends it).
        reply = sem._spec.acquire(sem, f"{ghost}:1", 0, 30000)(client)
        assert reply.status == WAIT
    pubsub = client.pubsub()
    pubsub.psubscribe(f"{NAMESPACE}:wake:ghost:*")
    try:
        assert pubsub.get_message(timeout=5)["type"] == "psubscribe"
        sem.release(2)
        # Each covered process on its own channel; the third process hears nothing.
        got = [pubsub.get_message(timeout=5) for _ in range(2)]
        assert [(m["channel"], m["data"]) for m in got] == [
            (f"{NAMESPACE}:wake:ghost:1:a".encode(), f"{key(name)}\nghost:1:a:1".encode()),
            (f"{NAMESPACE}:wake:ghost:2:b".encode(), f"{key(name)}\nghost:2:b:1".encode()),
        ]
        assert pubsub.get_message(timeout=0.2) is None
    finally:
        pubsub.close()
    client.delete(key(name), sem._keys.queue, sem._keys.leases)


def test_waiter_is_woken_by_release(client: "redis.Redis[bytes]", name: str) -> None:
    # A long entry lease: without the wake-up the waiter would ask again only after 20 s
    # (a third of it), so the bound tells a wake-up from a poll.
    sem = make(name, client, 1, entry_lease=60.0)
    assert sem.acquire()
    got = []
    waiter = threading.Thread(target=lambda: got.append(sem.acquire(timeout=30)))
    waiter.start()
    wait_for(lambda: bool(hub_waiters(sem)), 5, "the waiter to wait for a wake-up")
    began = time.monotonic()
    sem.release()
    waiter.join(30)
    assert got == [True] and time.monotonic() - began < 2.0
    sem.release()


# -- bad input: a clear error, nothing changed in Redis --------------------------------------


@pytest.mark.parametrize(
    "value, error", [(-1, ValueError), (-(2**63), ValueError), (1.5, TypeError),
                     ("3", TypeError), (2**60, ValueError)]
)
def test_bad_initial_value(client: "redis.Redis[bytes]", name: str, value: Any, error: Any) -> None:
    with pytest.raises(error, match=re.escape(name)):
        Semaphore(name, value, client=client, namespace=NAMESPACE)


@pytest.mark.parametrize("bounded", [False, True])
def test_bad_arguments_change_nothing(
    client: "redis.Redis[bytes]", name: str, bounded: bool
) -> None:
    sem = make(name, client, 2, bounded=bounded)
    assert sem.acquire()
    before = snapshot(client)
    cases = [
        (lambda: sem.release(0), ValueError),
        (lambda: sem.release(-3), ValueError),
        (lambda: sem.release(1.0), TypeError),
        (lambda: sem.acquire(False, timeout=1), ValueError),
        (lambda: sem.acquire(timeout=math.nan), ValueError),
        (lambda: sem.acquire(timeout="1"), TypeError),
        (lambda: sem.acquire(timeout=1e300), OverflowError),
    ]
    for call, error in cases:
        with pytest.raises(error):
            call()
    assert snapshot(client) == before
    sem.release()


def test_bounded_over_release_changes_nothing(client: "redis.Redis[bytes]", name: str) -> None:
    sem = make(name, client, 2, bounded=True)
    assert sem.acquire()
    sem.release()
    with pytest.raises(ValueError, match="Semaphore released too many times"):
        sem.release()
    assert sem.acquire()
    before = snapshot(client)
    with pytest.raises(ValueError, match="released too many times"):
        sem.release(2)
    assert snapshot(client) == before
    sem.release()  # the refused release left our permit ours
    assert not client.exists(key(name))


@pytest.mark.parametrize(
    "value, bounded, stored", [(3, False, "value 2"), (2, True, "BoundedSemaphore")]
)
def test_value_mismatch_is_refused(
    client: "redis.Redis[bytes]", name: str, value: int, bounded: bool, stored: str
) -> None:
    first = make(name, client, 2)
    assert first.acquire()
    before = snapshot(client)
    other = make(name, client, value, bounded=bounded)
    with pytest.raises(ValueError, match=stored) as info:
        other.acquire(blocking=False)
    assert "initial value 2" in str(info.value) and f"initial value {value}" in str(info.value)
    with pytest.raises(ValueError, match="nothing was changed"):
        other.release()
    assert snapshot(client) == before
    first.release()
    # At rest nothing is stored, so the next user's value defines the semaphore afresh.
    assert other.acquire(blocking=False)
    other.release()


# -- leases --------------------------------------------------------------------------------


def test_lost_permits_are_reported_and_not_given_back_twice(
    client: "redis.Redis[bytes]", name: str
) -> None:
    lost = []
    sem = make(name, client, 2, ttl=0.2, auto_renew=False, on_lost=lost.append)
    assert sem.acquire() and sem.acquire()
    wait_for(lambda: not client.exists(key(name)), 3, "the lease to end")
    with pytest.raises(LockLostError):
        sem.release(2)
    assert not client.exists(key(name)), "lost permits must not be released a second time"
    fresh = make(name, client, 2)
    assert fresh.acquire(blocking=False) and fresh.acquire(blocking=False)
    assert not fresh.acquire(blocking=False), "never more than the initial value free"
    fresh.release(2)


def test_renewal_keeps_a_short_lease(client: "redis.Redis[bytes]", name: str) -> None:
    # Renewals are waited for, not slept through (0.3 s, then 1 s, slept through left a
    # loaded machine 0.2 s, then 0.67 s to renew).
    lost: List[Any] = []
    sem = make(name, client, 1, ttl=RENEWED_TTL, on_lost=lost.append)
    assert sem.acquire()
    owner = identity.thread_owner()
    leases = sem._keys.leases  # sem_lib.lua: lease ends (ms), a ZSET
    first_end = int(client.zscore(leases, owner) or 0)
    wait_renewed(client, key(name))
    assert client.hget(key(name), owner) == b"1"
    # The permit's own lease end moved too, not only the key's expiry.
    assert int(client.zscore(leases, owner) or 0) > first_end
    sem.release()
    assert lost == []


# -- across processes ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_pool_of_two_shared_by_five_processes(
    client: "redis.Redis[bytes]", redis_url: str, name: str
) -> None:
    gauge, peaks = f"{NAMESPACE}:data:{name}:gauge", f"{NAMESPACE}:data:{name}:peaks"
    client.set(gauge, 0)
    start = SPAWN.Barrier(6)
    children = [
        SPAWN.Process(target=pool_worker, args=(redis_url, name, gauge, peaks, 15, start))
        for _ in range(5)
    ]
    try:
        for p in children:
            p.start()
        start.wait(60)
        for p in children:
            p.join(60)
        assert [p.exitcode for p in children] == [0] * 5
        seen = [int(v) for v in client.lrange(peaks, 0, -1)]
        assert max(seen) == 2, seen
        assert int(client.get(gauge)) == 0
        assert not client.exists(key(name))
    finally:
        for p in children:
            if p.is_alive():
                p.kill()
            p.join(10)
        client.delete(gauge, peaks)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_sigkilled_holders_permits_come_back_capped(
    client: "redis.Redis[bytes]", redis_url: str, name: str
) -> None:
    # A 3 s lease, and 3 s of slack on top for a loaded machine: the waiter gets the
    # permits once the lease ends. Its time-out is far longer, so permits that never came
    # back, or a waiter that slept until its deadline, are well past the bound.
    ttl = 3.0
    held = SPAWN.Event()
    child = SPAWN.Process(target=holding_worker, args=(redis_url, name, 3, 2, ttl, held))
    child.start()
    try:
        assert held.wait(30)
        sem = make(name, client, 3, bounded=True, ttl=10.0)
        # Another process (us) releasing one it never took would put a 4th permit in
        # circulation: refused, nothing changed.
        with pytest.raises(ValueError, match="released too many times"):
            sem.release()
        assert free(client, name) == 1
        os.kill(child.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert sem.acquire(timeout=5)
        assert sem.acquire(timeout=ttl + 15) and sem.acquire(timeout=5)
        waited = time.monotonic() - killed
        assert waited <= ttl + 3.0, f"{waited:.3f} s after the kill (ttl {ttl} s)"
        # Recovery gave the 2 back, and a bounded value never exceeds 3.
        assert not sem.acquire(blocking=False)
        assert free(client, name) == 0
        child.join(10)
        assert child.exitcode == -signal.SIGKILL
        sem.release(3)
        assert not client.exists(key(name))
    finally:
        if child.is_alive():
            child.kill()
        child.join(10)


def test_statistics_reports_permits_and_free_count(client: "redis.Redis[bytes]", name: str) -> None:
    sem = make(name, client, 3, bounded=True)
    assert sem.acquire() and sem.acquire()
    stats = sem.statistics()
    assert (stats.type, stats.value, stats.free) == ("BoundedSemaphore", 3, 1)
    assert [(h.owner, h.count) for h in stats.holders] == [(identity.thread_owner(), 2)]
    sem.release(2)
    assert sem.statistics().holders == ()


# -- whose permits: each thread's, each loss reported to it (issue 10 B) --------------------


def test_a_loss_is_not_absorbed_by_another_threads_grant(
    client: "redis.Redis[bytes]", name: str
) -> None:
    # A holds the only permit; B waits; `rlocks release --force` ends A's permit and wakes
    # B, which is granted. A's release must report A's loss, not consume B's permit, and
    # nobody else may get in while B is inside.
    from rlocks._engine.state import force_release

    lost: list = []
    sem = make(name, client, 1, bounded=True, on_lost=lost.append)
    assert sem.acquire()
    entered, leave = threading.Event(), threading.Event()
    errors: list = []

    def b() -> None:
        try:
            assert sem.acquire(timeout=20)
            entered.set()
            assert leave.wait(20)
            sem.release()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
            entered.set()

    thread = threading.Thread(target=b)
    thread.start()
    wait_for(lambda: bool(hub_waiters(sem)), 10, "B to wait")
    assert force_release(client, NAMESPACE, "sem", name)
    assert entered.wait(20) and not errors
    with pytest.raises(LockLostError):
        sem.release()  # A's permit: gone, and B's is not taken in its place
    assert free(client, name) == 0
    third = make(name, client, 1, bounded=True)
    result: list = []
    _run_thread(lambda: result.append(third.acquire(blocking=False)))
    assert result == [False], "a third caller got the only permit while B was inside"
    leave.set()
    thread.join(20)
    if errors:
        raise errors[0]
    assert not client.exists(key(name))
    wait_for(lambda: len(lost) >= 1, 20, "on_lost (it runs on the callback thread)")
    assert len(lost) == 1


def test_a_grant_after_a_reported_loss_is_the_new_holders_own(
    client: "redis.Redis[bytes]", name: str
) -> None:
    lost: list = []
    sem = make(name, client, 2, ttl=0.6, on_lost=lost.append)
    assert sem.acquire()
    client.delete(key(name))
    wait_for(lambda: lost, 5, "the renewer to report the loss")
    # Another thread's grant is its own permit: usable and released to Redis.
    def b() -> None:
        assert sem.acquire(blocking=False)
        assert client.hget(key(name), identity.thread_owner()) == b"1"
        sem.release()
        assert not client.exists(key(name)), "B's permit must go back to Redis"

    _run_thread(b)
    with pytest.raises(LockLostError):
        sem.release()
    assert not client.exists(key(name))


@pytest.mark.parametrize("auto_renew", [True, False])
def test_a_grant_that_would_wait_and_finds_the_threads_permits_gone_is_refused(
    client: "redis.Redis[bytes]", name: str, auto_renew: bool
) -> None:
    """The lost-permit check holds for an acquire that would have to wait too: the
    thread's earlier permit is gone while both permits are now other threads', so
    acquire() raises instead of queueing for a permit that would hide the loss, and
    takes nothing from the others."""
    sem = make(name, client, 2, auto_renew=auto_renew)
    assert sem.acquire()
    client.delete(key(name))  # the loss is not known locally yet
    taken = threading.Barrier(3)
    go = threading.Event()
    errors: list = []

    def other() -> None:
        try:
            assert sem.acquire(timeout=20)
            taken.wait(20)
            assert go.wait(20)
            sem.release()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    others = [threading.Thread(target=other) for _ in range(2)]
    for thread in others:
        thread.start()
    try:
        taken.wait(20)  # the two permits are taken: a new permit would mean waiting
        with pytest.raises(LockLostError):
            sem.acquire(timeout=20)
        assert free(client, name) == 0 and int(client.hget(key(name), "#h") or 0) == 2
        assert not client.exists(sem._keys.queue), "the refused acquire queued"
    finally:
        go.set()
        for thread in others:
            thread.join(20)
    if errors:
        raise errors[0]
    wait_for(lambda: not client.exists(key(name)), 10, "every permit to be back")
    with pytest.raises(LockLostError):
        sem.release()
    assert sem.acquire(blocking=False)  # the lost hold is gone: a fresh start
    sem.release()


def test_a_waiter_whose_permits_end_while_it_waits_is_refused(
    client: "redis.Redis[bytes]", name: str
) -> None:
    """A thread holds a permit and waits for a second one; its first permit's lease ends
    while it waits (unrenewed). Its next look finds its permits gone: acquire() raises
    LockLostError (once), takes nothing, and leaves the queue, instead of taking the
    freed permit as if nothing was lost."""
    lost: list = []
    sem = make(name, client, 2, ttl=1.0, auto_renew=False, on_lost=lost.append)
    other = make(name, client, 2, ttl=30)
    release_other = threading.Event()

    def holder() -> None:
        assert other.acquire()
        release_other.wait(30)
        other.release()

    hold, out = _started(holder)
    try:
        wait_for(lambda: free(client, name) == 1, 20, "the other thread's permit")
        assert sem.acquire()
        began = time.monotonic()
        with pytest.raises(LockLostError):
            sem.acquire(timeout=20)
        # Found at the first look after the 1 s lease, long before the 20 s time-out.
        assert time.monotonic() - began < 10.0
        assert not client.exists(sem._keys.queue), "the refused waiter kept its place"
        assert free(client, name) == 1, "the lost permit was taken again"
        wait_for(lambda: len(lost) >= 1, 20, "on_lost (it runs on the callback thread)")
        assert len(lost) == 1
        with pytest.raises(LockLostError):
            sem.release()
    finally:
        release_other.set()
        _joined(hold, out)
    assert not client.exists(key(name))


def test_a_grant_that_finds_the_threads_permits_gone_is_given_back(
    client: "redis.Redis[bytes]", name: str
) -> None:
    lost: list = []
    sem = make(name, client, 2, auto_renew=False, on_lost=lost.append)
    assert sem.acquire()
    client.delete(key(name))  # the loss is not known locally yet
    with pytest.raises(LockLostError):
        sem.acquire()
    assert not client.exists(key(name)), "the new permit must not stay held by nobody"
    wait_for(lambda: len(lost) >= 1, 20, "on_lost (it runs on the callback thread)")
    assert len(lost) == 1
    with pytest.raises(LockLostError):
        sem.release()
    assert sem.acquire(blocking=False)  # the lost hold is gone: a fresh start
    sem.release()
    assert not client.exists(key(name))


def test_releasing_another_threads_lost_permit_does_not_give_it_back_twice(
    client: "redis.Redis[bytes]", name: str
) -> None:
    lost: list = []
    sem = make(name, client, 2, auto_renew=False, on_lost=lost.append)
    _run_thread(lambda: sem.acquire())  # a worker takes a permit and leaves it to us
    client.delete(key(name))
    sem.release()  # the worker's permit: already back in the pool, so nothing to give
    assert not client.exists(key(name)), "a permit back in the pool was released again"
    wait_for(lambda: len(lost) >= 1, 20, "on_lost (it runs on the callback thread)")
    assert len(lost) == 1  # reported, once
    assert sem.acquire(blocking=False) and sem.acquire(blocking=False)
    assert not sem.acquire(blocking=False)
    sem.release(2)


def test_a_release_by_another_thread_takes_a_live_permit(
    client: "redis.Redis[bytes]", name: str
) -> None:
    sem = make(name, client, 2, bounded=True)
    _run_thread(lambda: sem.acquire())
    assert sem.acquire()
    sem.release(2)  # ours, then the worker's: threading's rule
    assert not client.exists(key(name))
    with pytest.raises(ValueError, match="released too many times"):
        sem.release()


def pause_before_record(
    monkeypatch: pytest.MonkeyPatch, sem: Any
) -> "tuple[threading.Event, threading.Event]":
    """Hold the first grant of ``sem`` that gives its owner a second permit after its
    reply came, before the acquire records it (``dialogues._record``): ``(reached, go)``."""
    reached, go = threading.Event(), threading.Event()
    record = dialogues._record

    def paused(p: Any, owner: str, hold: Any, reply: Any, sent: float) -> None:
        if p is sem and reply.a == 2 and not reached.is_set():
            reached.set()
            assert go.wait(30)
        record(p, owner, hold, reply, sent)

    monkeypatch.setattr(dialogues, "_record", paused)
    return reached, go


def test_a_release_of_a_waiters_permit_before_it_records_its_grant_loses_nothing(
    client: "redis.Redis[bytes]", name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """threading lets any thread release another's permit. Here one does so while that
    other thread was just granted a second permit and has not recorded it yet (paused
    there by the test). Both permits stay accounted: the release takes the first, the
    grant is the second, nothing is reported lost and nothing leaks (CI's CPython
    ``test_acquire_contended`` stalled 30 s when such a grant was taken for lost)."""
    lost: list = []
    sem = make(name, client, 2, on_lost=lost.append)
    reached, go = pause_before_record(monkeypatch, sem)
    assert sem.acquire()
    owner: list = []

    def waiter() -> bool:
        owner.append(identity.thread_owner())
        assert sem.acquire(timeout=20)
        return sem.acquire(timeout=20)  # queues: both permits are taken

    thread, out = _started(waiter)
    try:
        wait_for(lambda: client.zcard(sem._keys.queue) == 1, 20, "the waiter to queue")
        sem.release()  # ours: the waiter is woken and granted, then paused
        assert reached.wait(20)
        assert client.hget(key(name), owner[0]) == b"2"
        sem.release()  # the waiter's first permit, the only one its books have yet
    finally:
        go.set()
    assert _joined(thread, out) is True
    # Its grant was recorded after the release: nothing was lost, nothing leaked.
    assert sem._hold(owner[0]).state == HELD and lost == []
    assert sem._levels(owner[0]) == 1
    assert client.hget(key(name), owner[0]) == b"1"
    assert sem.acquire(blocking=False), "the released permit is free"
    assert not sem.acquire(blocking=False)
    sem.release(2)
    assert not client.exists(key(name))


def test_a_permit_held_through_another_client_counts_for_the_thread(
    client: "redis.Redis[bytes]", redis_url: str, name: str
) -> None:
    """A thread holds a permit through one object and waits through another object of the
    name on another client (so the waiting object took nothing itself). Once the rival's
    permit is free it gets its second permit: the pool of two has two holders' permits,
    the thread's two, and the rival cannot get in meanwhile (never three permits out)."""
    other = redis.Redis.from_url(redis_url)
    first = make(name, client, 2)
    second = make(name, other, 2, entry_lease=0.3)
    rival = make(name, client, 2)
    release_rival = threading.Event()
    inside = threading.Event()
    leave = threading.Event()
    owner: list = []

    def holder() -> None:
        assert rival.acquire()
        release_rival.wait(20)
        rival.release()

    def waiter() -> Any:
        owner.append(identity.thread_owner())
        assert first.acquire()
        try:
            got = second.acquire(timeout=20)
            if got:
                inside.set()
                leave.wait(20)
                second.release()
            return got
        finally:
            first.release()

    hold, held = _started(holder)
    try:
        wait_for(lambda: free(client, name) == 1, 20, "the holder's permit")
        thread, out = _started(waiter)
        wait_for(lambda: client.zcard(rival._keys.queue) == 1, 20, "the waiter to queue")
        release_rival.set()
        assert inside.wait(20)
        assert client.hget(key(name), owner[0]) == b"2"
        assert not rival.acquire(blocking=False), "three permits of a 2-permit semaphore out"
        leave.set()
        assert _joined(thread, out) is True
        _joined(hold, held)
        assert not client.exists(key(name))
    finally:
        release_rival.set()
        leave.set()
        other.close()


# -- a BoundedSemaphore never has more than value permits in circulation (issue 10, 1) -----


def nonholder_release_worker(url: str, name: str, out: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=10)
    sem = BoundedSemaphore(name, 1, client=client, namespace=NAMESPACE)
    try:
        sem.release()
        client.rpush(out, "released")
    except ValueError as exc:
        client.rpush(out, f"ValueError: {exc}")
    os._exit(0)


@pytest.mark.timeout(150)
def test_a_process_holding_nothing_cannot_release_a_bounded_semaphore(
    client: "redis.Redis[bytes]", redis_url: str, name: str
) -> None:
    # No renewal while the child starts: "nothing changed" compares the lease field too.
    sem = make(name, client, 1, bounded=True, ttl=300, auto_renew=False)
    assert sem.acquire()
    before = snapshot(client)
    out = f"{NAMESPACE}-out:{name}"
    child = SPAWN.Process(target=nonholder_release_worker, args=(redis_url, name, out))
    child.start()
    try:
        # Generous: a spawned interpreter starts slowly on a loaded machine.
        popped = client.blpop([out], timeout=120)
    finally:
        child.join(30)
    assert popped is not None, "the child process did not answer"
    answer = popped[1].decode()
    assert answer.startswith("ValueError") and "released too many times" in answer
    assert snapshot(client) == before, "a refused release must change nothing"
    other = make(name, client, 1, bounded=True)
    got: list = []
    _run_thread(lambda: got.append(other.acquire(blocking=False)))
    assert got == [False], "a second permit was in circulation"
    sem.release()  # the holder's own release still works
    assert not client.exists(key(name))


def test_a_plain_semaphore_lets_a_nonholder_release(client: "redis.Redis[bytes]", name: str) -> None:
    sem = make(name, client, 1)
    assert sem.acquire()
    other = make(name, client, 1)
    _run_thread(other.release)  # threading's counter model: the value grows to 2
    assert free(client, name) == 1
    assert other.acquire(blocking=False)
    sem.release()
    other.release()
    assert free(client, name) == 2
    client.delete(key(name), sem._keys.leases)


def test_a_shorter_ttl_never_shortens_the_threads_permits_lease(
    client: "redis.Redis[bytes]", name: str
) -> None:
    # Issue 10 A, for semaphores: two objects of one name share the thread's record.
    outer = make(name, client, 3, ttl=30)
    inner = make(name, client, 3, ttl=1)
    field = identity.thread_owner()

    def left_ms() -> int:
        now_s, now_us = client.time()
        ends = client.zscore(outer._keys.leases, field)  # sem_lib.lua: a ZSET
        return int(ends or 0) - (now_s * 1000 + now_us // 1000)

    with outer:
        with inner:
            assert left_ms() > 20_000
        assert left_ms() > 20_000, "the inner grant left the outer permit a short lease"
    assert not client.exists(key(name))


def test_asyncio_permits_are_the_tasks_and_a_loss_reaches_its_task(
    redis_url: str, name: str
) -> None:
    # The asyncio twin accounts permits to tasks, as the threading one to threads.
    import asyncio

    import redis.asyncio

    import rlocks.asyncio as ra

    async def main() -> None:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        sem = ra.BoundedSemaphore(name, 1, client=aclient, namespace=NAMESPACE)
        assert await sem.acquire()
        await aclient.delete(key(name))  # A's permit is gone, not known locally yet

        async def b() -> None:
            assert await sem.acquire(blocking=False)
            assert await afree() == 0

        async def afree() -> int:
            value, held = await aclient.hmget(key(name), "#v", "#h")
            return int(value or 0) - int(held or 0)

        await asyncio.create_task(b())  # B keeps its permit
        with pytest.raises(LockLostError):
            await sem.release()  # A's: lost, and B's is not taken in its place
        assert await afree() == 0
        await sem.release()  # B's permit, released by another task (as threading allows)
        assert not await aclient.exists(key(name))
        await aclient.aclose()

    asyncio.run(main())


def test_a_cancelled_asyncio_release_still_gives_the_permit_back(
    redis_url: str, name: str
) -> None:
    # Issue 10 D: a release cancelled while its connection was being opened left the
    # permit held in Redis until its lease ended; it is shielded, as RLock's release is.
    import asyncio

    import redis.asyncio

    import rlocks.asyncio as ra

    async def main() -> None:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        sem = ra.BoundedSemaphore(name, 1, client=aclient, namespace=NAMESPACE, ttl=30)
        assert await sem.acquire()
        await aclient.connection_pool.disconnect()  # the release must open a connection
        task = asyncio.create_task(sem.release())
        await asyncio.sleep(0)  # the release is now on its way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 10
        while await aclient.exists(key(name)):
            assert time.monotonic() < deadline, "the cancelled release left the permit held"
            await asyncio.sleep(0.01)
        assert not sem._mine, "the cancelled release left the permit on the books"
        await aclient.aclose()

    asyncio.run(main())

@pytest.mark.timeout(60)
def test_semaphore_dropped_while_held_does_not_refuse_the_threads_later_grants(
    client: "redis.Redis[bytes]", name: str
) -> None:
    """A semaphore object dropped while it holds a permit (a handler that raised before
    its release(), with no ``with``) stops being renewed and its permit comes back when the
    lease ends, as documented. That thread must still be able to take the semaphore later.

    Found: the dropped object's count stays in primitive._process_holds for the life of
    the process (nothing removes an object's holds when it is collected), so every later
    grant to that thread, through any new object of the name, looks like "a grant after a
    loss" to _grant_refusal: the permit is given back and acquire() raises LockLostError
    ("release the lost ones first"), with no object left that could release them.
    """
    import gc

    def forgets_to_release() -> bytes:
        sem = Semaphore(name, 2, client=client, ttl=1.0, namespace=NAMESPACE)
        assert sem.acquire()
        return sem._keys.hash.encode()

    key = forgets_to_release()
    gc.collect()
    # Its lease is no longer renewed: the permit goes back to the pool within ttl.
    wait_until(lambda: not client.exists(key), 10, "the dropped object's lease to end")
    sem = Semaphore(name, 2, client=client, ttl=1.0, namespace=NAMESPACE)
    try:
        assert sem.acquire(timeout=5)
        sem.release()
    finally:
        client.delete(key)
