"""rlocks.Quorum: RLock and RWLock over 3 and 5 independent masters (the Redlock rules).

Every master is a real redis-server the test starts (tests share none of them with the
session's server). Faults are real too: SIGKILL and SIGSTOP of a master's process.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import threading
import time
from typing import Any, Iterator, List

import pytest
import redis
import redis.asyncio

import rlocks
import rlocks.asyncio
from rlocks._engine.identity import task_owner, thread_owner
from rlocks._engine.primitive import LockSpec
from rlocks._engine.scripts import Call
from rlocks.server import TemporaryRedisServer

from ._servers import wait_until
from ._threads import in_thread

SPAWN = multiprocessing.get_context("spawn")
TIMEOUT = 1.0  # s, the masters' clients' socket timeout: what a paused master costs
BOUND = 4 * TIMEOUT + 2.0  # s, generous bound on one operation with a master paused
# Where no master is made to fail: a socket timeout a loaded machine cannot reach, so that
# exact per-master assertions are not broken by a spurious timeout on one master.
PATIENT = 10.0


def _client(server: TemporaryRedisServer, timeout: float = TIMEOUT) -> "redis.Redis[bytes]":
    return redis.Redis.from_url(
        server.url, socket_timeout=timeout, socket_connect_timeout=timeout
    )


class Masters:
    """``n`` throwaway servers and a client for each."""

    def __init__(self, n: int) -> None:
        self.servers: List[TemporaryRedisServer] = []
        try:
            for _ in range(n):
                self.servers.append(TemporaryRedisServer().start())
        except BaseException:
            self.stop()
            raise
        self.clients = [_client(s) for s in self.servers]
        # The test's own reads and writes of a master's keys: with the 1 s timeout of
        # ``clients`` a loaded machine timed them out, and holders() counted a live master
        # as not holding (a paused master is skipped, a killed one refuses at once).
        self.direct = [_client(s, PATIENT) for s in self.servers]
        self.stopped: List[int] = []

    def quorum(self, timeout: float = TIMEOUT) -> rlocks.Quorum:
        if timeout == TIMEOUT:
            return rlocks.Quorum(self.clients)
        return rlocks.Quorum([_client(s, timeout) for s in self.servers])

    def kill(self, i: int) -> None:
        process = self.servers[i].process
        assert process is not None
        os.kill(process.pid, signal.SIGKILL)
        process.wait(5)

    def pause(self, i: int) -> None:
        process = self.servers[i].process
        assert process is not None
        os.kill(process.pid, signal.SIGSTOP)
        self.stopped.append(i)

    def resume(self, i: int) -> None:
        process = self.servers[i].process
        assert process is not None
        os.kill(process.pid, signal.SIGCONT)
        self.stopped.remove(i)

    def holders(self, key: str) -> List[int]:
        """Which masters (indexes) have ``key``; a dead or paused one is skipped."""
        return [i for i, c in enumerate(self.direct)
                if i not in self.stopped and self._exists(c, key)]

    @staticmethod
    def _exists(client: Any, key: str) -> bool:
        try:
            return bool(client.exists(key))
        except redis.RedisError:
            return False

    def stop(self) -> None:
        for i in list(getattr(self, "stopped", [])):
            self.resume(i)
        for s in self.servers:
            s.stop()


@pytest.fixture(params=[3, 5], ids=["3-masters", "5-masters"])
def masters(request: pytest.FixtureRequest) -> Iterator[Masters]:
    m = Masters(request.param)
    yield m
    m.stop()


@pytest.fixture
def three() -> Iterator[Masters]:
    m = Masters(3)
    yield m
    m.stop()


def rlock_key(name: str) -> str:
    return f"rlocks:rlock:{{{name}}}"


class Holder:
    """A thread that holds ``lock`` until told to release it."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.held = threading.Event()
        self.go = threading.Event()
        self.errors: List[BaseException] = []
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        assert self.held.wait(30), "the holder did not get the lock"
        if self.errors:
            raise self.errors[0]

    def _run(self) -> None:
        try:
            self.lock.acquire()
            self.held.set()
            self.go.wait(60)
            self.lock.release()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            self.errors.append(exc)
            self.held.set()

    def release(self) -> None:
        self.go.set()
        self.thread.join(30)
        assert not self.thread.is_alive()
        if self.errors:
            raise self.errors[0]


# -- bad input: before any I/O -------------------------------------------------------------


def _unreachable(port: int) -> "redis.Redis[bytes]":
    # Port numbers nothing listens on: construction must not connect anyway.
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.1)


@pytest.mark.parametrize("count", [0, 1, 2, 4, 6])
def test_quorum_needs_an_odd_number_of_at_least_three(count: int) -> None:
    with pytest.raises(ValueError, match="odd number of masters, at least 3"):
        rlocks.Quorum([_unreachable(1 + i) for i in range(count)])


@pytest.mark.parametrize("bad", ["redis://x", b"abc", None, 3, {"a": 1}])
def test_quorum_refuses_what_is_not_a_list_of_clients(bad: Any) -> None:
    with pytest.raises(TypeError, match="list or tuple of redis clients"):
        rlocks.Quorum(bad)


def test_quorum_refuses_non_clients_and_mixed_kinds() -> None:
    with pytest.raises(TypeError, match="every client must be"):
        rlocks.Quorum([_unreachable(1), _unreachable(2), "redis://127.0.0.1:3"])
    mixed = [_unreachable(1), _unreachable(2), redis.asyncio.Redis(port=3)]
    with pytest.raises(TypeError, match="mix redis.Redis and redis.asyncio.Redis"):
        rlocks.Quorum(mixed)


def test_quorum_refuses_the_same_master_twice() -> None:
    a = _unreachable(1)
    with pytest.raises(ValueError, match="same master"):
        rlocks.Quorum([a, _unreachable(2), a])
    with pytest.raises(ValueError, match="same master"):
        rlocks.Quorum([a, _unreachable(2), _unreachable(1)])  # another pool, same address
    twin = redis.Redis(connection_pool=a.connection_pool)
    with pytest.raises(ValueError, match="same master"):
        rlocks.Quorum([a, _unreachable(2), twin])


def test_semaphores_refuse_a_quorum_and_say_why() -> None:
    q = rlocks.Quorum([_unreachable(1), _unreachable(2), _unreachable(3)])
    for kind in (rlocks.Semaphore, rlocks.BoundedSemaphore):
        with pytest.raises(ValueError, match="majorities of per-master counts do not bound"):
            kind("s", 2, client=q)


def test_quorum_kind_must_match_the_primitive() -> None:
    sync = rlocks.Quorum([_unreachable(1), _unreachable(2), _unreachable(3)])
    aio = rlocks.Quorum([redis.asyncio.Redis(port=p) for p in (1, 2, 3)])
    with pytest.raises(TypeError, match="redis.asyncio clients"):
        rlocks.RLock("x", client=aio)
    with pytest.raises(TypeError, match="redis.asyncio clients"):
        rlocks.RWLock("x", client=aio)
    with pytest.raises(TypeError, match="are redis.Redis clients"):
        rlocks.asyncio.RLock("x", client=sync)
    with pytest.raises(TypeError, match="are redis.Redis clients"):
        rlocks.asyncio.RWLock("x", client=sync)
    for kind in (rlocks.asyncio.Semaphore, rlocks.asyncio.BoundedSemaphore):
        with pytest.raises(ValueError, match="majorities of per-master counts do not bound"):
            kind("s", 2, client=aio)
    with pytest.raises(ValueError, match="replicas= is not supported with a Quorum"):
        rlocks.RLock("x", client=sync, replicas=1)


# -- exclusion, re-entry, RWLock sides --------------------------------------------------


def test_rlock_exclusion_and_reentry(masters: Masters, name: str) -> None:
    q = masters.quorum(PATIENT)
    lock = rlocks.RLock(name, client=q, ttl=10)
    assert lock.acquire(blocking=False)
    assert lock.acquire(blocking=False)  # re-entry
    key = rlock_key(name)
    assert masters.holders(key) == list(range(len(masters.clients)))
    counts = {int(c.hvals(key)[0]) for c in masters.clients}
    assert counts == {2}
    assert lock.locked()
    assert in_thread(lambda: lock.acquire(timeout=0.2)) is False
    lock.release()
    assert in_thread(lambda: lock.acquire(blocking=False)) is False
    lock.release()
    assert masters.holders(key) == []
    assert not lock.locked()
    assert in_thread(lambda: (lock.acquire(blocking=False), lock.release())[0]) is True


class _BrokenRenewal(Call):
    """A renewal call whose sending raises (a bug, not Redis out of reach)."""

    __slots__ = ()

    def command(self, sha: bool = True) -> Any:
        raise RuntimeError("a bug in a renewal")


class _BrokenRenewals(LockSpec):
    """An RLock's spec whose renewal calls are :class:`_BrokenRenewal`."""

    __slots__ = ()

    def renew(self, p: Any, owner: str, ttl_ms: int) -> Call:
        c = super().renew(p, owner, ttl_ms)
        return _BrokenRenewal(c.script, c.keys, c.args)


def test_a_renewal_bug_on_a_quorum_is_logged_and_the_hold_reported_lost(
    three: Masters, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in a quorum renewal (each master's call returns what it raised as its
    result) is logged at ERROR with its traceback, naming the primitive, and the hold is
    reported lost at its lease's end as a failure naming the error, not as Redis out of
    reach."""
    lost = threading.Event()
    lock = rlocks.RLock(name, client=three.quorum(PATIENT), ttl=1.5, on_lost=lambda _: lost.set())
    lock._spec = _BrokenRenewals("rlock", "x")  # (the renewal call is built at the grant)
    assert lock.acquire(blocking=False)
    assert lost.wait(10)
    with pytest.raises(rlocks.LockLostError):
        lock.release()
    assert any(r.levelno == logging.ERROR and repr(name) in r.getMessage()
               and r.exc_info is not None for r in caplog.records), caplog.text
    assert any(r.levelno == logging.WARNING and "lost" in r.getMessage()
               and "RuntimeError" in r.getMessage() and "reach" not in r.getMessage()
               for r in caplog.records), caplog.text


def test_waiter_gets_the_lock_when_released(masters: Masters, name: str) -> None:
    lock = rlocks.RLock(name, client=masters.quorum(PATIENT), ttl=10)
    holder = Holder(lock)
    got: List[float] = []

    def waiter() -> bool:
        ok = lock.acquire(timeout=20)
        got.append(time.monotonic())
        lock.release()
        return ok

    t0: List[float] = []
    result: List[bool] = []
    t = threading.Thread(target=lambda: result.append(waiter()))
    t.start()
    time.sleep(0.1)  # not an assertion's bound: only gives the waiter time to start waiting
    t0.append(time.monotonic())
    holder.release()
    t.join(30)
    assert result == [True]
    assert got[0] >= t0[0]


def test_rwlock_sides(masters: Masters, name: str) -> None:
    rw = rlocks.RWLock(name, client=masters.quorum(PATIENT), ttl=10)
    with rw.read_lock:
        # Readers share; a writer waits for them.
        assert in_thread(lambda: (rw.read_lock.acquire(blocking=False),
                                  rw.read_lock.release())[0]) is True
        assert in_thread(lambda: rw.write_lock.acquire(blocking=False)) is False
        assert rw.read_lock.locked() and not rw.write_lock.locked()
        with pytest.raises(rlocks.UpgradeError):
            rw.write_lock.acquire(timeout=1)
    with rw.write_lock:
        with rw.write_lock:  # re-entry
            assert rw.write_lock.locked()
            assert in_thread(lambda: rw.read_lock.acquire(blocking=False)) is False
            assert in_thread(lambda: rw.write_lock.acquire(timeout=0.2)) is False
    assert not rw.write_lock.locked()
    assert in_thread(lambda: (rw.write_lock.acquire(blocking=False),
                              rw.write_lock.release())[0]) is True


# -- the majority rule and the validity window --------------------------------------------


def test_a_minority_grant_is_given_back_at_once(three: Masters, name: str) -> None:
    """Two masters held by another owner (single-server locks of the same name): the
    quorum try is granted only by the third, which gives it back before returning."""
    single = [rlocks.RLock(name, client=c, ttl=30) for c in three.clients]
    h1, h2 = Holder(single[1]), Holder(single[2])
    lock = rlocks.RLock(name, client=three.quorum(PATIENT), ttl=30)
    key = rlock_key(name)
    try:
        assert lock.acquire(blocking=False) is False
        assert three.holders(key) == [1, 2]  # nothing left on master 0 (lease was 30 s)
        assert lock.acquire(timeout=0.3) is False
        assert three.holders(key) == [1, 2]
        h2.release()
        # Masters 0 and 2 are free now: a majority of 3.
        assert lock.acquire(blocking=False) is True
        assert three.holders(key) == [0, 1, 2]
        lock.release()
        assert three.holders(key) == [1]
    finally:
        h1.release()
        h2.go.set()


def test_a_grant_that_took_longer_than_the_lease_is_refused(three: Masters, name: str) -> None:
    """A paused master makes the try last one socket timeout (1 s): with a 0.3 s lease
    the majority's grants have expired by then, so the try must fail; with 5 s it holds."""
    three.pause(2)
    short = rlocks.RLock(name, client=three.quorum(), ttl=0.3)
    started = time.monotonic()
    assert short.acquire(blocking=False) is False
    assert time.monotonic() - started < BOUND
    longer = rlocks.RLock(name + "-2", client=three.quorum(), ttl=5)
    assert longer.acquire(blocking=False) is True
    longer.release()


# -- a master down or paused: bounded, and everything still works -------------------------


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_one_master_fails_while_held(masters: Masters, name: str, fault: str) -> None:
    lock = rlocks.RLock(name, client=masters.quorum(), ttl=5)
    assert lock.acquire()
    (masters.kill if fault == "kill" else masters.pause)(0)
    for op in (lambda: lock.acquire(), lock.release, lock.release):
        started = time.monotonic()
        op()
        assert time.monotonic() - started < BOUND
    started = time.monotonic()
    assert in_thread(lambda: (lock.acquire(timeout=10), lock.release())[0]) is True
    assert time.monotonic() - started < 2 * BOUND


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_one_master_fails_while_waiting(masters: Masters, name: str, fault: str) -> None:
    lock = rlocks.RLock(name, client=masters.quorum(), ttl=5)
    holder = Holder(lock)
    result: List[bool] = []
    errors: List[BaseException] = []

    def waiter() -> None:
        try:
            result.append(lock.acquire(timeout=30))
            lock.release()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    (masters.kill if fault == "kill" else masters.pause)(1)
    started = time.monotonic()
    holder.release()
    t.join(30)
    assert not t.is_alive()
    if errors:
        raise errors[0]
    assert result == [True]
    assert time.monotonic() - started < 2 * BOUND


# -- losing a majority ----------------------------------------------------------------------


def test_renewal_reports_a_hold_lost_on_a_majority(three: Masters, name: str) -> None:
    lost: List[Any] = []
    # No master is paused here: clients with a long socket timeout, so that a loaded
    # machine cannot fail the renewals themselves.
    lock = rlocks.RLock(name, client=three.quorum(PATIENT), ttl=3.0, on_lost=lost.append)
    assert lock.acquire()
    key = rlock_key(name)
    assert three.holders(key) == [0, 1, 2]
    three.direct[0].delete(key)  # one master forgot it: still a majority
    hold = lock._hold(thread_owner())
    for _ in range(2):  # two renewals (every ttl/3) find it on only 2 of 3: not lost
        seen = hold.lease_end
        wait_until(lambda: hold.lease_end > seen or lost != [], 15, "a renewal")
        assert lost == []
    assert lock.owned()
    three.direct[1].delete(key)  # now only a minority has it
    wait_until(lambda: lost == [lock], 10, "on_lost after the majority forgot the hold")
    with pytest.raises(rlocks.LockLostError):
        lock.release()


def test_a_majority_of_masters_killed_loses_the_hold(three: Masters, name: str) -> None:
    lost: List[Any] = []
    lock = rlocks.RLock(name, client=three.quorum(), ttl=1.0, on_lost=lost.append)
    assert lock.acquire()
    three.kill(0)
    three.kill(1)
    wait_until(lambda: lost == [lock], 10, "on_lost after two of three masters died")
    with pytest.raises(rlocks.LockLostError):
        lock.release()
    # With no majority reachable, a try fails with the connection error, in bounded time.
    started = time.monotonic()
    with pytest.raises(redis.RedisError):
        lock.acquire(blocking=False)
    assert time.monotonic() - started < BOUND


def test_extend_and_release_find_a_hold_gone_from_a_majority(
    three: Masters, name: str
) -> None:
    lock = rlocks.RLock(name, client=three.quorum(PATIENT), ttl=10, auto_renew=False)
    assert lock.acquire()
    key = rlock_key(name)
    three.direct[0].delete(key)  # a minority forgot it: extend still works
    lock.extend(60)
    assert all(c.pttl(key) > 30_000 for c in three.direct[1:])
    three.direct[1].delete(key)
    with pytest.raises(rlocks.LockLostError):
        lock.extend(60)
    with pytest.raises(rlocks.LockLostError):
        lock.release()
    lock = rlocks.RLock(name, client=three.quorum(PATIENT), ttl=10, auto_renew=False)
    assert lock.acquire()
    for c in three.direct[1:]:
        c.delete(key)
    with pytest.raises(rlocks.LockLostError):
        lock.release()
    assert three.holders(rlock_key(name)) == []  # master 0's copy was given back too


def test_a_release_with_one_master_down_and_one_refusing_is_done(
    three: Masters, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Held on masters 0 and 2 only (master 1 forgot it); master 0 is killed. The
    release frees master 2 and reports done: master 0's hold ends with its lease, as the
    Redlock rules count it, and nobody waits for it. An extend cannot count master 0:
    it raises the connection error. (A process that raised here failed
    test_processes_never_hold_at_once now and then.)"""
    lock = rlocks.RLock(name, client=three.quorum(PATIENT), ttl=10, auto_renew=False)
    assert lock.acquire()
    key = rlock_key(name)
    three.direct[1].delete(key)
    three.kill(0)
    with pytest.raises(redis.ConnectionError):
        lock.extend(60)
    assert lock.owned()
    with caplog.at_level("WARNING", logger="rlocks"):
        lock.release()
    assert not lock.owned()
    assert three.holders(key) == []
    assert "released on 1 of 3 masters; 1 unreachable" in caplog.text
    other = rlocks.RLock(name, client=three.quorum(PATIENT), ttl=10)
    assert in_thread(lambda: other.acquire(blocking=False)) is True


def test_asyncio_release_with_one_master_down_and_one_refusing_is_done(
    three: Masters, name: str
) -> None:
    async def main() -> None:
        lock = rlocks.asyncio.RLock(name, client=_aquorum(three, PATIENT), ttl=10,
                                    auto_renew=False)
        assert await lock.acquire()
        key = rlock_key(name)
        three.direct[1].delete(key)
        three.kill(0)
        with pytest.raises(redis.ConnectionError):
            await lock.extend(60)
        await lock.release()
        assert not lock.owned()
        assert three.holders(key) == []

    asyncio.run(main())


# -- two processes never hold at once ---------------------------------------------------------


def _contender(urls: List[str], counter_url: str, name: str, rounds: int) -> None:
    # A killed master refuses connections at once: no short timeout needed here.
    clients = [redis.Redis.from_url(u, socket_timeout=PATIENT, socket_connect_timeout=PATIENT)
               for u in urls]
    counter = redis.Redis.from_url(counter_url, socket_timeout=10)
    lock = rlocks.RLock(name, client=rlocks.Quorum(clients), ttl=5)
    for _ in range(rounds):
        assert lock.acquire(timeout=60)
        try:
            if counter.incr("inside") != 1:
                counter.rpush("overlaps", os.getpid())
            counter.incr("total")
            time.sleep(0.002)
            counter.decr("inside")
        finally:
            lock.release()


def test_processes_never_hold_at_once(three: Masters, name: str) -> None:
    """Three processes take turns; master 0 is SIGKILLed half-way through. A counter on
    a fourth server, changed only inside the critical section, never sees two inside."""
    rounds, procs = 40, 3
    with TemporaryRedisServer() as counter_server:
        counter = redis.Redis.from_url(counter_server.url)
        urls = [s.url for s in three.servers]
        children = [SPAWN.Process(target=_contender,
                                  args=(urls, counter_server.url, name, rounds))
                    for _ in range(procs)]
        for child in children:
            child.start()
        try:
            wait_until(lambda: int(counter.get("total") or 0) >= rounds, 60,
                       "a third of the rounds")
            three.kill(0)
            for child in children:
                child.join(120)
        finally:
            for child in children:
                if child.is_alive():
                    child.kill()
        assert [c.exitcode for c in children] == [0] * procs
        assert counter.lrange("overlaps", 0, -1) == []
        assert int(counter.get("total") or 0) == rounds * procs


# -- the asyncio twins ------------------------------------------------------------------------


def _aquorum(m: Masters, timeout: float = TIMEOUT) -> rlocks.Quorum:
    return rlocks.Quorum([
        redis.asyncio.Redis.from_url(
            s.url, socket_timeout=timeout, socket_connect_timeout=timeout
        ) for s in m.servers
    ])


def test_asyncio_rlock_and_rwlock(masters: Masters, name: str) -> None:
    async def main() -> None:
        q = _aquorum(masters, PATIENT)
        lock = rlocks.asyncio.RLock(name, client=q, ttl=10)
        assert await lock.acquire(blocking=False)
        assert await lock.acquire(blocking=False)
        key = rlock_key(name)
        assert {int(c.hvals(key)[0]) for c in masters.clients} == {2}
        assert await lock.locked()
        other = asyncio.ensure_future(lock.acquire(timeout=20))
        await asyncio.sleep(0.05)  # lets the other task try and start waiting
        assert not other.done()
        await lock.release()
        assert not other.done()  # still one level held
        await lock.release()
        assert await other is True
        # A majority at least: a re-try that overlapped the release may have found some
        # masters still held (its grants there are the majority it needed).
        assert len(masters.holders(key)) >= q.majority
        rw = rlocks.asyncio.RWLock(name, client=q, ttl=10)
        async with rw.read_lock:
            assert await rw.read_lock.locked() and not await rw.write_lock.locked()
            writer = asyncio.ensure_future(rw.write_lock.acquire(timeout=0.3))
            assert await writer is False
        async with rw.write_lock:
            assert await rw.write_lock.locked()
        assert not await rw.write_lock.locked()

    asyncio.run(main())


def test_asyncio_master_paused_and_majority_lost(three: Masters, name: str) -> None:
    async def main() -> None:
        lost: List[Any] = []
        lock = rlocks.asyncio.RLock(name, client=_aquorum(three), ttl=3.0,
                                    on_lost=lost.append)
        assert await lock.acquire()
        three.pause(0)
        for op in (lock.acquire, lock.release):
            started = time.monotonic()
            await op()
            assert time.monotonic() - started < BOUND
        # Renewals keep it on the two others: its end on master 1 moves later. (Not "its
        # pttl grows": read just after the release or a renewal, it is already the full
        # ttl, and later reads come at least that soon after a renewal only by chance.)
        def ends() -> float:
            return time.time() * 1000.0 + three.direct[1].pttl(rlock_key(name))

        before = ends()
        deadline = time.monotonic() + 10
        while ends() < before + 500:  # a renewal moves it about a third of the ttl
            assert time.monotonic() < deadline, "no renewal"
            await asyncio.sleep(0.01)
        assert lost == []
        three.direct[1].delete(rlock_key(name))  # now only master 2 has it
        deadline = time.monotonic() + 10
        while lost != [lock]:
            assert time.monotonic() < deadline, "on_lost not called"
            await asyncio.sleep(0.01)
        with pytest.raises(rlocks.LockLostError):
            await lock.release()

    asyncio.run(main())


def test_asyncio_cancelled_try_leaves_nothing(three: Masters, name: str) -> None:
    """A waiter cancelled while it waits (between tries or in one) holds nothing after."""
    async def main() -> None:
        q = _aquorum(three)
        lock = rlocks.asyncio.RLock(name, client=q, ttl=30)
        single = rlocks.RLock(name, client=three.clients[2], ttl=30)
        holder = Holder(single)  # one master busy: every try is 2 of 3, granted
        try:
            three.pause(1)  # ...and each try lasts a socket timeout
            task = asyncio.ensure_future(lock.acquire())
            await asyncio.sleep(0.1)  # the try is in flight (it lasts 1 s)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # Master 0 granted and got it back. (Master 1 runs the try it had queued when
            # it resumes: that grant, made after the caller gave up, ends with its lease.)
            assert three.holders(rlock_key(name)) == [2]
            assert not lock.owned()
        finally:
            holder.release()

    asyncio.run(main())


class _Alarm(Exception):
    pass


def test_an_interrupted_try_gives_back_its_grants(three: Masters, name: str) -> None:
    """A signal handler raising while a try is in flight (one master paused makes it
    last a socket timeout): the grants the others made are given back once they answer."""

    def ring(signum: int, frame: Any) -> None:
        raise _Alarm()

    lock = rlocks.RLock(name, client=three.quorum(), ttl=30)
    three.pause(1)
    previous = signal.signal(signal.SIGALRM, ring)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(_Alarm):
            lock.acquire()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not lock.owned()
    # Masters 0 and 2 granted at once; their grants (30 s leases) go once master 1's
    # call times out. (Master 1 runs the try when it resumes: that one ends by lease.)
    wait_until(lambda: three.holders(rlock_key(name)) == [], 5, "the grants given back")


# -- fencing tokens and statistics on a quorum ---------------------------------------------


def test_a_condition_on_a_quorum_lock_is_refused_at_construction(
    three: Masters, name: str
) -> None:
    """A Condition keeps its queue on one server: on a Quorum lock it is refused when
    built (ValueError naming why), not at its first wait with an AttributeError."""
    lock = rlocks.RLock(name, client=three.quorum(PATIENT))
    with pytest.raises(ValueError, match="runs on a Quorum"):
        rlocks.Condition(lock)
    rw = rlocks.RWLock(name, client=three.quorum(PATIENT))
    with pytest.raises(ValueError, match="runs on a Quorum"):
        rlocks.Condition(rw.write_lock)


def test_token_is_refused_and_tokens_are_per_master(three: Masters, name: str) -> None:
    """A Quorum's masters count independently: ``token`` (one number) is refused with a
    reason; ``tokens`` has one per master, None where a master did not grant. Any two
    holds' majorities share a master, whose tokens grow: the per-master rule of the
    README orders them."""
    lock = rlocks.RLock(name, client=three.quorum(PATIENT), ttl=10)
    assert lock.tokens is None
    with pytest.raises(rlocks.RLocksError, match=r"independently.*use \.tokens") as caught:
        _ = lock.token
    assert caught.value.name == name
    with lock:
        first = lock.tokens
        assert first is not None and len(first) == 3
        assert all(isinstance(t, int) for t in first), first
        with lock:
            assert lock.tokens == first  # re-entry keeps them
        # So does a re-entry through a second object of the name on the same Quorum
        # (masters grant it as a re-entry, which issues no tokens).
        twin = rlocks.RLock(name, client=lock.client, ttl=10)
        with twin:
            assert twin.tokens == first
    assert lock.tokens is None
    with lock:
        second = lock.tokens
        assert second is not None
        assert all(b > a for a, b in zip(first, second)), (first, second)  # type: ignore[operator]
    three.kill(2)
    with lock:
        third = lock.tokens
        assert third is not None and third[2] is None, third
        assert third[0] > second[0] and third[1] > second[1]  # type: ignore[operator]
    # A single server's lock: its one token, as a tuple.
    single = rlocks.RLock(name, client=three.clients[0], namespace="rlocks-single")
    with single:
        assert single.tokens == (single.token,) and isinstance(single.token, int)


def test_asyncio_statistics_report_what_a_majority_agrees_on(three: Masters, name: str) -> None:
    """The asyncio twin reads every master at once, as ``rlocks.RLock.statistics`` does."""

    async def main() -> None:
        clients = [redis.asyncio.Redis.from_url(s.url, socket_timeout=PATIENT)
                   for s in three.servers]
        lock = rlocks.asyncio.RLock(name, client=rlocks.Quorum(clients), ttl=10)
        try:
            assert (await lock.statistics()).holders == ()
            async with lock:
                owner = task_owner()
                # A hold on one master only (a minority) is no hold of the quorum.
                await clients[0].hset(rlock_key(name), "someone:1:2:3", 1)
                state = await lock.statistics()
                assert [(h.owner, h.count) for h in state.holders] == [(owner, 1)], state
                three.kill(1)  # a majority still answers
                assert [h.owner for h in (await lock.statistics()).holders] == [owner]
            assert (await lock.statistics()).holders == ()
            three.kill(2)
            with pytest.raises(redis.RedisError):
                await lock.statistics()  # one master of three cannot speak for the quorum
        finally:
            for c in clients:
                await c.aclose()

    asyncio.run(main())


def test_rwlock_and_asyncio_tokens_on_a_quorum(three: Masters, name: str) -> None:
    rw = rlocks.RWLock(name, client=three.quorum(PATIENT), ttl=10)
    with rw.write_lock:
        tokens = rw.write_lock.tokens
        assert tokens is not None and all(isinstance(t, int) for t in tokens)
        with pytest.raises(rlocks.RLocksError):
            _ = rw.write_lock.token

    async def main() -> None:
        clients = [redis.asyncio.Redis.from_url(s.url, socket_timeout=PATIENT)
                   for s in three.servers]
        lock = rlocks.asyncio.RLock(f"{name}-a", client=rlocks.Quorum(clients), ttl=10)
        try:
            async with lock:
                got = lock.tokens
                assert got is not None and all(isinstance(t, int) for t in got), got
                with pytest.raises(rlocks.RLocksError):
                    _ = lock.token
            assert lock.tokens is None
        finally:
            for c in clients:
                await c.aclose()

    asyncio.run(main())


def test_statistics_report_what_a_majority_agrees_on(three: Masters, name: str) -> None:
    lock = rlocks.RLock(name, client=three.quorum(PATIENT), ttl=10)
    empty = lock.statistics()
    assert empty.holders == () and empty.type == "RLock" and empty.name == name
    owner = thread_owner()
    with lock, lock:
        state = lock.statistics()
        assert [(h.owner, h.count) for h in state.holders] == [(owner, 2)], state
        lease = state.holders[0].lease_ms
        assert lease is not None and 0 < lease <= 10_000
        # A hold on one master only (a minority) is no hold of the quorum.
        three.clients[0].hset(rlock_key(name), "someone:1:2:3", 1)
        assert [h.owner for h in lock.statistics().holders] == [owner]
        three.kill(1)  # a majority still answers
        assert [h.owner for h in lock.statistics().holders] == [owner]
    assert lock.statistics().holders == ()
    three.kill(2)
    with pytest.raises(redis.RedisError):
        lock.statistics()  # one master of three cannot speak for the quorum
