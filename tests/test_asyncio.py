"""rlocks.asyncio: task-owned twins on a real Redis (each test runs its own event loop)."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import threading
import time
from typing import Any, Awaitable, Callable, Iterator, List

import pytest
import redis
import redis.asyncio

import rlocks
import rlocks.asyncio as ra
from rlocks._engine import backends, identity, renewal
from rlocks._engine.wakeups import Waiter

from ._proxy import FaultyLink
from ._servers import RENEWED_TTL, wait_renewed, wait_until
from ._threads import hub_waiters
from .conftest import NAMESPACE


def run(coro_fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    return asyncio.run(coro_fn(*args))


def key(kind: str, name: str) -> str:
    return f"{NAMESPACE}:{kind}:{{{name}}}"


async def eventually(predicate: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if await predicate():
            return True
        await asyncio.sleep(0.01)
    return await predicate()


@pytest.fixture
def url(redis_url: str) -> str:
    return redis_url


def aclient(url: str) -> "redis.asyncio.Redis[bytes]":
    return redis.asyncio.Redis.from_url(url)


def loop_renewer(prim: Any) -> Any:
    """The running loop's renewer of ``prim``'s backend (no I/O)."""
    return renewal.renewer_for(prim._backend, aio=True)


def loop_hub(prim: Any) -> Any:
    """The running loop's wake-up subscriber for ``prim`` (None before its first wait)."""
    hubs = prim._backend._async_hubs.get(asyncio.get_running_loop(), {})
    return hubs.get(prim._keys.wake)


def wake_channel(prim: Any) -> str:
    """The channel on which this process hears wake-up hints for ``prim``."""
    return str(prim._keys.wake + identity.process_token())


@pytest.fixture
def link(redis_url: str) -> Iterator[FaultyLink]:
    """A proxy to the test server, to hold replies while their commands have run."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with FaultyLink(port) as proxy:
        yield proxy


# -- the loop's renewer -------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_renewer_cancelled_mid_renewal_says_so_and_the_next_acquire_renews_again(
    url: str, name: str, link: FaultyLink, caplog: pytest.LogCaptureFixture
) -> None:
    # Code that cancels every task of a loop that goes on (a shutdown handler) cancels
    # the loop's renewer task too, here while its gather awaits a renewal's reply. The
    # task ends (it does not swallow the cancel), a warning says how many holds are left
    # unrenewed, and the next acquire on the loop starts a new task that renews them.
    held = redis.Redis.from_url(url)

    async def main() -> None:
        slow = aclient(link.url)
        fast = aclient(url)
        lock = ra.RLock(name, client=slow, namespace=NAMESPACE, ttl=RENEWED_TTL)
        assert await lock.acquire()
        renewer = loop_renewer(lock)
        task = renewer._task
        assert task is not None and not task.done()
        # One renewal first (its connection made), then one whose reply is held: it ran
        # on the server, and the renewer's gather awaits the answer. (The test waits for
        # the held reply itself, not for the key's expiry to move: a first read made after
        # that renewal waited for the next one, which came only once the held one had
        # timed out, past the hold's lease; the hold was lost: 1 of a loaded CI run.)
        await asyncio.to_thread(wait_renewed, held, key("rlock", name), 1)
        link.hold_replies()
        await asyncio.to_thread(wait_until, lambda: link.held > 0, 30, "a held renewal reply")
        task.cancel()
        await asyncio.wait([task], timeout=10)
        assert task.cancelled()
        link.heal()
        # (the engine's wording may change; it must say cancelled, and how many holds)
        assert any(re.search(r"cancel.*\b1 hold", r.getMessage()) for r in caplog.records
                   if r.levelno >= logging.WARNING), [r.getMessage() for r in caplog.records]
        other = ra.RLock(name + "-other", client=fast, namespace=NAMESPACE)
        assert await other.acquire()  # starts a new renewer task ...
        assert renewer._task is not task and not renewer._task.done()
        # ... which renews the first hold again (a dead renewer: the key would be gone)
        await asyncio.to_thread(wait_renewed, held, key("rlock", name), 2)
        await lock.release()
        await other.release()
        await slow.aclose()
        await fast.aclose()

    with caplog.at_level(logging.WARNING, logger="rlocks"):
        run(main)
    held.close()


# -- RLock --------------------------------------------------------------------------------


def test_reentrant_per_task_and_exclusive_between_tasks(url: str, name: str) -> None:
    async def main() -> None:
        c = aclient(url)
        lock = ra.RLock(name, client=c, namespace=NAMESPACE)
        assert await lock.acquire() and await lock.acquire()
        assert lock._recursion_count() == 2
        assert await c.hget(key("rlock", name), identity.task_owner()) == b"2"

        async def other() -> bool:
            assert not lock._is_owned()
            return await lock.acquire(timeout=0.2)

        assert await asyncio.create_task(other()) is False
        got = asyncio.create_task(lock.acquire(timeout=5))
        await asyncio.sleep(0.05)
        await lock.release()
        assert not got.done()  # still held once
        await lock.release()
        assert await asyncio.wait_for(got, 5) is True
        await c.aclose()

    run(main)


def test_async_and_threading_twins_share_one_lock(url: str, name: str, client: Any) -> None:
    sync_lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    held, let_go = threading.Event(), threading.Event()

    def holder() -> None:
        with sync_lock:
            held.set()
            let_go.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(5)

    async def main() -> List[bool]:
        lock = ra.RLock(name, client=aclient(url), namespace=NAMESPACE)
        first = await lock.acquire(blocking=False)
        let_go.set()  # the thread releases; the waiting task is woken by it
        second = await lock.acquire(timeout=5)
        await lock.release()
        return [first, second]

    assert run(main) == [False, True]
    thread.join(5)


def test_release_by_another_task_raises_and_changes_nothing(url: str, name: str) -> None:
    async def main() -> None:
        c = aclient(url)
        lock = ra.RLock(name, client=c, namespace=NAMESPACE)
        await lock.acquire()
        before = await c.hgetall(key("rlock", name))

        async def intruder() -> None:
            with pytest.raises(RuntimeError, match="un-acquired"):
                await lock.release()

        await asyncio.create_task(intruder())
        assert await c.hgetall(key("rlock", name)) == before
        await lock.release()

    run(main)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"timeout": math.nan}, ValueError),
        ({"timeout": -2}, ValueError),
        ({"timeout": "1"}, TypeError),
        ({"timeout": math.inf}, OverflowError),
        ({"blocking": False, "timeout": 1}, ValueError),
    ],
)
def test_bad_acquire_arguments(url: str, name: str, kwargs: Any, error: type) -> None:
    async def main() -> None:
        c = aclient(url)
        lock = ra.RLock(name, client=c, namespace=NAMESPACE)
        with pytest.raises(error, match=re.escape(name)):
            await lock.acquire(**kwargs)
        assert not await c.exists(key("rlock", name))

    run(main)


def test_wrong_client_kind_and_sync_with_are_refused(client: Any, name: str) -> None:
    with pytest.raises(TypeError, match="redis.asyncio"):
        ra.RLock(name, client=client)
    with pytest.raises(TypeError, match="asyncio"):
        rlocks.RLock(name, client=redis.asyncio.Redis())
    with pytest.raises(TypeError, match="async with"):
        with ra.RLock(name, namespace=NAMESPACE):
            pass


def test_default_client_comes_from_rlocks_url(name: str) -> None:
    async def main() -> None:
        lock = ra.RLock(name, namespace=NAMESPACE)  # RLOCKS_URL -> the test server
        async with lock:
            assert await lock.locked()
        assert not await lock.locked()

    run(main)


def test_waiting_does_not_block_the_event_loop(url: str, name: str) -> None:
    async def main() -> int:
        lock = ra.RLock(name, client=aclient(url), namespace=NAMESPACE)
        await lock.acquire()
        waiter = asyncio.create_task(lock.acquire(timeout=0.5))
        ticks = 0
        while not waiter.done():
            await asyncio.sleep(0.01)
            ticks += 1
        assert waiter.result() is False
        await lock.release()
        return ticks

    assert run(main) >= 20  # ~50 expected; a blocked loop would give ~1


def test_a_short_timeout_takes_a_free_lock_while_the_channel_lingers(
    url: str, name: str
) -> None:
    # After a wait the loop's wake-up subscriber stays subscribed, and an acquire's first
    # call is the queueing one; a timeout that ran out before it was sent must not refuse
    # a free lock without asking (the threading twin: test_rlock).
    async def main() -> None:
        lock = ra.RLock(name, client=aclient(url), namespace=NAMESPACE)
        await lock.acquire()
        waiter = asyncio.create_task(lock.acquire(timeout=0.2))
        assert await waiter is False
        await lock.release()
        hub = loop_hub(lock)
        assert hub is not None and hub.ready.is_set()  # still listening
        for _ in range(5):
            assert await lock.acquire(timeout=1e-9)
            await lock.release()

    run(main)


def test_cancelled_waiter_leaves_nothing_behind(url: str, name: str) -> None:
    async def main() -> None:
        c = aclient(url)
        lock = ra.RLock(name, client=c, namespace=NAMESPACE)
        await lock.acquire()
        waiters = [asyncio.create_task(lock.acquire()) for _ in range(3)]
        # All three wait (a cancel before that would test nothing).
        assert await eventually(lambda: _waiting(lock, 3), 10)
        waiters[0].cancel()
        await _ended(waiters[:1])
        assert waiters[0].cancelled()
        await lock.release()
        # The wake-up goes to a live waiter, not to the cancelled one.
        done, _ = await asyncio.wait(waiters[1:], timeout=5, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        for task in waiters[1:]:
            task.cancel()
        await _ended(waiters[1:])
        # The winner's task ended holding it (as a thread would); nothing else is left.
        fields = await c.hkeys(key("rlock", name))
        assert len([f for f in fields if not f.startswith(b"#")]) == 1, fields

    run(main)


@pytest.mark.timeout(60)
def test_a_cancel_turned_into_a_timeout_in_a_condition_look_still_cancels_the_wait(
    url: str, link: FaultyLink, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On Python 3.11, asyncio.timeout turns a cancel that races a read timeout into
    # TimeoutError, which redis.asyncio raises as its TimeoutError: a link error a
    # Condition wait rides out (d61f095), so the cancelled task would go on waiting for
    # its notification. Here the look's (cond_check) reply is held on the way back, the
    # task is cancelled while it awaits it, and a cancel that reaches the call is turned
    # so: the task must still end, cancelled, holding the lock again (as
    # asyncio.Condition.wait does) until its ``async with`` lets it go.
    original = backends.Server.arun
    looks = [0]  # looks awaiting their answer

    async def arun(self: Any, call: Any) -> Any:
        looking = call.script.name.startswith("cond_check")
        looks[0] += looking
        try:
            return await original(self, call)
        except asyncio.CancelledError:
            raise redis.exceptions.TimeoutError("Timeout reading from the socket") from None
        finally:
            looks[0] -= looking

    monkeypatch.setattr(backends.Server, "arun", arun)

    async def main() -> None:
        c = aclient(link.url)
        lock = ra.RLock(name, client=c, namespace=NAMESPACE, ttl=1.5)
        cond = ra.Condition(lock)
        entered = asyncio.Event()

        async def wait() -> bool:
            async with cond:
                entered.set()
                return await cond.wait(30)

        direct = aclient(url)
        waiter = asyncio.create_task(wait())
        await asyncio.wait_for(entered.wait(), 10)
        # in its wait: the lock given up (so its join and release are answered), and its
        # subscriber listening (a confirmation held below would delay its first look by
        # up to 5 s, which a loaded CI lane once stretched past the 10 s below)
        assert await eventually(lambda: _absent(direct, key("rlock", name)), 10)
        assert await eventually(lambda: _true(_listening(lock)), 10)
        link.hold_replies()
        # a look (one every third of the ttl) is sent and its answer held
        assert await eventually(lambda: _true(looks[0] > 0), 10)
        await asyncio.sleep(0.1)
        waiter.cancel()
        await asyncio.sleep(0.1)
        link.heal()
        await _ended([waiter], 10)
        assert waiter.cancelled()
        assert not lock._is_owned()  # (the task's hold ended with its ``async with``)
        async with lock:
            pass
        await c.aclose()
        await direct.aclose()

    run(main)


async def _true(value: bool) -> bool:
    return value


def _listening(prim: Any) -> bool:
    """Whether the running loop's wake-up subscriber for ``prim`` has its subscription
    confirmed (no I/O)."""
    hub = prim._backend._async_hubs.get(asyncio.get_running_loop(), {}).get(prim._keys.wake)
    return hub is not None and bool(hub.ready.is_set())


def test_cancel_while_the_acquire_script_is_in_flight_gives_the_hold_back(
    url: str, link: FaultyLink, name: str
) -> None:
    async def main() -> None:
        c = aclient(link.url)
        direct = aclient(url)
        lock = ra.RLock(name, client=c, namespace=NAMESPACE)
        await lock.acquire()  # loads the script, so the held call is the grant itself
        await lock.release()
        # The grant runs on the server but its reply is held on the way back: the task is
        # cancelled when the hold is known to exist and the task cannot know it has it.
        link.hold_replies()
        task = asyncio.create_task(lock.acquire())
        assert await eventually(lambda: _present(direct, key("rlock", name)), 10)
        task.cancel()
        link.heal()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The cancelled acquire ends only after it gave the grant back.
        assert await _absent(direct, key("rlock", name))
        assert not lock._is_owned()

    run(main)


async def _ended(tasks: List["asyncio.Task[Any]"], timeout: float = 30.0) -> None:
    """Wait for ``tasks`` (cancelled ones included) to end, at most ``timeout`` s. A task
    still running then (one that swallowed its cancel and went on waiting) fails the test
    with its stack printed, where an unbounded await would hang until pytest-timeout with
    no word of where it was (once in CI, stop 31: test_cancelled_waiter_leaves_nothing_
    behind on Redis 6.2 under load, not reproduced in 52 runs since)."""
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.print_stack()
    assert not pending, f"{len(pending)} task(s) still running after {timeout} s"


async def _absent(c: Any, k: str) -> bool:
    return not await c.exists(k)


def _queued(prim: Any) -> int:
    """How many owners of this process wait for wake-up hints on ``prim`` (no I/O)."""
    return len(hub_waiters(prim))


async def _waiting(prim: Any, n: int) -> bool:
    return _queued(prim) == n


async def _present(c: Any, k: str) -> bool:
    return bool(await c.exists(k))


def test_renewal_task_keeps_a_short_lease_and_reports_a_loss(
    url: str, name: str, client: Any
) -> None:
    async def main() -> None:
        c = aclient(url)
        lost = asyncio.Event()
        loop = asyncio.get_running_loop()
        # A plain on_lost runs on rlocks' callback thread: it reaches the loop thread-safely.
        lock = ra.RLock(
            name, client=c, namespace=NAMESPACE, ttl=RENEWED_TTL,
            on_lost=lambda _l: loop.call_soon_threadsafe(lost.set),
        )
        await lock.acquire()
        # (in a thread, so that this loop, whose task renews, goes on running)
        await asyncio.to_thread(wait_renewed, client, key("rlock", name))
        assert not lost.is_set()
        await c.delete(key("rlock", name))
        await asyncio.wait_for(lost.wait(), 10)
        with pytest.raises(rlocks.LockLostError):
            await lock.release()

    run(main)


def test_holds_through_the_default_client_are_renewed_with_the_loops_others(
    url: str, name: str, client: Any
) -> None:
    """A primitive built with ``client=None`` (the loop's client for ``RLOCKS_URL``) was
    never renewed: the loop's renewer grouped its renewals by the primitive's own client
    attribute, None, and its task died at the first pass (AttributeError). The hold ended
    after ttl while its task held it, another owner was granted the lock, on_lost was not
    called, and every other hold of that loop went unrenewed too (a bug hunt)."""

    async def main() -> None:
        lost: List[Any] = []
        own = aclient(url)
        default = ra.RLock(name, namespace=NAMESPACE, ttl=RENEWED_TTL, on_lost=lost.append)
        other = ra.RLock(f"{name}-2", client=own, namespace=NAMESPACE,
                         ttl=RENEWED_TTL, on_lost=lost.append)
        try:
            assert await default.acquire() and await other.acquire()
            for held in (name, f"{name}-2"):
                await asyncio.to_thread(wait_renewed, client, key("rlock", held))
            assert lost == []
            await default.release()  # raises LockLostError if the lease had lapsed
            await other.release()
        finally:
            await own.aclose()

    run(main)


def test_a_renewal_bug_in_one_group_leaves_the_loops_other_holds_renewed(
    url: str, name: str, client: Any, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loop's renewal outlives an unexpected error in one client's renewals, as the
    threading renewer does: it logs it, treats it as a failed renewal of that group (its
    hold reported lost at its lease's end) and renews the others. It used to die, and
    every hold of the loop lapsed unnoticed. (The error is raised where a client's
    renewals are sent, for one of the two clients only.)"""
    original = backends.arun_many
    broken_client: List[Any] = []

    async def arun_many(c: Any, calls: Any) -> Any:
        if c in broken_client:
            raise RuntimeError("a bug in building a renewal")
        return await original(c, calls)

    monkeypatch.setattr(backends, "arun_many", arun_many)

    async def main() -> None:
        lost: List[Any] = []
        own, other = aclient(url), aclient(url)  # two pools: two groups of one batch
        broken_client.append(own)
        broken = ra.RLock(name, client=own, namespace=NAMESPACE, ttl=RENEWED_TTL,
                          on_lost=lost.append)
        healthy = ra.RLock(f"{name}-2", client=other, namespace=NAMESPACE,
                           ttl=RENEWED_TTL, on_lost=lost.append)
        try:
            assert await broken.acquire() and await healthy.acquire()
            await asyncio.to_thread(wait_renewed, client, key("rlock", f"{name}-2"), 3)
            assert await eventually(lambda: _lost(lost, broken), 3 * RENEWED_TTL)
            assert lost == [broken]
            await healthy.release()
            with pytest.raises(rlocks.LockLostError):
                await broken.release()
        finally:
            await own.aclose()
            await other.aclose()

    async def _lost(lost: List[Any], prim: Any) -> bool:
        return prim in lost

    with caplog.at_level(logging.WARNING, logger="rlocks"):
        run(main)
    # The error itself is in the log (here: in the loss's WARNING, with the reason).
    assert any(r.levelno >= logging.WARNING and "a bug in building a renewal" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_many_waiting_tasks_share_one_subscriber(url: str, name: str) -> None:
    # A namespace of its own: the wake channel is one per process and namespace, and hubs
    # of earlier tests' clients in this process may still listen on the suite's.
    namespace = f"{NAMESPACE}-{name}"

    async def main_with_handoff() -> None:
        c = aclient(url)
        lock = ra.RLock(name, client=c, namespace=namespace)
        await lock.acquire()

        async def worker() -> bool:
            got = await lock.acquire(timeout=10)
            await lock.release()
            return got

        waiters = [asyncio.create_task(worker()) for _ in range(30)]
        channel = wake_channel(lock)

        async def all_waiting_and_subscribed() -> bool:
            numsub = dict(await c.pubsub_numsub(channel))
            return _queued(lock) == 30 and list(numsub.values()) != [0]

        assert await eventually(all_waiting_and_subscribed, 10)
        numsub = dict(await c.pubsub_numsub(channel))
        assert list(numsub.values()) == [1]
        await lock.release()
        assert await asyncio.wait_for(asyncio.gather(*waiters), 20) == [True] * 30

    run(main_with_handoff)


# -- statistics() -------------------------------------------------------------------------


def test_statistics_is_awaited_and_matches_the_threading_twins(
    url: str, name: str, client: Any
) -> None:
    """The asyncio twins' ``statistics()`` read the same state as the threading ones: the
    holder's count and lease, and one waiting process for a queued task."""

    async def main() -> None:
        c = aclient(url)
        lock = ra.RLock(name, client=c, namespace=NAMESPACE, ttl=20)
        empty = await lock.statistics()
        assert (empty.holders, empty.type, empty.name, empty.lease_ms) == ((), "RLock", name, None)
        assert await lock.acquire() and await lock.acquire()
        waiter = asyncio.create_task(lock.acquire(timeout=30))
        queue = lock._keys.queue
        assert await eventually(lambda: _one_entry(c, queue), 10)
        stats = await lock.statistics()
        assert [(h.owner, h.count) for h in stats.holders] == [(identity.task_owner(), 2)]
        assert 0 < (stats.lease_ms or 0) <= 20_000
        assert sum(n for _, n in stats.waiting or ()) == 1
        twin = rlocks.RLock(name, client=client, namespace=NAMESPACE).statistics()
        assert [(h.owner, h.count) for h in twin.holders] == [(identity.task_owner(), 2)]
        await lock.release()
        await lock.release()
        assert await asyncio.wait_for(waiter, 30) is True
        holder = (await lock.statistics()).holders
        assert len(holder) == 1 and holder[0].owner != identity.task_owner()

        rw = ra.RWLock(f"{name}-rw", client=c, namespace=NAMESPACE)
        async with rw.read_lock:
            for state in (await rw.statistics(), await rw.write_lock.statistics()):
                assert state.type == "RWLock"
                assert [(h.owner, h.side) for h in state.holders] == [
                    (identity.task_owner(), "read")
                ]
        assert (await rw.statistics()).holders == ()

        sem = ra.BoundedSemaphore(f"{name}-sem", 3, client=c, namespace=NAMESPACE)
        assert await sem.acquire() and await sem.acquire()
        stats = await sem.statistics()
        assert (stats.type, stats.value, stats.free) == ("BoundedSemaphore", 3, 1)
        assert [(h.owner, h.count) for h in stats.holders] == [(identity.task_owner(), 2)]
        await sem.release(2)
        assert (await sem.statistics()).holders == ()
        await c.aclose()

    run(main)


async def _one_entry(c: "redis.asyncio.Redis[bytes]", queue: str) -> bool:
    """Whether ``queue`` (a primitive's queue ZSET) holds exactly one entry."""
    return bool(await c.zcard(queue) == 1)


# -- RWLock and semaphores -------------------------------------------------------------------


def test_rwlock_readers_share_writer_excludes_upgrade_refused(url: str, name: str) -> None:
    async def main() -> None:
        rw = ra.RWLock(name, client=aclient(url), namespace=NAMESPACE)
        async with rw.read_lock:
            assert await asyncio.create_task(rw.read_lock.acquire(blocking=False))
            assert not await asyncio.create_task(rw.write_lock.acquire(blocking=False))
            with pytest.raises(rlocks.UpgradeError):
                await rw.write_lock.acquire()
            assert await rw.read_lock.locked()
        # the other task's read hold is still there (its task ended holding it)
        assert await rw.read_lock.locked()

    run(main)


def test_semaphore_pool_peak_equals_its_value(url: str, name: str) -> None:
    async def main() -> int:
        sem = ra.BoundedSemaphore(name, 2, client=aclient(url), namespace=NAMESPACE)
        inside = peak = 0

        async def user() -> None:
            nonlocal inside, peak
            for _ in range(5):
                async with sem:
                    inside += 1
                    peak = max(peak, inside)
                    await asyncio.sleep(0.005)
                    inside -= 1

        await asyncio.gather(*(user() for _ in range(5)))
        with pytest.raises(ValueError, match="too many"):
            await sem.release()
        return peak

    assert run(main) == 2


def test_cancelled_semaphore_waiter_takes_no_permit(url: str, name: str) -> None:
    async def main() -> None:
        c = aclient(url)
        sem = ra.Semaphore(name, 1, client=c, namespace=NAMESPACE)
        await sem.acquire()
        task = asyncio.create_task(sem.acquire())
        assert await eventually(lambda: _waiting(sem, 1), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await sem.release()
        assert await sem.acquire(blocking=False)
        await sem.release()
        assert await eventually(lambda: _absent(c, key("sem", name)), 3)

    run(main)


def test_a_cancel_arriving_as_the_wake_up_lands_is_not_swallowed() -> None:
    # asyncio.wait_for (before 3.12) returns normally if the task is cancelled in the same
    # loop step as its event is set; a cancelled waiter would then go on waiting. The
    # event here is a waiter's own (a wake-up hint sets it; the hub's reader task runs in
    # the same loop, so the hint and a cancel can land in one step).
    async def main() -> None:
        waiter = Waiter("key", identity.task_owner(), None, asyncio.get_running_loop())
        task = asyncio.create_task(waiter.await_(10))
        await asyncio.sleep(0)  # the task is now waiting
        waiter._event.set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main)


def test_a_writer_cancelled_in_its_first_attempt_leaves_no_claim(
    url: str, link: FaultyLink, name: str
) -> None:
    # Issue 12: a waiting writer's mark is its entry in the queue. If the writer is
    # cancelled while queued, with its link slow to answer, the cancelled acquire must
    # still leave the queue, or new readers wait out the entry's lease.
    async def main() -> None:
        c = aclient(link.url)
        direct = aclient(url)
        rw = ra.RWLock(name, client=c, namespace=NAMESPACE, ttl=10)
        assert await asyncio.create_task(rw.read_lock.acquire())  # a reader holds it

        async def claimed() -> bool:
            return bool(await direct.zcard(rw.write_lock._keys.queue))

        writer = asyncio.create_task(rw.write_lock.acquire())
        assert await eventually(claimed, 10)
        # Replies are held on the way back: the leave the cancel sends is answered late.
        link.hold_replies()
        writer.cancel()
        await asyncio.sleep(0.05)
        link.heal()
        with pytest.raises(asyncio.CancelledError):
            await writer
        # The cancelled acquire ends only after its entry left the queue: a new reader
        # gets in at once (an entry ahead of it would refuse it).
        assert not await claimed()
        assert await asyncio.create_task(rw.read_lock.acquire(blocking=False))

    run(main)


# -- a loop whose rlocks tasks were cancelled (shutdown code cancels every task) ------------


def test_a_cancelled_renewer_or_hub_task_is_started_again_by_the_next_use(
    url: str, name: str, client: Any
) -> None:
    """Shutdown code often cancels every other task of a loop that goes on running. A
    hold taken after that must still be renewed (before, the dead renewer task was taken
    for a running one: the hold vanished from Redis while owned() said True), and a
    waiter must still hear its wake-up through a new hub task."""

    async def main() -> None:
        c = aclient(url)
        lock = ra.RLock(name, client=c, namespace=NAMESPACE, ttl=RENEWED_TTL)
        other = ra.RLock(f"{name}-2", client=c, namespace=NAMESPACE, ttl=1)
        holder = ra.RLock(f"{name}-2", client=c, namespace=NAMESPACE, ttl=1)

        async def in_turn() -> bool:
            got = await other.acquire(timeout=20)
            if got:
                await other.release()
            return got

        assert await lock.acquire()  # starts the loop's renewer
        assert await holder.acquire()
        first = asyncio.create_task(in_turn())  # waits: starts the loop's hub
        assert await eventually(lambda: _waiting(other, 1), 10)
        await holder.release()
        assert await asyncio.wait_for(first, 20) is True
        await lock.release()
        renewer_task, hub = loop_renewer(lock)._task, loop_hub(other)
        assert hub is not None
        rlocks_tasks = [renewer_task, hub._task]
        assert all(t is not None and not t.done() for t in rlocks_tasks)
        assert all(t in asyncio.all_tasks() for t in rlocks_tasks)
        for task in rlocks_tasks:
            task.cancel()
        await asyncio.gather(*rlocks_tasks, return_exceptions=True)

        assert await lock.acquire()
        # only a renewer task (started again by this acquire) pushes the lease back
        await asyncio.to_thread(wait_renewed, client, key("rlock", name))
        assert client.hget(key("rlock", name), identity.task_owner()) == b"1"
        await lock.release()

        assert await holder.acquire()
        late = asyncio.create_task(in_turn())
        assert await eventually(lambda: _waiting(other, 1), 10)
        assert hub._task is not None and not hub._task.done(), "no hub task reads the wake-ups"
        await holder.release()
        assert await asyncio.wait_for(late, 20) is True
        await c.aclose()

    run(main)


_CLOSED_CLEANLY = """
import asyncio, gc, os, sys, warnings
warnings.simplefilter("always", ResourceWarning)
import redis.asyncio, rlocks.asyncio

async def main(how):
    if how == "own":
        # Built as the constructor builds it: with retries and no socket timeout, the
        # settings rlocks once gave a pool of its own for (which aclose() left open).
        host, port = os.environ["RLOCKS_URL"].split("//")[1].split("/")[0].split(":")
        client = redis.asyncio.Redis(host=host, port=int(port))
        async with rlocks.asyncio.RLock(sys.argv[2], client=client):
            pass
        sem = rlocks.asyncio.Semaphore(sys.argv[2] + "-s", 2, client=client)
        async with sem:
            pass
        await client.aclose()
    else:
        async with rlocks.asyncio.RLock(sys.argv[2]):
            pass
        await rlocks.asyncio.aclose()

asyncio.run(main(sys.argv[1]))
gc.collect()
print("clean")
"""


@pytest.mark.parametrize("how", ["own", "default"])
def test_closing_the_client_or_aclose_leaves_no_connection_open(
    url: str, name: str, how: str
) -> None:
    """What rlocks opens for an asyncio primitive closes with the client it was given
    (rlocks opens no pool of its own for it), or, for ``client=None``, with
    ``rlocks.asyncio.aclose()``: under -X dev no ResourceWarning (an unclosed
    connection) is left when the loop ends."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-X", "dev", "-c", _CLOSED_CLEANLY, how, name],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "RLOCKS_URL": url})
    assert done.returncode == 0 and done.stdout.strip() == "clean", done.stderr[-2000:]
    assert "ResourceWarning" not in done.stderr, done.stderr[-2000:]


def test_aclose_closes_the_loops_default_client_and_a_later_use_opens_another(
    url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlocks._engine import surface

    monkeypatch.setenv("RLOCKS_URL", url)

    async def main() -> None:
        lock = ra.RLock(name)
        async with lock:
            pass
        loop = asyncio.get_running_loop()
        first = surface._loop_clients[loop][url]
        await ra.aclose()
        assert loop not in surface._loop_clients
        pool = first.connection_pool
        assert not [c for c in (*pool._available_connections, *pool._in_use_connections)
                    if c.is_connected]
        async with lock:  # a use after aclose opens a new client
            pass
        assert surface._loop_clients[loop][url] is not first
        await ra.aclose()

    run(main)
