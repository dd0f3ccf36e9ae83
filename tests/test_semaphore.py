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

from rlocks._engine import identity
from rlocks._engine.scripts import run
from rlocks.errors import LockLostError
from rlocks.semaphore import BoundedSemaphore, Semaphore

from ._servers import RENEWED_TTL, wait_renewed, wait_until
from ._threads import in_thread as _run_thread
from ._threads import joined as _joined
from ._threads import parked, pause_at_hand_over
from ._threads import started as _started
from .conftest import NAMESPACE, snapshot

SPAWN = multiprocessing.get_context("spawn")


def key(name: str) -> str:
    return f"{NAMESPACE}:sem:{{{name}}}"


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
    assert state[b"#free"] == b"1" and state[b"#value"] == b"3" and state[b"#bounded"] == b"0"
    assert (client.zscore(f"{key(name)}:leases", owner) or 0) > 0  # lease ends: a ZSET
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
    assert client.hget(key(name), "#free") == b"2"
    assert client.pttl(key(name)) == -1, "released permits must not expire"
    assert sem.acquire(blocking=False) and sem.acquire(blocking=False)
    assert not sem.acquire(blocking=False)
    sem.release(2)
    assert client.hget(key(name), "#free") == b"2"


@pytest.mark.parametrize("bounded", [False, True])
def test_a_value_of_zero_queues_as_threading_waits(
    client: "redis.Redis[bytes]", name: str, bounded: bool
) -> None:
    """Semaphore(0): a waiter queues until a release, which hands it the permit.
    BoundedSemaphore(0): a waiter can never be served and times out leaving no entry;
    release() raises ValueError and changes nothing (threading's semantics)."""
    sem = make(name, client, 0, bounded=bounded)
    queue = sem._keys.queued()[2]
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
        assert client.hget(key(name), "#free") == b"1"  # the released permit came back


def test_release_wakes_exactly_the_processes_its_permits_cover(
    client: "redis.Redis[bytes]", name: str
) -> None:
    # Issue 12: a release grants its permits to the queued waiters they cover, in order,
    # and wakes exactly those processes, each on its own channel (not a count for every
    # process to race for, nor a message every waiting process must read).
    sem = make(name, client, 0)
    for ghost in ("ghost:1:a", "ghost:2:b", "ghost:3:c"):
        owner = f"{ghost}:1"
        args = [*sem._context(), owner, owner, ghost, 30000, 1, 1]
        assert run(client, Semaphore._acquire_script, sem._keys.queued(), args).queued
    pubsub = client.pubsub()
    pubsub.psubscribe(f"{key(name)}:wake:*")
    try:
        assert pubsub.get_message(timeout=5)["type"] == "psubscribe"
        sem.release(2)
        # Each granted process on its own channel; the third process hears nothing.
        got = [pubsub.get_message(timeout=5) for _ in range(2)]
        assert [(m["channel"], m["data"]) for m in got] == [
            (f"{key(name)}:wake:ghost:1:a".encode(), b"g ghost:1:a:1"),
            (f"{key(name)}:wake:ghost:2:b".encode(), b"g ghost:2:b:1"),
        ]
        assert pubsub.get_message(timeout=0.2) is None
    finally:
        pubsub.close()
    client.delete(*sem._keys.queued()[:5])


def test_waiter_is_woken_by_release(client: "redis.Redis[bytes]", name: str) -> None:
    sem = make(name, client, 1)
    assert sem.acquire()
    got = []
    waiter = threading.Thread(target=lambda: got.append(sem.acquire(timeout=10)))
    waiter.start()
    channel = sem._channel()
    wait_for(lambda: bool(client.pubsub_numsub(channel)[0][1]), 5, "subscription")
    began = time.monotonic()
    sem.release()
    waiter.join(10)
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
    leases = f"{key(name)}:leases"  # queue_lib.lua: lease ends (ms), a ZSET
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
        assert client.hget(key(name), "#free") == b"1"
        os.kill(child.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert sem.acquire(timeout=5)
        assert sem.acquire(timeout=ttl + 15) and sem.acquire(timeout=5)
        waited = time.monotonic() - killed
        assert waited <= ttl + 3.0, f"{waited:.3f} s after the kill (ttl {ttl} s)"
        # Recovery gave the 2 back, and a bounded value never exceeds 3.
        assert not sem.acquire(blocking=False)
        assert client.hget(key(name), "#free") == b"0"
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

    from rlocks._engine import waiting

    thread = threading.Thread(target=b)
    thread.start()
    hub = waiting.hub_for(client, NAMESPACE)
    wait_for(lambda: hub.has_waiters(sem._channel()), 10, "B to wait")
    assert force_release(client, NAMESPACE, "sem", name)
    assert entered.wait(20) and not errors
    with pytest.raises(LockLostError):
        sem.release()  # A's permit: gone, and B's is not taken in its place
    assert client.hget(key(name), "#free") == b"0"
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
def test_a_hand_over_grant_that_finds_the_threads_permits_gone_is_given_back(
    client: "redis.Redis[bytes]", name: str, auto_renew: bool
) -> None:
    """The lost-permit check of a direct grant holds for a grant made by hand-over (in
    another thread's release script) too: the thread's earlier permit is gone, so the
    new one goes back and acquire() raises instead of hiding the loss."""
    sem = make(name, client, 2, auto_renew=auto_renew)
    queue = sem._keys.queued()[2]
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
    taken.wait(20)  # the two permits are taken: the next acquire queues
    releaser = threading.Thread(
        target=lambda: (wait_for(lambda: client.zcard(queue) == 1, 20, "the queue"), go.set())
    )
    releaser.start()
    try:
        with pytest.raises(LockLostError):
            sem.acquire(timeout=20)
    finally:
        go.set()
        for thread in (*others, releaser):
            thread.join(20)
    if errors:
        raise errors[0]
    wait_for(lambda: not client.exists(key(name)), 10, "every permit to be back")
    with pytest.raises(LockLostError):
        sem.release()
    assert sem.acquire(blocking=False)  # the lost hold is gone: a fresh start
    sem.release()


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
    sem.release()  # the worker's permit: already back in the pool, so nothing to send
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


def test_a_release_of_a_waiters_permit_before_it_records_its_grant_loses_nothing(
    client: "redis.Redis[bytes]", name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """threading lets any thread release another's permit. Here one does so while that
    other thread was just handed a second permit and has not adopted it yet (paused
    there by the test). The grant must stay for the waiter to adopt: CI's CPython
    ``test_acquire_contended`` stalled 30 s when the release adopted it instead: the
    waiter then found its grant gone, reported the permit lost, and the pool leaked it
    until its lease ended."""
    lost: list = []
    sem = make(name, client, 2, on_lost=lost.append)
    # The waiter has its hand-over grant and is about to adopt it: hold it there.
    handed, go = pause_at_hand_over(monkeypatch, sem)
    assert sem.acquire()
    owner: list = []

    def waiter() -> bool:
        owner.append(identity.thread_owner())
        assert sem.acquire(timeout=20)
        return sem.acquire(timeout=20)  # queues: both permits are taken

    thread, out = _started(waiter)
    wait_for(lambda: client.zcard(sem._keys.queued()[2]) == 1, 20, "the waiter to queue")
    sem.release()  # ours: handed over to the waiter in this release's script
    assert handed.wait(20)
    sem.release()  # the waiter's first permit, the only one its books have yet
    go.set()
    assert _joined(thread, out) is True
    # acquire() adopted the grant before returning: nothing was lost, nothing leaked
    assert not sem._holds[owner[0]].lost and lost == []
    assert client.hget(key(name), owner[0]) == b"1"
    assert sem.acquire(blocking=False), "the released permit is free"
    assert not sem.acquire(blocking=False)


def test_a_revoked_grant_is_not_taken_for_a_permit_held_through_another_client(
    client: "redis.Redis[bytes]", redis_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread holds a permit through one object and waits through another object of the
    name on another client (so the waiting object cannot know of that permit). Its
    hand-over grant is revoked before it adopts it (a stall past the entry lease), and
    the permit goes to another owner. The adoption then finds the thread's permit from
    the first object, but not its grant: it must not return True, which would put three
    holders in a 2-permit pool."""
    other = redis.Redis.from_url(redis_url)
    first = make(name, client, 2)
    second = make(name, other, 2, entry_lease=0.3)
    rival = make(name, client, 2)
    handed, go = pause_at_hand_over(monkeypatch, second)
    release_rival = threading.Event()

    def holder() -> None:
        assert rival.acquire()
        release_rival.wait(20)
        rival.release()

    def waiter() -> Any:
        assert first.acquire()
        try:
            return second.acquire(timeout=8)
        finally:
            first.release()

    hold, _ = _started(holder)
    wait_for(lambda: client.hget(key(name), "#free") == b"1", 20, "the holder's permit")
    thread, out = _started(waiter)
    # Asleep in its queue entry: the hand-over reaches it as a wake-up line (an attempt
    # still under way could be answered ADOPTED instead, a grant no revocation can touch).
    wait_for(lambda: parked(thread), 20, "the waiter to sleep in the queue")
    release_rival.set()  # handed over to the waiter, paused before its adoption
    assert handed.wait(20)
    # Its grant's lease (0.3 s) ends; this thread's first try after that revokes it and
    # takes the permit.
    deadline = time.monotonic() + 20
    while not rival.acquire(blocking=False):
        assert time.monotonic() < deadline, "the grant was never revoked"
        time.sleep(0.05)
    go.set()
    assert _joined(thread, out) is False, "three holders of a 2-permit semaphore"
    rival.release()
    hold.join(20)
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
    assert client.hget(key(name), "#free") == b"1"
    assert other.acquire(blocking=False)
    sem.release()
    other.release()
    assert client.hget(key(name), "#free") == b"2"
    client.delete(key(name))


def test_a_shorter_ttl_never_shortens_the_threads_permits_lease(
    client: "redis.Redis[bytes]", name: str
) -> None:
    # Issue 10 A, for semaphores: two objects of one name share the thread's record.
    outer = make(name, client, 3, ttl=30)
    inner = make(name, client, 3, ttl=1)
    field = identity.thread_owner()

    def left_ms() -> int:
        now_s, now_us = client.time()
        ends = client.zscore(f"{key(name)}:leases", field)  # queue_lib.lua: a ZSET
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
            assert await aclient.hget(key(name), "#free") == b"0"

        await asyncio.create_task(b())  # B keeps its permit
        with pytest.raises(LockLostError):
            await sem.release()  # A's: lost, and B's is not taken in its place
        assert await aclient.hget(key(name), "#free") == b"0"
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
        assert not sem._holds
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
