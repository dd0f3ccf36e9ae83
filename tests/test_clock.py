"""Wall-clock jumps change no lease and no timeout (freezegun).

rlocks measures waits and schedules renewals with the real ``time.monotonic``, captured in
a closure at import (:mod:`rlocks._engine.clock`), and leaves leases to the Redis server
(relative PEXPIRE, never an absolute time computed here). freezegun replaces
``time.time``, ``time.monotonic`` and ``time.perf_counter`` (and module attributes bound
to them) while active, so every test below also checks, first, that the clock it runs
under really is frozen: otherwise it would prove nothing.

Why each test fails if rlocks read the frozen clock (``time.monotonic`` at call time):

- timeout tests: ``acquire(timeout=0.5)`` sets ``deadline = now() + 0.5`` and sleeps (real
  Event waits) at most until the deadline before looking at ``now()`` again.
  * frozen: ``now()`` never advances, so the deadline never passes: the call waits until
    the holder lets go (30 s), the join below (10 s) times out, the test fails;
  * backward: ``now()`` drops by years, the deadline is years away: same hang;
  * forward: after the jump, a spurious wake-up (a hint ``<key>\\n<owner>`` naming the
    waiter, published on its process's wake-up channel as a release would) makes the
    waiter look at ``now()`` again; it is days past the deadline, so the call returns
    False after a few ms instead of 0.5 s and the lower bound on the real elapsed time
    fails. (A hint the waiter does not read, such as one naming nobody, would let it
    sleep to its own 0.5 s: no failure.)
- renewal test: the renewer sleeps until ``lease.due`` by ``now()``. Frozen, ``now()``
  never reaches ``due``; moved backward, ``due`` is years away. Either way the 4.5 s
  lease is not renewed, the key expires, the wait for a renewal times out (or sees the
  key gone) and on_lost fires.
- PTTL tests: a lease computed from the wall clock (PEXPIREAT ``time.time() + ttl``)
  would be in 2001, already past (the key would vanish at once), or days long after a
  jump; the PTTL checks bound it to the relative ttl.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Callable, List

import pytest
import redis
from freezegun import freeze_time

import rlocks
from rlocks._engine.identity import process_token, thread_owner

from ._threads import hub_waiters
from .conftest import NAMESPACE


def _real(clock: Callable[[], float]) -> Callable[[], float]:
    # Held in a closure: freezegun patches module attributes that *are* the real
    # functions, not functions that merely call them.
    def now() -> float:
        return clock()

    return now


real_now = _real(time.perf_counter)
real_sleep = threading.Event().wait  # threading is on freezegun's ignore list

FROZEN_AT = "2001-01-01 00:00:00"


def hash_key(name: str) -> str:
    return f"{NAMESPACE}:rlock:{{{name}}}"


def assert_clock_frozen() -> None:
    """The premise: under freezegun, time.monotonic and perf_counter stand still."""
    m, p = time.monotonic(), time.perf_counter()
    real_sleep(0.02)
    assert (time.monotonic(), time.perf_counter()) == (m, p), "freezegun did not freeze"


def wait_real(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = real_now() + timeout
    while not predicate():
        assert real_now() < deadline, f"timed out after {timeout} s waiting for {what}"
        real_sleep(0.005)


def jump(frozen, how: str) -> None:  # type: ignore[no-untyped-def]
    if how == "forward":
        frozen.move_to("2031-06-01 12:00:00")
        frozen.tick(datetime.timedelta(days=3))
    elif how == "backward":
        frozen.move_to("1990-01-01 00:00:00")
        frozen.tick(datetime.timedelta(days=-3))


@pytest.mark.timeout(40)
@pytest.mark.parametrize("how", ["frozen", "forward", "backward"])
def test_acquire_timeout_runs_on_real_time_whatever_the_wall_clock_does(
    client: "redis.Redis[bytes]", name: str, how: str
) -> None:
    lock = rlocks.RLock(name, client=client, ttl=30.0, namespace=NAMESPACE)
    channel = lock._keys.wake + process_token()  # the contender waits in this process
    outcome: List[object] = []
    owners: List[str] = []
    with freeze_time(FROZEN_AT) as frozen:
        assert_clock_frozen()
        assert lock.acquire()

        def contend() -> None:
            owners.append(thread_owner())
            began = real_now()
            got = lock.acquire(timeout=0.5)
            outcome.extend([got, real_now() - began])
            if got:  # only if the test is failing; do not leave it held
                lock.release()

        contender = threading.Thread(target=contend, daemon=True)
        contender.start()
        try:
            # The contender is in its wait loop (deadline fixed) once its entry is queued,
            # it waits for hints, and its process's subscriber listens on the channel.
            wait_real(
                lambda: client.zcard(lock._keys.queue) == 1
                and hub_waiters(lock) == owners
                and dict(client.pubsub_numsub(channel)).get(channel.encode(), 0) >= 1,
                5,
                "the contender to wait",
            )
            jump(frozen, how)
            # A spurious wake-up it reads (see the module docstring): look at the clock.
            assert client.publish(channel, f"{lock._keys.hash}\n{owners[0]}") >= 1
            contender.join(10)
            assert not contender.is_alive(), "acquire(timeout=0.5) did not return"
        finally:
            lock.release()  # lets a hung contender finish, whatever happened
            contender.join(10)
    got, elapsed = outcome
    assert got is False
    # A clock that was followed costs days (no return before the holder lets go, or a
    # return within ms): the upper bound leaves a loaded machine 4.5 s of slack.
    assert 0.45 <= elapsed <= 5.0, f"acquire(timeout=0.5) returned after {elapsed:.3f} s"
    assert not client.exists(hash_key(name))


@pytest.mark.timeout(20)
def test_lease_pttl_is_unchanged_by_wall_clock_jumps(
    client: "redis.Redis[bytes]", name: str
) -> None:
    key = hash_key(name)
    ttl_ms = 30_000
    lock = rlocks.RLock(name, client=client, ttl=ttl_ms / 1000, namespace=NAMESPACE)
    with freeze_time(FROZEN_AT) as frozen:
        assert_clock_frozen()
        assert lock.acquire()
        assert ttl_ms - 1000 < client.pttl(key) <= ttl_ms  # relative to now, not to 2001
        for how in ("forward", "backward"):
            # The clock starts before the first PTTL is sent and stops after the second is
            # answered, so it spans both evaluations on the server (started after the
            # first answer, a preemption between that answer and the clock went uncounted:
            # 4 ms off the lease against 0.6 ms counted, once, in CI).
            since = real_now()
            before = client.pttl(key)
            jump(frozen, how)
            after = client.pttl(key)
            spent_ms = (real_now() - since) * 1000
            # Only the real time spent has come off the lease: not days, not years.
            assert before - spent_ms - 2 <= after <= before, (how, before, after, spent_ms)
            # A re-entry renews the lease: to ttl from now, whatever the wall clock says.
            assert lock.acquire()
            assert ttl_ms - 1000 < client.pttl(key) <= ttl_ms, how
            lock.release()
        assert lock._recursion_count() == 1
        lock.release()  # no LockLostError: the hold lived through the jumps
    assert not client.exists(key)


@pytest.mark.timeout(60)
def test_renewal_keeps_a_short_lease_alive_through_wall_clock_jumps(
    client: "redis.Redis[bytes]", name: str
) -> None:
    key = hash_key(name)
    # Renewed every 1.5 s: the renewer may come 3 s late before the lease ends (a 1 s
    # lease allowed 0.67 s). Short enough that the five renewals below take ~7.5 s.
    ttl_ms = 4500
    lost = threading.Event()
    lock = rlocks.RLock(
        name,
        client=client,
        ttl=ttl_ms / 1000,
        namespace=NAMESPACE,
        on_lost=lambda _lock: lost.set(),
    )
    last = [ttl_ms]

    def renewed() -> bool:
        pttl = client.pttl(key)
        assert 0 < pttl <= ttl_ms, f"lease is now {pttl} ms (ttl {ttl_ms} ms)"
        grew, last[0] = pttl > last[0], pttl
        return grew

    with freeze_time(FROZEN_AT) as frozen:
        assert_clock_frozen()
        assert lock.acquire()
        last[0] = client.pttl(key)
        for how, renewals in (("frozen", 1), ("forward", 2), ("backward", 2)):
            jump(frozen, how)
            # After a jump, the first renewal may have been scheduled before it; the
            # second was scheduled and waited for under this clock. Frozen, the hold was
            # taken under it, so even its first renewal was.
            for _ in range(renewals):
                wait_real(renewed, 2 * ttl_ms / 1000, f"a renewal with the clock {how}")
        assert not lost.is_set()
        lock.release()  # raises LockLostError if the lease ever lapsed
    assert not client.exists(key)
