"""Mutual exclusion and leases across real processes (multiprocessing, "spawn").

Every test runs against the session's real redis-server. Children are spawned (a fresh
interpreter, as on macOS/Windows and as a separate host would be), so nothing is shared
with the test process but Redis. Waits are for states (an Event, a key, an exit), each
bounded; the few measured durations are the guarantees under test.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Callable, List

import pytest
import redis

import rlocks
from rlocks._engine.identity import thread_owner

from . import _workers
from ._servers import wait_renewed
from .conftest import NAMESPACE, holds_in

SPAWN = multiprocessing.get_context("spawn")


def hash_key(name: str) -> str:
    return f"{NAMESPACE}:rlock:{{{name}}}"


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


def stop(process: multiprocessing.process.BaseProcess) -> None:
    """Make sure a child is gone at the end of a test, whatever happened."""
    if process.is_alive():
        process.kill()
    process.join(10)


def errors(client: "redis.Redis[bytes]", key: str) -> List[str]:
    return [e.decode() for e in client.lrange(key, 0, -1)]


# -- 1. mutual exclusion: 4 processes x 2 threads, nested, non-atomic increments ------------


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_nested_increments_across_processes_and_threads_are_exact(
    client: "redis.Redis[bytes]", redis_url: str, name: str
) -> None:
    processes, threads, iterations = 4, 2, 40  # 320 increments in all
    keys = {
        "counter": f"{NAMESPACE}:data:{name}:counter",
        "gauge": f"{NAMESPACE}:data:{name}:gauge",
        "peaks": f"{NAMESPACE}:data:{name}:peaks",
        "errors": f"{NAMESPACE}:data:{name}:errors",
    }
    client.set(keys["counter"], 0)
    client.set(keys["gauge"], 0)
    start = SPAWN.Barrier(processes + 1)
    children = [
        SPAWN.Process(
            target=_workers.counter_worker,
            args=(redis_url, name, NAMESPACE, keys, iterations, threads, start),
            name=f"counter-process-{i}",
        )
        for i in range(processes)
    ]
    try:
        for p in children:
            p.start()
        start.wait(45)  # every child is up: they all contend from here on
        for p in children:
            p.join(45)
        assert errors(client, keys["errors"]) == []
        assert [p.exitcode for p in children] == [0] * processes
        # The read-modify-write loses updates as soon as two critical sections overlap
        # (GET, sleep, SET); an exact count means none did.
        assert int(client.get(keys["counter"])) == processes * threads * iterations
        peaks = sorted(int(v) for v in client.lrange(keys["peaks"], 0, -1))
        assert peaks == [1] * (processes * threads), "critical sections overlapped"
        assert int(client.get(keys["gauge"])) == 0
        assert not client.exists(hash_key(name)), "the lock was left held"
    finally:
        for p in children:
            stop(p)
        client.delete(*keys.values())


# -- 2. a SIGKILLed holder stops blocking others at most ttl later ---------------------------


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_sigkilled_holder_is_replaced_within_its_ttl(
    client: "redis.Redis[bytes]", redis_url: str, name: str
) -> None:
    # A 3 s lease, and 3 s of slack on top for a loaded machine: the contender gets the
    # lock once the lease ends. Its time-out is far longer, so a lease that never ended,
    # or a contender that slept until its deadline, is well past the bound.
    ttl = 3.0
    errors_key = f"{NAMESPACE}:data:{name}:errors"
    held, release = SPAWN.Event(), SPAWN.Event()
    holder = SPAWN.Process(
        target=_workers.holder_worker,
        args=(redis_url, name, NAMESPACE, ttl, errors_key, held, release),
    )
    holder.start()
    try:
        assert held.wait(30), errors(client, errors_key)
        owners = holds_in(client, hash_key(name))
        assert len(owners) == 1
        (owner,) = owners
        assert f":{holder.pid}:" in owner.decode(), owner  # host:pid:nonce:serial

        # The holder's renewer is alive: wait until it has extended the lease once (the
        # PTTL goes up), so the kill below interrupts a hold that was being kept alive.
        wait_renewed(client, hash_key(name), times=1, timeout=3 * ttl)

        contender = rlocks.RLock(name, client=client, ttl=5.0, namespace=NAMESPACE)
        assert not contender.acquire(blocking=False)
        os.kill(holder.pid, signal.SIGKILL)
        killed = time.perf_counter()
        acquired = contender.acquire(timeout=ttl + 15.0)
        waited = time.perf_counter() - killed
        assert acquired, "the dead holder's lease never ended"
        holder.join(10)
        assert holder.exitcode == -signal.SIGKILL
        assert waited <= ttl + 3.0, f"took {waited:.3f} s after the kill (ttl {ttl} s)"
        assert holds_in(client, hash_key(name)) == {thread_owner().encode(): b"1"}
        contender.release()
    finally:
        stop(holder)
        client.delete(errors_key, hash_key(name))


# -- 3. a live holder keeps a short lease for much longer than the lease ----------------------


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_short_lease_of_a_live_holder_is_never_taken(
    client: "redis.Redis[bytes]", redis_url: str, name: str
) -> None:
    # 1.5 s, held for over two leases: a 0.5 s lease in a spawned holder was lost once at
    # a load average of ~20 (a renewal that came late, not a take-over).
    ttl, hold_for = 1.5, 4.0
    errors_key = f"{NAMESPACE}:data:{name}:errors"
    held, release = SPAWN.Event(), SPAWN.Event()
    holder = SPAWN.Process(
        target=_workers.holder_worker,
        args=(redis_url, name, NAMESPACE, ttl, errors_key, held, release),
    )
    holder.start()
    try:
        assert held.wait(30), errors(client, errors_key)
        contender = rlocks.RLock(name, client=client, ttl=5.0, namespace=NAMESPACE)
        attempts, longest_pttl = 0, 0
        began = time.perf_counter()
        while time.perf_counter() - began < hold_for:
            assert not contender.acquire(blocking=False), (
                f"taken from a live holder after {time.perf_counter() - began:.3f} s"
            )
            attempts += 1
            pttl = client.pttl(hash_key(name))
            assert 0 < pttl <= ttl * 1000, pttl  # still there, with the short lease
            longest_pttl = max(longest_pttl, pttl)
            threading.Event().wait(0.005)
        assert attempts > 100  # the loop really kept trying
        assert holder.is_alive()

        release.set()
        holder.join(15)
        # Exit 0: the holder's own release() succeeded, so its hold was never lost.
        assert holder.exitcode == 0, errors(client, errors_key)
        assert contender.acquire(blocking=False)
        contender.release()
        assert not client.exists(hash_key(name))
    finally:
        release.set()
        stop(holder)
        client.delete(errors_key, hash_key(name))


# -- 4. lost leases ------------------------------------------------------------------------


class Holder(threading.Thread):
    """A thread that acquires ``lock`` ``depth`` times, reports, and releases on request."""

    def __init__(self, lock: rlocks.RLock, depth: int = 1) -> None:
        super().__init__(daemon=True)
        self.lock, self.depth = lock, depth
        self.held, self.release = threading.Event(), threading.Event()
        self.owner = ""
        self.error: "BaseException | None" = None

    def run(self) -> None:
        try:
            self.owner = thread_owner()
            for _ in range(self.depth):
                assert self.lock.acquire(timeout=5)
            self.held.set()
            assert self.release.wait(20)
            for _ in range(self.depth):
                self.lock.release()
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            self.error = exc
            self.held.set()


@pytest.mark.timeout(20)
def test_expired_hold_raises_lock_lost_and_leaves_new_owner_untouched(
    client: "redis.Redis[bytes]", name: str
) -> None:
    key = hash_key(name)
    first = rlocks.RLock(name, client=client, ttl=0.3, auto_renew=False, namespace=NAMESPACE)
    assert first.acquire()
    assert first.acquire()
    wait_for(lambda: not client.exists(key), 5, "the unrenewed lease to expire")
    assert first._recursion_count() == 2  # local belief, not yet corrected

    # Another owner (another thread, its own instance, nested twice) takes the free lock.
    # Unrenewed, so its PTTL only falls, and only by the time that passes: a renewal
    # between the two reads below would raise it. Its 30 s lease outlives the test.
    second = Holder(
        rlocks.RLock(name, client=client, ttl=30.0, auto_renew=False, namespace=NAMESPACE),
        depth=2,
    )
    second.start()
    try:
        assert second.held.wait(10) and second.error is None, second.error
        before = client.hgetall(key)
        assert holds_in(client, key) == {second.owner.encode(): b"2"}
        pttl_before = client.pttl(key)

        with pytest.raises(rlocks.LockLostError) as lost:
            first.release()
        assert isinstance(lost.value, RuntimeError)
        # The second level unwinds as lost too (no I/O), and then nothing is owned.
        with pytest.raises(rlocks.LockLostError):
            first.release()
        assert not first._is_owned() and first._recursion_count() == 0
        with pytest.raises(RuntimeError):
            first.release()

        # The new owner's field and count were not touched, nor its lease shortened (to
        # the first holder's 0.3 s, say) or extended: only the seconds spent came off it.
        assert client.hgetall(key) == before
        assert 0 <= pttl_before - client.pttl(key) < 5000
    finally:
        second.release.set()
        second.join(10)
    assert not second.is_alive(), "the second holder did not finish"
    assert second.error is None, second.error
    assert not client.exists(key)


@pytest.mark.timeout(20)
def test_deleted_key_is_reported_lost_by_the_renewer(
    client: "redis.Redis[bytes]", name: str
) -> None:
    key = hash_key(name)
    called = threading.Event()
    calls: list = []

    def on_lost(lock: rlocks.RLock) -> None:
        calls.append((lock, threading.current_thread().name))
        called.set()

    lock = rlocks.RLock(
        name, client=client, ttl=0.3, auto_renew=True, namespace=NAMESPACE, on_lost=on_lost
    )
    assert lock.acquire()
    assert client.delete(key) == 1  # the hold vanishes under a live holder
    assert called.wait(5), "on_lost was never called"
    # Reported by the renewer, called on the callback thread (never the renewer's own).
    assert calls == [(lock, "rlocks-callbacks")]
    assert not client.exists(key)  # the renewer did not resurrect the hold
    with pytest.raises(rlocks.LockLostError):
        lock.release()
    assert not lock._is_owned()
    # Reported once; the lock is usable again afterwards.
    assert lock.acquire(blocking=False)
    lock.release()
    assert len(calls) == 1


@pytest.mark.parametrize("meanwhile", ["free", "taken"])
@pytest.mark.timeout(20)
def test_reentry_after_silent_expiry_raises_lock_lost(
    client: "redis.Redis[bytes]", name: str, meanwhile: str
) -> None:
    key = hash_key(name)
    lock = rlocks.RLock(name, client=client, ttl=0.3, auto_renew=False, namespace=NAMESPACE)
    assert lock.acquire()
    wait_for(lambda: not client.exists(key), 5, "the unrenewed lease to expire")
    other = None
    if meanwhile == "taken":
        other = Holder(rlocks.RLock(name, client=client, ttl=10.0, namespace=NAMESPACE))
        other.start()
        assert other.held.wait(10) and other.error is None, other.error
    state = client.hgetall(key)
    try:
        # Re-entering a critical section that is no longer protected must not look like
        # success (free: a fresh Redis count of 1 under a local count of 2) nor block on
        # the new owner as if this thread held nothing (taken: a timeout and False).
        with pytest.raises(rlocks.LockLostError):
            lock.acquire(timeout=0.2)
        assert client.hgetall(key) == state  # no fresh hold was created
    finally:
        if other is not None:
            other.release.set()
            other.join(10)
        while lock._is_owned():
            try:
                lock.release()
            except RuntimeError:
                pass
        client.delete(key)
