"""rlocks RWLock on a real Redis: sharing, exclusion, reentrancy, arrival order,
downgrade, refused upgrade, per-owner leases, and readers/writers in real processes."""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any, List

import pytest
import redis

from rlocks._engine import identity
from rlocks._engine.scripts import WAIT
from rlocks.errors import LockLostError, NotOwnedError
from rlocks.rwlock import RWLock, UpgradeError

from ._threads import hub_waiters
from .conftest import NAMESPACE, snapshot

SPAWN = multiprocessing.get_context("spawn")


def key(name: str) -> str:
    return f"{NAMESPACE}:rw:{{{name}}}"


def make(name: str, client: Any, **kw: Any) -> RWLock:
    return RWLock(name, client=client, namespace=NAMESPACE, **kw)


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


def in_thread(fn: Any) -> Any:
    out: List[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(30)
    return out[0]


def fields(client: "redis.Redis[bytes]", name: str, prefix: str) -> List[bytes]:
    if prefix == "#c:":
        # A waiting writer's claim is its entry in the queue (lib.lua: one FIFO for both
        # sides, '<arrival>:<side>:<owner>'; '~' members are fair=False marks).
        entries = client.zrange(f"{key(name)}:q", 0, -1)
        return [m for m in entries if not m.startswith(b"~")]
    return [f for f in client.hkeys(key(name)) if f.startswith(prefix.encode())]


# -- workers (top level: picklable under "spawn") ------------------------------------------


def reader_worker(url: str, name: str, held: Any, release: Any) -> None:
    client = redis.Redis.from_url(url, socket_timeout=10)
    lock = RWLock(name, client=client, ttl=10.0, namespace=NAMESPACE)
    ok = lock.read_lock.acquire(timeout=20)
    held.set()
    ok = ok and release.wait(60)
    lock.read_lock.release()
    import os

    os._exit(0 if ok else 3)


def reader_stream_worker(url: str, name: str, stop: Any, started: Any) -> None:
    """Two threads that keep the read side held without a gap until ``stop`` is set."""
    client = redis.Redis.from_url(url, socket_timeout=10)
    lock = RWLock(name, client=client, ttl=10.0, namespace=NAMESPACE)

    def loop() -> None:
        while not stop.is_set():
            if lock.read_lock.acquire(timeout=0.5):
                started.set()
                time.sleep(0.03)
                lock.read_lock.release()

    threads = [threading.Thread(target=loop) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    import os

    os._exit(0)


# -- sharing and exclusion -------------------------------------------------------------------


def test_readers_share_writer_excludes(client: "redis.Redis[bytes]", name: str) -> None:
    lock = make(name, client)
    assert lock.read_lock.acquire()
    assert in_thread(lambda: lock.read_lock.acquire(blocking=False))  # a second reader
    assert len(fields(client, name, "r:")) == 2
    assert lock.read_lock.locked() and not lock.write_lock.locked()
    assert not in_thread(lambda: lock.write_lock.acquire(blocking=False))
    assert not fields(client, name, "#c:"), "a single try must not leave a claim"
    lock.read_lock.release()
    # the other reader's thread has ended but its hold is alive (lease): still shared
    assert not in_thread(lambda: lock.write_lock.acquire(timeout=0.05))
    assert not fields(client, name, "#c:"), "a writer that gave up withdraws its claim"


def test_writer_excludes_everyone_and_reenters(client: "redis.Redis[bytes]", name: str) -> None:
    lock = make(name, client)
    with lock.write_lock:
        with lock.write_lock:
            assert lock.write_lock._recursion_count() == 2
            assert client.hget(key(name), f"w:{identity.thread_owner()}") == b"2"
            assert not in_thread(lambda: lock.read_lock.acquire(blocking=False))
            assert not in_thread(lambda: lock.write_lock.acquire(timeout=0.05))
        assert lock.write_lock.locked()
    assert not client.exists(key(name))
    assert not lock.write_lock.locked()


def test_read_side_is_reentrant(client: "redis.Redis[bytes]", name: str) -> None:
    lock = make(name, client)
    with lock.read_lock:
        with lock.read_lock:
            assert lock.read_lock._recursion_count() == 2
            assert lock.read_lock._is_owned() and not lock.write_lock._is_owned()
    assert not client.exists(key(name))


def test_downgrade(client: "redis.Redis[bytes]", name: str) -> None:
    lock = make(name, client)
    assert lock.write_lock.acquire()
    assert lock.read_lock.acquire(blocking=False)  # the writer may read
    lock.write_lock.release()
    assert lock.read_lock._is_owned()
    # Now an ordinary reader: others may read, nobody may write.
    assert in_thread(lambda: lock.read_lock.acquire(blocking=False))
    assert not in_thread(lambda: lock.write_lock.acquire(blocking=False))
    lock.read_lock.release()


def test_upgrade_is_refused_at_once_and_changes_nothing(
    client: "redis.Redis[bytes]", name: str
) -> None:
    lock = make(name, client)
    assert lock.read_lock.acquire()
    before = snapshot(client)
    began = time.monotonic()
    with pytest.raises(UpgradeError, match="upgrad"):
        lock.write_lock.acquire()
    with pytest.raises(RuntimeError):
        lock.write_lock.acquire(timeout=5)
    # at once: a wait would have lasted its 5 s time-out (not a speed bound)
    assert time.monotonic() - began < 5.0
    assert snapshot(client) == before
    lock.read_lock.release()


@pytest.mark.parametrize("held, granted, lost", [
    ("read", "write", True), ("write", "read", True), ("write", "write", True),
    ("read", "read", False)])
def test_a_grant_that_excludes_a_hold_of_this_process_tells_it_lost(
        client: "redis.Redis[bytes]", name: str, held: str, granted: str, lost: bool) -> None:
    # The hold gone from Redis (a failover lost it; here a deleted key), another thread's
    # grant that it would have excluded proves it: the holder knows at once, before its
    # release finds it.
    told: List[Any] = []
    rw = make(name, client, ttl=60, on_lost=told.append)
    side = getattr(rw, f"{held}_lock")
    side.acquire()
    client.delete(key(name))
    assert in_thread(lambda: getattr(make(name, client), f"{granted}_lock").acquire(timeout=5))
    assert side.owned() is not lost  # a reader's grant proves nothing of another reader
    if lost:  # (on_lost runs on the callback thread)
        wait_for(lambda: len(told) == 1, 5, "on_lost")
    with pytest.raises(LockLostError):
        side.release()  # (found at the release, for the reader)


def test_bad_input_changes_nothing(client: "redis.Redis[bytes]", name: str) -> None:
    lock = make(name, client)
    assert lock.read_lock.acquire()
    before = snapshot(client)
    with pytest.raises(NotOwnedError):
        lock.write_lock.release()
    assert isinstance(in_thread(lambda: _error_of(lock.read_lock.release)), NotOwnedError)
    for side in (lock.read_lock, lock.write_lock):
        with pytest.raises(ValueError):
            side.acquire(False, timeout=1)
        with pytest.raises(ValueError):
            side.acquire(timeout=-5)
        with pytest.raises(OverflowError):
            side.acquire(timeout=1e300)
        with pytest.raises(TypeError):
            side.acquire(timeout="1")
    assert snapshot(client) == before
    lock.read_lock.release()
    for bad, error in [("", ValueError), (3, TypeError)]:
        with pytest.raises(error):
            RWLock(bad, client=client, namespace=NAMESPACE)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RWLock(name, client=client, ttl=0, namespace=NAMESPACE)


def _error_of(fn: Any) -> Any:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - returned to the test thread
        return exc
    return None


# -- arrival order and claims -----------------------------------------------------------------


def test_waiting_writer_holds_new_readers_back(client: "redis.Redis[bytes]", name: str) -> None:
    # A long entry lease: without the wake-up the writer would only re-check after 20 s or
    # more, so the bound below tells a wake-up from a poll, not a fast run from a slow one.
    lock = make(name, client, entry_lease=60.0)
    assert lock.read_lock.acquire()
    got: List[bool] = []
    writer = threading.Thread(target=lambda: got.append(lock.write_lock.acquire(timeout=20)))
    writer.start()
    wait_for(lambda: bool(fields(client, name, "#c:")), 5, "the writer's claim")
    assert not in_thread(lambda: lock.read_lock.acquire(blocking=False)), "new reader got in"
    assert lock.read_lock.acquire(blocking=False), "re-entry of a reader must not block"
    lock.read_lock.release()
    began = time.monotonic()
    lock.read_lock.release()  # the last reader leaves: the writer is woken
    writer.join(20)
    assert got == [True] and time.monotonic() - began < 10.0
    assert not fields(client, name, "#c:"), "the granted writer's claim is gone"


def test_dead_waiting_writers_claim_expires(client: "redis.Redis[bytes]", name: str) -> None:
    lock = make(name, client)
    assert lock.read_lock.acquire()
    # A writer in some process queues, then dies: nobody renews its entry.
    side = lock.write_lock
    reply = side._spec.acquire(side, "ghost:1:x:1", 0, side._entry_ms)(client)
    assert reply.status == WAIT
    assert not in_thread(lambda: lock.read_lock.acquire(blocking=False))
    began = time.monotonic()
    assert in_thread(lambda: lock.read_lock.acquire(timeout=10))
    # Held back at most the dead writer's entry lease (2 s), plus slack for a loaded
    # machine; a claim that outlived it would last the writer's 30 s ttl, or for ever.
    assert time.monotonic() - began < side._entry_ms / 1000.0 + 5.0
    assert not fields(client, name, "#c:")
    lock.read_lock.release()


def test_one_dead_reader_expires_while_another_reads(
    client: "redis.Redis[bytes]", name: str
) -> None:
    lost: List[Any] = []
    short = make(name, client, ttl=0.2, auto_renew=False, on_lost=lost.append)
    long = make(name, client, ttl=30.0)
    assert in_thread(lambda: short.read_lock.acquire())  # this reader's thread "dies"
    assert long.read_lock.acquire()
    assert len(fields(client, name, "r:")) == 2
    got: List[bool] = []
    writer = threading.Thread(target=lambda: got.append(long.write_lock.acquire(timeout=20)))
    writer.start()
    wait_for(lambda: len(fields(client, name, "r:")) == 1, 5, "the dead reader's purge")
    assert got == [] and client.exists(key(name))
    long.read_lock.release()
    writer.join(10)
    assert got == [True]


def test_lost_write_hold_is_reported(client: "redis.Redis[bytes]", name: str) -> None:
    lock = make(name, client, ttl=0.2, auto_renew=False)
    assert lock.write_lock.acquire()
    wait_for(lambda: not client.exists(key(name)), 3, "the lease to end")
    with pytest.raises(LockLostError):
        lock.write_lock.release()
    assert not client.exists(key(name))


def test_condition_on_write_side(client: "redis.Redis[bytes]", name: str) -> None:
    lock = make(name, client)
    cond = threading.Condition(lock.write_lock)
    errors: List[BaseException] = []

    def producer() -> None:
        try:
            with cond:  # acquirable only after the main thread's wait() released it
                cond.notify()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    with cond:
        t = threading.Thread(target=producer)
        t.start()
        # wait(), not wait_for(): wait_for returns its predicate after the timeout, so it
        # would pass without any notify. False here is the timeout.
        assert cond.wait(timeout=30)
        assert lock.write_lock._is_owned()
    t.join(10)
    assert not t.is_alive() and errors == []
    assert not client.exists(key(name))


# -- across processes ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_two_reader_processes_share_and_a_writer_waits_for_both(
    client: "redis.Redis[bytes]", redis_url: str, name: str
) -> None:
    held = [SPAWN.Event(), SPAWN.Event()]
    release = [SPAWN.Event(), SPAWN.Event()]
    readers = [
        SPAWN.Process(target=reader_worker, args=(redis_url, name, held[i], release[i]))
        for i in range(2)
    ]
    try:
        for p in readers:
            p.start()
        assert held[0].wait(30) and held[1].wait(30)
        # Both hold at once: neither has been told to release.
        assert len(fields(client, name, "r:")) == 2
        lock = make(name, client)
        assert not lock.write_lock.acquire(blocking=False)
        got: List[Any] = []

        def write() -> None:
            granted = lock.write_lock.acquire(timeout=30)
            got.append((granted, len(fields(client, name, "r:"))))
            if granted:
                lock.write_lock.release()

        writer = threading.Thread(target=write)
        writer.start()
        wait_for(lambda: bool(fields(client, name, "#c:")), 5, "the writer's claim")
        release[0].set()
        readers[0].join(20)
        assert readers[0].exitcode == 0
        assert len(fields(client, name, "r:")) == 1 and got == []
        release[1].set()
        writer.join(10)
        assert got == [(True, 0)]
        readers[1].join(20)
        assert readers[1].exitcode == 0
        assert not client.exists(key(name))
    finally:
        for ev in release:
            ev.set()
        for p in readers:
            if p.is_alive():
                p.kill()
            p.join(10)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_stream_of_readers_does_not_starve_a_writer(
    client: "redis.Redis[bytes]", redis_url: str, name: str
) -> None:
    stop, started = SPAWN.Event(), SPAWN.Event()
    readers = [
        SPAWN.Process(target=reader_stream_worker, args=(redis_url, name, stop, started))
        for _ in range(2)
    ]
    try:
        for p in readers:
            p.start()
        assert started.wait(30)
        wait_for(lambda: len(fields(client, name, "r:")) >= 2, 10, "overlapping readers")
        lock = make(name, client)
        # The stream goes on until the test stops it: a starved writer would wait its
        # whole 30 s time-out. Normally it waits for the readers in (30 ms holds); the
        # bound, a fraction of the starvation's cost, leaves seconds for a loaded machine.
        for _ in range(3):
            began = time.monotonic()
            assert lock.write_lock.acquire(timeout=30), "the writer starved"
            waited = time.monotonic() - began
            assert not fields(client, name, "r:"), "a reader held during the write"
            lock.write_lock.release()
            assert waited < 8.0, f"the writer waited {waited:.3f} s"
            wait_for(lambda: bool(fields(client, name, "r:")), 10, "readers to resume")
    finally:
        stop.set()
        for p in readers:
            p.join(20)
            if p.is_alive():
                p.kill()
                p.join(10)
    assert [p.exitcode for p in readers] == [0, 0]


# -- re-entry into a hold that ended unnoticed, and the writer's claim flag -----------------


@pytest.mark.parametrize("side", ["read_lock", "write_lock"])
def test_reentry_after_silent_expiry_raises_lock_lost(
    client: "redis.Redis[bytes]", name: str, side: str
) -> None:
    rw = make(name, client, ttl=0.3, auto_renew=False)
    lock = getattr(rw, side)
    lock.acquire()
    wait_for(lambda: not client.exists(key(name)), 5, "the unrenewed lease to end")
    with pytest.raises(LockLostError):
        lock.acquire()  # must not come back as a fresh hold under the outer one
    assert not client.exists(key(name))  # nothing was granted
    with pytest.raises(LockLostError):
        lock.release()
    assert lock._recursion_count() == 0
    assert lock.acquire(blocking=False)  # usable again once the loss was released
    lock.release()


def test_single_try_after_a_waiting_try_leaves_no_claim(
    client: "redis.Redis[bytes]", name: str
) -> None:
    # The same thread first waits (stakes a claim, withdraws it on timeout), then tries
    # once: the single try must not stake a claim that would hold back new readers.
    rw = make(name, client)
    assert in_thread(lambda: rw.read_lock.acquire()) is True
    assert rw.write_lock.acquire(timeout=0.1) is False
    assert rw.write_lock.acquire(blocking=False) is False
    assert fields(client, name, "#c:") == []
    assert in_thread(lambda: rw.read_lock.acquire(blocking=False)) is True


def test_waiting_try_after_a_single_try_stakes_a_claim(
    client: "redis.Redis[bytes]", name: str
) -> None:
    # One owner (thread) tries once, then waits: the waiting try must not re-send the
    # single try's cached no-claim call. (Another thread's first wait proves nothing: a
    # new owner has nothing cached.)
    rw = make(name, client)
    assert rw.read_lock.acquire()  # this thread reads until the writer's claim is seen
    seen: List[Any] = []

    def writer() -> None:
        try:
            seen.append(rw.write_lock.acquire(blocking=False))
            seen.append(fields(client, name, "#c:"))
            seen.append(rw.write_lock.acquire(timeout=30))
            rw.write_lock.release()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            seen.append(exc)

    t = threading.Thread(target=writer)
    t.start()
    wait_for(lambda: fields(client, name, "#c:") != [] or len(seen) > 2, 10, "the claim")
    assert seen == [False, []]  # the single try left none; the claim is the waiting try's
    # The claim holds new readers back.
    assert in_thread(lambda: rw.read_lock.acquire(blocking=False)) is False
    rw.read_lock.release()
    t.join(30)
    assert not t.is_alive() and seen == [False, [], True]
    assert not client.exists(key(name))


def test_statistics_shows_readers_and_writer(client: "redis.Redis[bytes]", name: str) -> None:
    rw = make(name, client)
    assert rw.read_lock.acquire()
    stats = rw.statistics()
    assert stats.type == "RWLock"
    assert [(h.owner, h.count, h.side) for h in stats.holders] == [
        (identity.thread_owner(), 1, "read")
    ]
    # One hash, both sides: the other side's view shows the same holders.
    same = [(h.owner, h.count, h.side) for h in rw.write_lock.statistics().holders]
    assert same == [(h.owner, h.count, h.side) for h in stats.holders]
    rw.read_lock.release()
    assert rw.write_lock.acquire()
    assert [h.side for h in rw.statistics().holders] == ["write"]
    rw.write_lock.release()


@pytest.mark.timeout(20)
def test_downgrade_does_not_queue_behind_local_readers(
    client: "redis.Redis[bytes]", name: str
) -> None:
    rw = make(name, client)
    assert rw.write_lock.acquire()
    reader = threading.Thread(target=lambda: (rw.read_lock.acquire(timeout=10), rw.read_lock.release()))
    reader.start()
    wait_for(lambda: len(hub_waiters(rw.read_lock)) == 1, 5, "a reader to wait")
    assert rw.read_lock.acquire(timeout=5)  # downgrade, with a local reader waiting
    rw.write_lock.release()
    rw.read_lock.release()
    reader.join(10)
    assert not reader.is_alive()


@pytest.mark.parametrize("side", ["read_lock", "write_lock"])
def test_a_shorter_ttl_inside_never_shortens_the_outer_hold(
    client: "redis.Redis[bytes]", name: str, side: str
) -> None:
    # Issue 10 A, for an RWLock: two objects of one name, ttl 30 outside, ttl 1 inside.
    outer = RWLock(name, client=client, namespace=NAMESPACE, ttl=30)
    inner = RWLock(name, client=client, namespace=NAMESPACE, ttl=1)
    key = f"{NAMESPACE}:rw:{{{name}}}"
    field = f"{side[0]}:{identity.thread_owner()}"

    def left_ms() -> int:
        now_s, now_us = client.time()
        ends = client.zscore(outer.write_lock._keys.leases, field)  # rw_lib.lua: a ZSET
        return int(ends or 0) - (now_s * 1000 + now_us // 1000)

    with getattr(outer, side):
        with getattr(inner, side):
            assert left_ms() > 20_000
        assert left_ms() > 20_000, "the inner release left the outer hold a short lease"
        assert client.pttl(key) > 20_000
    assert not client.exists(key)
