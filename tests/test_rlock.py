"""rlocks.RLock behaviour on a real Redis: semantics, bad input, lost holds, renewal."""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import threading
import time
import uuid
from typing import Any, Iterator, List, Tuple

import pytest
import redis

import rlocks
from rlocks._engine import identity, wakeups
from rlocks._engine.keys import escape
from rlocks.server import TemporaryRedisServer

from ._servers import RENEWED_TTL, wait_renewed, wait_until
from ._threads import hub_waiters, parked
from .conftest import NAMESPACE, SCRIPT_CALLS, script_calls, snapshot


class CountingRedis(redis.Redis):  # type: ignore[type-arg]
    """A real client that records each command it sends and each pipeline it runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: List[str] = []
        self.sent: List[Tuple[str, str]] = []  # (thread name, command), one append each
        self.pipelines = 0
        self.pipelined = 0  # commands sent in those pipelines

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.commands.append(str(args[0]).upper())
        self.sent.append((threading.current_thread().name, str(args[0]).upper()))
        return super().execute_command(*args, **options)

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        self.pipelines += 1
        pipe = super().pipeline(*args, **kwargs)
        execute = pipe.execute

        def counted(*a: Any, **k: Any) -> Any:
            self.pipelined += len(pipe.command_stack)
            return execute(*a, **k)

        pipe.execute = counted
        return pipe


@pytest.fixture
def counting(redis_url: str) -> CountingRedis:
    return CountingRedis.from_url(redis_url)


def make(name: str, client: Any, **kwargs: Any) -> rlocks.RLock:
    return rlocks.RLock(name, client=client, namespace=NAMESPACE, **kwargs)


def hash_key(name: str) -> str:
    return f"{NAMESPACE}:rlock:{{{name}}}"


@contextlib.contextmanager
def held_by_another_thread(lock: rlocks.RLock) -> Iterator[None]:
    """Hold ``lock`` in a helper thread for the duration of the block."""
    held, done = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            done.wait(60)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(5)
    try:
        yield
    finally:
        done.set()
        t.join()


def waiters_of(lock: Any) -> List[wakeups.Waiter]:
    """The waiters of this process registered for wake-up hints on ``lock`` (no I/O)."""
    with wakeups._mutex:
        return [w for (key, _), w in wakeups._waiters.items() if key == lock._keys.hash]


def wait_for(predicate: Any, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.005)
    return bool(predicate())


# -- semantics -------------------------------------------------------------------------


def test_reentrant_count_lives_in_redis(client: Any, name: str) -> None:
    lock = make(name, client)
    owner = identity.thread_owner()
    assert lock.acquire() and lock.acquire()
    assert client.hgetall(hash_key(name)) == {owner.encode(): b"2", b"#t": b"30000"}  # and the ttl
    assert 0 < client.pttl(hash_key(name)) <= 30_000
    lock.release()
    assert client.hget(hash_key(name), owner) == b"1"
    lock.release()
    assert not client.exists(hash_key(name))


def test_other_thread_waits_and_gets_it_after_release(client: Any, name: str) -> None:
    lock = make(name, client)
    lock.acquire()
    got = threading.Event()

    def contender() -> None:
        with lock:
            got.set()

    t = threading.Thread(target=contender)
    t.start()
    assert not got.wait(0.2)
    lock.release()
    assert got.wait(5)
    t.join()


def test_locked_sees_holders_of_any_thread(client: Any, name: str) -> None:
    lock = make(name, client)
    assert not lock.locked()
    with held_by_another_thread(lock):
        assert lock.locked() and not lock._is_owned()
    assert not lock.locked()


def test_two_objects_same_name_are_one_lock(client: Any, name: str) -> None:
    a, b = make(name, client), make(name, client)
    assert a.acquire()
    assert b.acquire(blocking=False)  # same thread, same name: re-entry
    assert client.hget(hash_key(name), identity.thread_owner()) == b"2"
    b.release()
    a.release()
    assert not client.exists(hash_key(name))


def test_one_round_trip_per_uncontended_operation(
    counting: CountingRedis, client: Any, name: str
) -> None:
    lock = make(name, counting)
    lock.acquire()  # first use may load the script (NOSCRIPT), so measure afterwards
    lock.release()
    counting.commands.clear()
    lock.acquire()
    lock.acquire()
    lock.release()
    lock.release()
    assert counting.commands == ["EVALSHA"] * 4


def test_release_save_and_acquire_restore(client: Any, name: str) -> None:
    lock = make(name, client)
    lock.acquire()
    lock.acquire()
    state = lock._release_save()
    assert not client.exists(hash_key(name)) and lock._recursion_count() == 0
    lock._acquire_restore(state)
    assert lock._recursion_count() == 2
    assert client.hget(hash_key(name), identity.thread_owner()) == b"2"
    lock.release()
    lock.release()


def test_condition_notifies_across_threads(client: Any, name: str) -> None:
    lock = make(name, client)
    cond = threading.Condition(lock)
    waiting = threading.Event()
    seen: List[Any] = []  # the consumer's wait() result and whether it held the lock after

    def consumer() -> None:
        try:
            with cond:
                waiting.set()  # still holding: the notifier gets in only once wait() let go
                # wait(), not wait_for(): wait_for returns its predicate after the timeout,
                # so it would pass without any notify.
                seen.append(cond.wait(timeout=30))
                seen.append(lock._is_owned())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            seen.append(exc)

    t = threading.Thread(target=consumer)
    t.start()
    assert waiting.wait(10)
    with cond:  # acquirable only after the consumer's wait() released it in Redis
        cond.notify()
    t.join(60)
    assert not t.is_alive()
    assert seen == [True, True]  # woken by the notify (False would be the timeout)
    assert not client.exists(hash_key(name))


def test_repr_is_local_and_does_no_io(counting: CountingRedis, name: str) -> None:
    lock = make(name, counting)
    counting.commands.clear()
    assert "not held here" in repr(lock) and repr(name) in repr(lock)
    lock.acquire()
    lock.acquire()
    counting.commands.clear()
    text = repr(lock)
    assert counting.commands == []
    assert "count=2" in text and identity.thread_owner() in text
    lock.release()
    lock.release()


@pytest.mark.parametrize(
    "suffix", ["a:b", "{x}", "}", "{", "%7B", "x y", "ünï©ødé", "line\nbreak", '"]]--', "%"]
)
def test_awkward_names_are_distinct_and_inert(client: Any, name: str, suffix: str) -> None:
    plain = make(name, client)
    odd = make(name + suffix, client)
    with odd:
        assert plain.acquire(blocking=False)  # a different lock: not blocked
        plain.release()
        key = f"{NAMESPACE}:rlock:{{{escape(name + suffix)}}}"
        assert client.hget(key, identity.thread_owner()) == b"1"
        assert not client.exists(hash_key(name))
        # The whole name sits inside one hash tag: from the first '{' to the first '}'.
        tag = key[key.index("{") + 1 : key.index("}")]
        assert tag == escape(name + suffix)
    assert not odd.locked()


# -- bad input: a clear error, naming the lock, and no change in Redis ----------------------


@pytest.mark.parametrize(
    "bad, error",
    [(None, TypeError), (1, TypeError), (b"x", TypeError), ("", ValueError), ("\ud800", ValueError)],
)
def test_bad_names(counting: CountingRedis, bad: Any, error: type) -> None:
    # A bad name maps to no key, so "nothing changed in Redis" means: nothing was sent.
    # (A snapshot of the whole namespace would also see other tests' leases expire.)
    counting.commands.clear()
    with pytest.raises(error, match="name"):
        rlocks.RLock(bad, client=counting, namespace=NAMESPACE)
    assert counting.commands == []


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"ttl": "1"}, TypeError, "ttl must be a number"),
        ({"ttl": None}, TypeError, "ttl must be a number"),
        ({"ttl": True}, TypeError, "not bool"),
        ({"ttl": math.nan}, ValueError, "NaN"),
        ({"ttl": math.inf}, ValueError, "positive, finite"),
        ({"ttl": 0}, ValueError, "positive, finite"),
        ({"ttl": -1}, ValueError, "positive, finite"),
        ({"ttl": 0.0001}, ValueError, "at least 0.001"),
        ({"namespace": ""}, ValueError, "namespace must not be empty"),
        ({"namespace": 3}, TypeError, "namespace must be a str"),
        ({"on_lost": 3}, TypeError, "on_lost must be callable"),
        ({"client": "redis://localhost"}, TypeError, "client must be a redis.Redis"),
    ],
)
def test_bad_constructor_arguments(
    client: Any, name: str, kwargs: Any, error: type, words: str
) -> None:
    before = snapshot(client)
    kwargs.setdefault("client", client)
    kwargs.setdefault("namespace", NAMESPACE)
    with pytest.raises(error, match=words) as info:
        rlocks.RLock(name, **kwargs)
    assert name in str(info.value)
    assert snapshot(client) == before


def test_async_client_is_refused(name: str, redis_url: str) -> None:
    import redis.asyncio

    with pytest.raises(TypeError, match="redis.asyncio"):
        rlocks.RLock(name, client=redis.asyncio.Redis.from_url(redis_url))


@pytest.mark.parametrize(
    "args, kwargs, error, words",
    [
        ((), {"timeout": math.nan}, ValueError, "NaN"),
        ((), {"timeout": -2}, ValueError, "non-negative"),
        ((), {"timeout": -0.5}, ValueError, "non-negative"),
        ((), {"timeout": "1"}, TypeError, "timeout must be a number"),
        ((), {"timeout": None}, TypeError, "timeout must be a number"),
        ((), {"timeout": 1e100}, OverflowError, "TIMEOUT_MAX"),
        ((), {"timeout": math.inf}, OverflowError, "TIMEOUT_MAX"),
        ((False, 1), {}, ValueError, "non-blocking"),
    ],
)
def test_bad_acquire_arguments_change_nothing(
    client: Any, name: str, args: Any, kwargs: Any, error: type, words: str
) -> None:
    lock = make(name, client)
    other = make(name + "-held", client)
    other.acquire()  # some state in Redis that must stay exactly as it is
    before = snapshot(client)
    with pytest.raises(error, match=words) as info:
        lock.acquire(*args, **kwargs)
    assert name in str(info.value)
    assert snapshot(client) == before
    assert lock._recursion_count() == 0
    other.release()


def test_release_unheld_raises_runtime_error_naming_lock(client: Any, name: str) -> None:
    lock = make(name, client)
    with pytest.raises(RuntimeError, match="un-acquired") as info:
        lock.release()
    assert isinstance(info.value, rlocks.NotOwnedError) and name in str(info.value)


def test_release_of_other_threads_hold_changes_nothing(client: Any, name: str) -> None:
    lock = make(name, client)
    with held_by_another_thread(lock):
        before = snapshot(client)
        with pytest.raises(rlocks.NotOwnedError):
            lock.release()
        with pytest.raises(rlocks.NotOwnedError):
            lock._release_save()
        assert snapshot(client) == before


# -- lost holds ------------------------------------------------------------------------------


def test_deleted_key_makes_release_raise_lock_lost(client: Any, name: str) -> None:
    lost: List[Any] = []
    lock = make(name, client, on_lost=lost.append)
    lock.acquire()
    client.delete(hash_key(name))
    thief = make(name, client)
    stolen = threading.Event()
    t = threading.Thread(target=lambda: (thief.acquire(), stolen.set()))
    t.start()
    assert stolen.wait(5)
    thief_state = client.hgetall(hash_key(name))
    with pytest.raises(rlocks.LockLostError, match=name) as info:
        lock.release()
    assert isinstance(info.value, RuntimeError)
    assert client.hgetall(hash_key(name)) == thief_state  # the new owner is untouched
    wait_until(lambda: lost == [lock], 5, "on_lost (it runs on the callback thread)")
    assert lock._recursion_count() == 0


def test_a_grant_to_another_thread_tells_the_holder_its_hold_was_lost(
        client: Any, name: str) -> None:
    # A failover that lost the hold, here a deleted key: Redis grants the lock to another
    # thread of this process, which proves the holder's hold gone. The holder knows at
    # once, before any renewal (a long ttl) or its own release (which, sent again after a
    # broken link, could not tell the loss from its own first send's work).
    lost: List[Any] = []
    lock = make(name, client, ttl=60, on_lost=lost.append)
    lock.acquire()
    client.delete(hash_key(name))
    thief = make(name, client)
    in_other_thread = threading.Thread(target=thief.acquire)
    in_other_thread.start()
    in_other_thread.join(10)
    assert not lock.owned()
    wait_until(lambda: lost == [lock], 5, "on_lost (it runs on the callback thread)")
    thief_state = client.hgetall(hash_key(name))
    with pytest.raises(rlocks.LockLostError):
        lock.release()
    assert client.hgetall(hash_key(name)) == thief_state  # the new owner is untouched


def test_nested_with_reports_a_loss_once(client: Any, name: str) -> None:
    lock = make(name, client)
    with pytest.raises(rlocks.LockLostError) as info:
        with lock:
            with lock:
                client.delete(hash_key(name))
    assert info.value.__context__ is None  # not a second error raised while unwinding
    assert lock._recursion_count() == 0
    assert lock.acquire(blocking=False)  # usable again
    lock.release()


def test_reentering_a_lost_hold_raises(client: Any, name: str) -> None:
    lock = make(name, client)
    lock.acquire()
    client.delete(hash_key(name))
    with pytest.raises(rlocks.LockLostError):
        lock.release()  # discovers the loss; the thread now holds nothing
    lock.acquire()
    lock.acquire()
    client.delete(hash_key(name))
    with pytest.raises(rlocks.LockLostError):
        lock.release()
    with pytest.raises(rlocks.LockLostError, match="re-enter"):
        lock.acquire()  # the remaining level is lost too: re-entering would hide it
    with pytest.raises(rlocks.LockLostError):
        lock.release()
    assert lock._recursion_count() == 0


def test_renewal_finding_the_hold_gone_calls_on_lost(client: Any, name: str) -> None:
    called = threading.Event()
    lock = make(name, client, ttl=0.3, on_lost=lambda _lock: called.set())
    lock.acquire()
    client.delete(hash_key(name))
    assert called.wait(3), "the renewer did not notice within a few periods"
    with pytest.raises(rlocks.LockLostError):
        lock.release()


# -- leases and renewal ----------------------------------------------------------------------


def test_renewal_keeps_a_short_lease_alive(client: Any, name: str) -> None:
    # Renewals are waited for, not slept through (a 0.3 s lease, then a 1 s one, slept
    # through for three leases, left a loaded machine 0.2 s, then 0.67 s: both lost).
    lost: List[Any] = []
    lock = make(name, client, ttl=RENEWED_TTL, on_lost=lost.append)
    lock.acquire()
    wait_renewed(client, hash_key(name))
    assert client.hget(hash_key(name), identity.thread_owner()) == b"1"
    lock.release()  # raises LockLostError if the lease ever lapsed
    assert lost == []


def test_without_auto_renew_the_lease_ends(client: Any, name: str) -> None:
    lock = make(name, client, ttl=0.2, auto_renew=False)
    lock.acquire()
    assert wait_for(lambda: not client.exists(hash_key(name)), timeout=2)
    with pytest.raises(rlocks.LockLostError):
        lock.release()


def test_reentry_after_silent_expiry_raises_lock_lost(client: Any, name: str) -> None:
    # The lease ended with nobody noticing (no renewal, no release): re-entering must not
    # come back as a fresh hold that an inner release would then free under the outer one.
    lock = make(name, client, ttl=0.2, auto_renew=False)
    lock.acquire()
    assert wait_for(lambda: not client.exists(hash_key(name)), timeout=5)
    with pytest.raises(rlocks.LockLostError):
        lock.acquire()
    assert not client.exists(hash_key(name))  # nothing was granted
    with pytest.raises(rlocks.LockLostError):
        lock.release()
    assert lock._recursion_count() == 0
    assert lock.acquire(blocking=False)  # usable again once the loss was released
    lock.release()


def test_dropped_held_lock_is_no_longer_renewed(client: Any, name: str) -> None:
    lock = make(name, client, ttl=0.3)
    lock.acquire()
    del lock
    gc.collect()
    assert wait_for(lambda: not client.exists(hash_key(name)), timeout=3)


def test_renewals_are_batched_in_one_pipeline(counting: CountingRedis, name: str) -> None:
    # A 3 s lease: with 0.9 s a renewer starved 0.6 s on a loaded machine lost holds, and
    # the few leases left made small pipelines (the ratio below failed, batching worked).
    lost: List[Any] = []
    locks = [make(f"{name}-{i}", counting, ttl=3.0, on_lost=lost.append) for i in range(100)]
    for lock in locks:
        lock.acquire()
    counting.pipelines = counting.pipelined = 0
    # About three renewals per lease (waited for, not slept for: a loaded machine renews
    # late, and acquiring 100 locks there spreads their due times over more batches).
    assert wait_for(lambda: counting.pipelined >= 300 or lost != [], timeout=60)
    pipelines, renewals = counting.pipelines, counting.pipelined
    assert lost == [], f"{len(lost)} holds lost: the renewer was starved past their lease"
    for lock in locks:
        lock.release()
    # Batched, a pipeline takes every lease due within a quarter period: at most ~4 per
    # period whatever the timing, so >= ~25 renewals each. Unbatched: 1 each.
    assert renewals >= 10 * pipelines, (renewals, pipelines)


class SocketErrorRedis(redis.Redis):  # type: ignore[type-arg]
    """A real client whose pipelines (the renewer's round trips) fail with a bare OSError,
    as a socket error that redis-py does not wrap would; it counts them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failed = 0

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        pipe = super().pipeline(*args, **kwargs)

        def execute(*a: Any, **k: Any) -> Any:
            self.failed += 1
            raise OSError(104, "Connection reset by peer")

        pipe.execute = execute
        return pipe


class BuggyRenewalRedis(redis.Redis):  # type: ignore[type-arg]
    """A real client whose pipelines (the renewer's round trips) fail with an error that
    is a bug's, not the link's."""

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        pipe = super().pipeline(*args, **kwargs)

        def execute(*a: Any, **k: Any) -> Any:
            raise RuntimeError("a bug in a renewal")

        pipe.execute = execute
        return pipe


def test_a_renewal_bug_in_one_pool_leaves_the_other_pools_holds_renewed(
    redis_url: str, client: Any, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An unexpected error in one pool's renewals (a bug, not Redis out of reach) is
    logged with its traceback and treated as a failed renewal of that pool's holds only:
    its hold is reported lost at its lease's end, and the report names the error; the
    other pool's hold goes on being renewed. (Each pool has its own renewer thread here, so this states the behaviour
    rather than guarding a past bug; the asyncio twin, one renewer task per loop for
    every pool, is test_asyncio's, and that one died.)"""
    lost = threading.Event()
    own = BuggyRenewalRedis.from_url(redis_url)
    broken = make(name, own, ttl=RENEWED_TTL, on_lost=lambda _: lost.set())
    healthy = make(f"{name}-2", client, ttl=RENEWED_TTL)
    try:
        assert broken.acquire() and healthy.acquire()
        wait_renewed(client, hash_key(f"{name}-2"), 3)
        assert lost.wait(3 * RENEWED_TTL)
        healthy.release()
        with pytest.raises(rlocks.LockLostError):
            broken.release()
    finally:
        own.close()
    # (the loss is said to be that failure, not Redis out of reach)
    assert any(r.levelno == logging.WARNING and "lost by" in r.getMessage()
               and "RuntimeError('a bug in a renewal')" in r.getMessage()
               for r in caplog.records)
    assert any(r.levelno == logging.ERROR and repr(name) in r.getMessage()
               and r.exc_info is not None and isinstance(r.exc_info[1], RuntimeError)
               for r in caplog.records)


def test_a_renewal_failing_with_an_oserror_is_retried_then_the_hold_lost(
    redis_url: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # One policy for both renewers: Redis could not be reached this time, so retry until
    # the lease is over, then report the hold lost. The threading renewer used to take an
    # OSError for a bug: an ERROR with its traceback per retry. A 4.5 s lease: the first
    # attempt is due at 1.5 s (a third), retries at most 0.1 s apart (renewal.RETRY) until
    # the lease ends at 4.5 s. Two are counted unless the first came 3 s late, past the
    # lease end (a 0.6 s lease allowed 0.4 s).
    caplog.set_level(logging.DEBUG, logger="rlocks")
    client = SocketErrorRedis.from_url(redis_url)
    lost = threading.Event()
    lock = make(name, client, ttl=4.5, on_lost=lambda _: lost.set())
    lock.acquire()
    assert lost.wait(30)
    assert client.failed >= 2  # retried before the lease was over
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert any(r.levelno == logging.DEBUG and "renewal of" in r.getMessage()
               and "failed" in r.getMessage() for r in caplog.records)


# -- waiting ---------------------------------------------------------------------------------


def test_release_wakes_one_waiter_not_all(counting: CountingRedis, name: str) -> None:
    # ttl=30 and a 60 s queue entry: a parked waiter asks again by itself only every
    # 20 s (a third of its entry), and no deadlock check runs, so every attempt counted
    # below is one the release caused.
    lock = make(name, counting, ttl=30, entry_lease=60.0, deadlock_timeout=None)
    lock.acquire()
    stop = threading.Event()
    entered: List[int] = []

    def waiter(i: int) -> None:
        # (30 s each: beyond the 15 s the test may wait for the others to park)
        if lock.acquire(timeout=30):
            entered.append(i)
            stop.wait(30)
            lock.release()

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    # All six have failed their attempts and are parked (wait for it: a late attempt
    # would be counted below).
    assert wait_for(lambda: all(parked(t) for t in threads), timeout=10)
    counting.commands.clear()
    counting.sent.clear()
    lock.release()
    # The window ends at a state, not after a pause: one waiter entered and the other
    # five parked again with no wake-up pending (a woken waiter's event stays set until
    # its wait returns; it clears it then, before its attempt). Every attempt this
    # release caused is then counted, however late the machine runs them.
    assert wait_for(
        lambda: len(entered) == 1
        and all(parked(t) for i, t in enumerate(threads) if i not in entered)
        and not any(w.pending() for w in waiters_of(lock)),
        timeout=15,
    )
    # The waiters' script calls (not our release): the woken head's claim, and at most
    # one more (a waiter woken too). A script this server had not seen yet costs an
    # EVALSHA answered NOSCRIPT and a SCRIPT LOAD before the call itself: such a call
    # did nothing and is not an attempt.
    waiters = [c for who, c in counting.sent if who != "MainThread"]
    calls = sum(waiters.count(command) for command in SCRIPT_CALLS)
    attempts = calls - waiters.count("SCRIPT LOAD")
    assert len(entered) == 1
    assert attempts <= 2, (f"one release caused {attempts} acquire attempts", counting.sent)
    stop.set()
    for t in threads:
        t.join(15)
        assert not t.is_alive(), "a waiter did not finish"
    assert sorted(entered) == list(range(6))


def test_timeout_is_honoured_while_held(client: Any, name: str) -> None:
    # Held by this thread until the contender is done, so only the deadline ends the
    # wait: 3 s of slack over the 0.3 s time-out. Nothing else wakes the contender within
    # 10 s (the 30 s lease, a 30 s queue entry asked again every 10 s, no deadlock
    # checks), so one that overslept its deadline is past the bound, and one that
    # ignored it is still waiting when the join gives up.
    lock = make(name, client, ttl=30, entry_lease=30.0, deadlock_timeout=None)
    lock.acquire()
    result: List[Any] = []

    def contender() -> None:
        start = time.monotonic()
        result.append(lock.acquire(timeout=0.3))
        result.append(time.monotonic() - start)

    t = threading.Thread(target=contender)
    t.start()
    try:
        t.join(10)
        assert not t.is_alive(), "acquire(timeout=0.3) did not return"
    finally:
        lock.release()  # lets a hung contender finish, whatever happened
        t.join(10)
    assert result[0] is False and 0.25 <= result[1] < 3.3, result


def test_crashed_holder_without_release_is_waited_out(client: Any, name: str) -> None:
    # A hold left by an owner that vanished (a field nobody renews) ends with its lease;
    # a waiter must notice without any wake-up message. It looks again at least every
    # third of its queue entry's lease (2 s), so it notices within about a second of the
    # 0.4 s lease's end; 3 s of slack here. One that waited for a message would sleep
    # until its 30 s deadline.
    client.hset(hash_key(name), "ghost-owner", 1)
    client.pexpire(hash_key(name), 400)
    lock = make(name, client)
    start = time.monotonic()
    assert lock.acquire(timeout=30)
    assert time.monotonic() - start < 3.4
    lock.release()


# -- Redis going away ------------------------------------------------------------------------


def test_unreachable_redis_raises_promptly_and_changes_nothing_locally(name: str) -> None:
    with TemporaryRedisServer() as server:
        client = redis.Redis.from_url(server.url, socket_timeout=1, socket_connect_timeout=1)
        lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
        lock.acquire()
        server.stop()
        start = time.monotonic()
        with pytest.raises(redis.exceptions.ConnectionError):
            lock.release()
        # The local hold is dropped so nothing keeps renewing it; the server-side lease
        # would end on its own.
        assert lock._recursion_count() == 0
        with pytest.raises(redis.exceptions.ConnectionError):
            lock.acquire(timeout=0.5)
        assert time.monotonic() - start < 10
        assert lock._recursion_count() == 0


def test_direct_path_sends_one_script_call_per_operation(name: str) -> None:
    # Counted by the server, on a server of its own, for a plain redis.Redis (which takes
    # the pre-packed path that CountingRedis, as an instrumented subclass, does not).
    with TemporaryRedisServer() as server:
        client = redis.Redis.from_url(server.url)
        lock = rlocks.RLock(name, client=client, namespace=NAMESPACE, auto_renew=False)
        lock.acquire()  # loads the scripts (NOSCRIPT recovery) and packs the calls
        lock.release()

        before = script_calls(client)
        for _ in range(10):
            lock.acquire()
            lock.acquire()
            lock.release()
            lock.release()
        assert script_calls(client) - before == 40
        assert client.info("commandstats")["cmdstat_evalsha"]["calls"] >= 40
        assert not lock.locked()
        client.close()


def test_log_records_acquired_waited_renewed_lost(
    client: Any, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="rlocks")
    lock = make(name, client, ttl=1.0)  # 0.3 s left a loaded machine 0.2 s to renew
    lock.acquire()
    contender = threading.Thread(target=lambda: lock.acquire(timeout=0.2))
    contender.start()
    contender.join()
    mine = repr(name)  # the renewal's record names the lock
    assert wait_for(
        lambda: any(
            r.getMessage().startswith("renewed") and mine in r.getMessage()
            for r in caplog.records
        ),
        3,
    )
    client.delete(hash_key(name))
    with pytest.raises(rlocks.LockLostError):
        lock.release()
    records = [(r.levelno, r.name, r.getMessage()) for r in caplog.records]
    def has(level: int, words: str) -> bool:
        return any(lvl == level and n.startswith("rlocks.") and words in m for lvl, n, m in records)
    assert has(logging.DEBUG, "acquired by")
    assert has(logging.DEBUG, "waited") and has(logging.DEBUG, "gave up")
    assert has(logging.WARNING, "lost by")


def test_statistics_reports_holders_leases_and_waiters(client: Any, name: str) -> None:
    lock = make(name, client)
    empty = lock.statistics()
    assert empty.holders == () and empty.name == name and empty.lease_ms is None
    lock.acquire()
    lock.acquire()
    got: List[Any] = []
    waiting = threading.Thread(
        target=lambda: (got.append(lock.acquire(timeout=30)), lock.release())
    )
    waiting.start()
    # Its queue entry: statistics reads the queue.
    assert wait_for(lambda: client.zcard(lock._keys.queue) == 1, 30)
    stats = lock.statistics()
    assert [(h.owner, h.count) for h in stats.holders] == [(identity.thread_owner(), 2)]
    assert stats.type == "RLock" and 29_000 < (stats.lease_ms or 0) <= 30_000
    assert sum(n for _, n in stats.waiting or ()) == 1  # one waiting thread
    with pytest.raises(AttributeError):
        stats.name = "x"  # type: ignore[misc]  # frozen
    lock.release()
    lock.release()
    waiting.join(30)
    assert not waiting.is_alive() and got == [True]


@pytest.mark.timeout(30)
def test_a_burst_of_waiting_threads_opens_a_few_connections_not_one_each(
    client: Any, redis_url: str, name: str
) -> None:
    # 32 threads of one process arrive at once at a held lock. The README's performance
    # table promises a few extra connections for a crowd of waiting threads, not one
    # each: the subscriber, the renewer's, and a few calls in flight (the probe of 64
    # threads once saw 62 connections). Counted once all 32 wait for a wake-up.
    tag = f"burst-{uuid.uuid4().hex[:8]}"
    mine = redis.Redis.from_url(redis_url, client_name=tag)
    # (deadlock checks off: each waiter past its timeout would run its own reads)
    holder = make(name, mine, deadlock_timeout=None)
    assert holder.acquire()
    go = threading.Event()
    served: List[bool] = []

    def arrive() -> None:
        go.wait(10)
        lock = make(name, mine, deadlock_timeout=None)
        served.append(lock.acquire(timeout=20))
        lock.release()

    threads = [threading.Thread(target=arrive, daemon=True) for _ in range(32)]
    for t in threads:
        t.start()
    go.set()
    assert wait_for(lambda: len(hub_waiters(holder)) == 32, 10)
    opened = [c for c in client.client_list() if c.get("name") == tag]
    assert len(opened) <= 5, [c.get("cmd") for c in opened]  # 4 above + the holder's
    holder.release()
    for t in threads:
        t.join(20)
    assert served == [True] * 32
    mine.close()


@pytest.mark.timeout(20)
def test_reentry_does_not_queue_behind_local_waiters(client: Any, name: str) -> None:
    # Waiters queue in arrival order, but a holder's re-entry must not join that queue:
    # the waiters wait for it, so queueing it would deadlock.
    lock = make(name, client)
    lock.acquire()
    got: List[Any] = []
    waiter = threading.Thread(target=lambda: (got.append(lock.acquire(timeout=30)), lock.release()))
    waiter.start()
    # queued (refused) and waiting for a wake-up
    assert wait_for(lambda: client.zcard(lock._keys.queue) == 1 and len(hub_waiters(lock)) == 1)
    assert lock.acquire(timeout=5)  # re-entry, with a local waiter queued
    # Granted while the waiter still waits (queued behind it, it would have had to wait
    # for the waiter to give up: a time bound here would be a race).
    assert len(hub_waiters(lock)) == 1 and got == []
    lock.release()
    lock.release()
    waiter.join(30)
    assert not waiter.is_alive() and got == [True]


@pytest.mark.timeout(30)
def test_while_the_channel_is_subscribed_the_first_call_queues_with_no_try_before_it(
    client: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After a wait, the process's wake-up channel stays subscribed: an acquire then goes
    # straight to the call that queues it if refused. A free lock is granted by that one
    # call; a held one queues with it (a single try before it would cost every contended
    # acquire a round trip and a script run).
    from rlocks._engine.primitive import LockSpec

    lock = make(name, client)
    lock.acquire()
    contender = threading.Thread(target=lambda: lock.acquire(timeout=30) and lock.release())
    contender.start()
    channel = lock._keys.wake + identity.process_token()

    def subscribed() -> bool:
        return int(dict(client.pubsub_numsub(channel)).get(channel.encode(), 0)) >= 1

    assert wait_for(lambda: subscribed() and len(hub_waiters(lock)) == 1)
    lock.release()
    contender.join(10)
    assert not contender.is_alive() and subscribed()

    calls: List[bool] = []
    build = LockSpec.acquire

    def recorded(self: Any, p: Any, owner: str, expect: int, entry_ms: int) -> Any:
        calls.append(entry_ms > 0)  # True: the call queues the caller if it is refused
        return build(self, p, owner, expect, entry_ms)

    monkeypatch.setattr(LockSpec, "acquire", recorded)
    assert lock.acquire(timeout=5)  # free: granted by the queueing call itself
    assert calls == [True] and hub_waiters(lock) == []
    lock.release()
    # A timeout that runs out at once does not refuse a free lock without asking
    # (threading's acquire(timeout=...) takes a free lock whatever it is).
    assert lock.acquire(timeout=1e-9)
    assert calls == [True, True]
    held: List[bool] = []
    other = threading.Thread(target=lambda: held.append(lock.acquire(timeout=0.3)))
    other.start()
    other.join(10)
    assert held == [False] and calls[2] is True  # held: it queued at its first call
    lock.release()


@pytest.mark.timeout(30)
def test_waiters_of_one_process_are_served_in_arrival_order(client: Any, name: str) -> None:
    lock = make(name, client)
    lock.acquire()
    order: List[int] = []
    threads = []
    for i in range(5):
        t = threading.Thread(target=lambda i=i: (lock.acquire(), order.append(i), lock.release()))
        t.start()
        threads.append(t)
        # the next thread arrives only once this one is queued
        assert wait_for(lambda: len(hub_waiters(lock)) == i + 1)
    lock.release()
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2, 3, 4]


@pytest.mark.timeout(20)
def test_reentry_through_another_object_does_not_queue_behind_local_waiters(
    client: Any, name: str
) -> None:
    # Two objects with one name are one lock (two @synchronized functions sharing a name
    # make one object each): re-entering through the second object while another thread
    # of this process waits must be granted at once, not queued behind that waiter.
    outer, inner = make(name, client), make(name, client)
    outer.acquire()
    got: List[Any] = []
    waiter = threading.Thread(target=lambda: (got.append(inner.acquire(timeout=30)), inner.release()))
    waiter.start()
    assert wait_for(lambda: client.zcard(inner._keys.queue) == 1 and len(hub_waiters(inner)) == 1)
    assert inner.acquire(timeout=5)
    assert len(hub_waiters(inner)) == 1 and got == []  # granted while the waiter waits
    inner.release()
    outer.release()
    waiter.join(30)
    assert not waiter.is_alive() and got == [True]


@pytest.mark.timeout(20)
def test_nested_synchronized_functions_sharing_a_name_with_a_waiter(
    client: Any, name: str
) -> None:
    calls: List[str] = []
    gate = threading.Event()
    probe = make(name, client)  # (names the lock's keys; never acquired)

    @rlocks.synchronized(name, client=client, namespace=NAMESPACE)
    def inner(who: str) -> None:
        calls.append(who)

    @rlocks.synchronized(name, client=client, namespace=NAMESPACE)
    def outer() -> None:
        gate.set()
        # b queued behind this frame's hold and waits for a wake-up
        assert wait_for(lambda: client.zcard(probe._keys.queue) == 1
                        and len(hub_waiters(probe)) == 1)
        inner("outer")  # re-entry through the other function's lock object

    a = threading.Thread(target=outer)
    a.start()
    assert gate.wait(5)
    b = threading.Thread(target=inner, args=("b",))
    b.start()
    a.join(10)
    b.join(10)
    assert not a.is_alive() and not b.is_alive()
    assert calls == ["outer", "b"]


def test_a_shorter_ttl_inside_never_shortens_the_outer_hold(
    client: "redis.Redis[bytes]", name: str
) -> None:
    # Issue 10 A: RLock(name, ttl=30) around a @synchronized(name, ttl=1) function: the
    # inner grant set the key's lease to 1 s, and once the inner object stopped renewing,
    # another process could take the lock while the outer frame still held it.
    outer = rlocks.RLock(name, client=client, namespace=NAMESPACE, ttl=30)
    key = f"{NAMESPACE}:rlock:{{{name}}}"

    @rlocks.synchronized(name, client=client, namespace=NAMESPACE, ttl=1)
    def inner() -> int:
        return int(client.pttl(key))

    with outer:
        assert inner() > 20_000
        assert client.pttl(key) > 20_000, "the inner release left the outer hold a short lease"
        other: List[bool] = []
        thread = threading.Thread(target=lambda: other.append(outer.acquire(blocking=False)))
        thread.start()
        thread.join(10)
        assert other == [False]
    assert not client.exists(key)
