"""``rlocks.Lock`` and ``rlocks.asyncio.Lock``: ``threading.Lock`` across processes.

Not reentrant (the holder's second acquire waits like anyone's), released by any thread
(task) of the holding process, never by another process. CPython's ``LockTests`` run in
test_lock_tests.py; these are the cases they do not reach.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from typing import Any, List

import pytest
import redis
import redis.asyncio

import rlocks
import rlocks.asyncio as ra
from rlocks.server import TemporaryRedisServer

from ._proxy import FaultyLink
from ._servers import wait_until
from ._threads import joined, parked, started
from .conftest import NAMESPACE, snapshot


def make(name: str, client: Any, **options: Any) -> rlocks.Lock:
    options.setdefault("namespace", NAMESPACE)
    return rlocks.Lock(name, client=client, **options)


def test_the_holders_second_acquire_waits_until_another_thread_releases(
    client: Any, name: str
) -> None:
    lock = make(name, client)
    assert lock.acquire()
    first = lock.token
    assert lock.acquire(blocking=False) is False
    assert lock.acquire(timeout=0.05) is False
    # It waits in the queue like any other owner, and gets it when another thread releases.
    thread, out = started(lambda: lock.acquire(timeout=30))
    wait_until(lambda: parked(thread), 10, "the second acquire waiting")
    assert lock.locked()
    joined(*started(lock.release))
    assert joined(thread, out) is True
    assert lock.owned()
    assert lock.token is not None and first is not None and lock.token > first
    lock.release()
    assert not lock.locked()
    assert client.exists(lock._keys.hash, lock._keys.queue) == 0
    with pytest.raises(RuntimeError, match="un-acquired lock rlocks.Lock"):
        lock.release()


def test_two_objects_of_one_name_are_one_lock(client: Any, name: str) -> None:
    one, two = make(name, client), make(name, client)
    assert one.acquire()
    assert two.acquire(blocking=False) is False
    assert two.owned()  # the process holds it, through whichever object
    joined(*started(two.release))  # any thread, any object of the name
    assert not one.owned() and not one.locked()
    with pytest.raises(rlocks.NotOwnedError):
        one.release()


HOLDER = """
import sys, time, redis, rlocks
lock = rlocks.Lock(sys.argv[2], client=redis.Redis.from_url(sys.argv[1]), namespace=sys.argv[3])
assert lock.acquire(timeout=10)
print("held", flush=True)
sys.stdin.readline()
lock.release()
print("released", flush=True)
"""


def test_another_process_cannot_release_it_and_nothing_changes(
    client: Any, redis_url: str, name: str
) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, redis_url, name, NAMESPACE],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"
        lock = make(name, client)
        before = snapshot(client)
        with pytest.raises(rlocks.NotOwnedError, match="this process does not hold it"):
            lock.release()
        assert snapshot(client) == before
        assert lock.locked() and not lock.owned()
        assert lock.acquire(blocking=False) is False
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"
        assert lock.acquire(timeout=10)
        lock.release()
    finally:
        holder.kill()
        holder.wait()


def test_two_releases_at_once_give_back_one_hold_and_report_no_loss() -> None:
    """Two threads release one hold at once: one gives it back, the other is told the lock
    is not held (as threading's second release is), with no I/O and no loss reported."""
    lost: List[Any] = []
    with TemporaryRedisServer() as server, FaultyLink(server.port) as link:
        client = redis.Redis(port=link.port, socket_timeout=10)
        lock = rlocks.Lock("twice", client=client, namespace=NAMESPACE, on_lost=lost.append)
        assert lock.acquire()
        link.hold_replies()  # the first release runs on the server; its answer waits
        first, first_out = started(lock.release)
        wait_until(lambda: link.held > 0, 10, "the first release to have run")
        with pytest.raises(rlocks.NotOwnedError):
            lock.release()
        link.heal()
        assert joined(first, first_out) is None
        assert not lock.locked() and not lock.owned()
        time.sleep(0.2)  # an on_lost would run on the callback thread by now
        assert lost == []
        client.close()


def test_a_fork_child_does_not_hold_its_parents_lock(client: Any, name: str) -> None:
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    lock = make(name, client)
    assert lock.acquire()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running pytest's exit
        code = 1
        try:
            try:
                lock.release()
            except rlocks.NotOwnedError:
                if (not lock.owned() and lock.locked()
                        and lock.acquire(blocking=False) is False):
                    code = 0
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == bytes([0])
    os.waitpid(pid, 0)
    os.close(read)
    assert lock.owned()
    lock.release()


def test_asyncio_lock_is_not_reentrant_and_any_task_releases(redis_url: str, name: str) -> None:
    async def main() -> None:
        c = redis.asyncio.Redis.from_url(redis_url)
        lock = ra.Lock(name, client=c, namespace=NAMESPACE)
        assert await lock.acquire()
        assert await lock.acquire(blocking=False) is False
        assert await lock.acquire(timeout=0.05) is False
        waiting = asyncio.create_task(lock.acquire())
        await asyncio.sleep(0.1)
        assert not waiting.done()
        await asyncio.create_task(lock.release())  # another task of this process
        assert await asyncio.wait_for(waiting, 10) is True
        assert lock.owned()
        # A cancelled waiter leaves nothing held or queued.
        cancelled = asyncio.create_task(lock.acquire())
        await asyncio.sleep(0.1)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await lock.release()
        assert not await lock.locked()
        assert await c.exists(lock._keys.hash, lock._keys.queue) == 0
        with pytest.raises(rlocks.NotOwnedError):
            await lock.release()
        await c.aclose()

    asyncio.run(main())


def test_a_lock_refuses_deadlock_detection_and_bad_input(name: str) -> None:
    with pytest.raises(TypeError, match=r"rlocks.Lock\('x'\): got an unexpected keyword "
                                        "argument 'deadlock_timeout'"):
        rlocks.Lock("x", deadlock_timeout=1.0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="rlocks.Lock"):
        rlocks.Lock(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rlocks.Lock"):
        rlocks.Lock("x", ttl=0)
    lock = rlocks.Lock("x", client=redis.Redis(port=1))  # no I/O until used
    with pytest.raises(ValueError, match="rlocks.Lock"):
        lock.acquire(timeout=-5)
    with pytest.raises(ValueError, match="rlocks.Lock"):
        lock.acquire(blocking=False, timeout=1)
    with pytest.raises(TypeError):
        ra.Lock("x", client=redis.Redis(port=1))
    assert threading.active_count() >= 1


def test_a_lost_hold_still_on_the_books_does_not_stand_for_the_live_one(
    client: Any, name: str
) -> None:
    """Thread one's hold is lost and not yet released when thread two takes the lock:
    token, owned() and release() speak of thread two's live hold; thread one's release
    then tells the loss (found by the history checker: token-order, a shared token)."""
    lost: List[Any] = []
    lock = make(name, client, auto_renew=False, on_lost=lost.append)
    joined(*started(lock.acquire))
    old = lock.token
    client.delete(lock._keys.hash)  # as an expiry or a forced release would
    assert lock.acquire(timeout=5)  # the grant tells this process the old hold is gone
    wait_until(lambda: lost == [lock], 5, "on_lost of the old hold")
    assert lock.token is not None and old is not None and lock.token > old
    assert lock.owned()
    lock.release()  # the live hold, not the lost one
    assert not lock.locked()
    with pytest.raises(rlocks.LockLostError):
        lock.release()  # the lost one's release, owed still
    with pytest.raises(rlocks.NotOwnedError):
        lock.release()


def test_a_thread_whose_hold_was_lost_hears_it_and_leaves_the_new_holder_alone(
    client: Any, name: str
) -> None:
    """T1's hold ends in Redis while T2 waits; T2 is granted. T1's release (leaving its
    with block) tells T1 its hold was lost and leaves T2's hold alone: no other process
    gets the lock while T2 is inside (a bug hunt found T1 giving back T2's hold)."""
    lock = make(name, client)
    inside, leave = threading.Event(), threading.Event()

    def second() -> None:
        with lock:
            inside.set()
            leave.wait(30)

    assert lock.acquire()
    thread, out = started(second)
    wait_until(lambda: parked(thread), 10, "T2 waiting")
    client.delete(lock._keys.hash)  # as `rlocks release --force` would
    assert inside.wait(10)
    with pytest.raises(rlocks.LockLostError):
        lock.check()  # T1 speaks of its own hold
    with pytest.raises(rlocks.LockLostError):
        lock.release()
    assert lock.locked()
    assert in_other_process_acquire(client, name) is False
    leave.set()
    joined(thread, out)
    assert not lock.locked()


def in_other_process_acquire(client: Any, name: str) -> bool:
    url = "redis://{host}:{port}".format(**client.connection_pool.connection_kwargs)
    code = ("import sys, redis, rlocks; l = rlocks.Lock(sys.argv[2], client=redis.Redis."
            "from_url(sys.argv[1]), namespace=sys.argv[3]); print(l.acquire(blocking=False))")
    done = subprocess.run([sys.executable, "-c", code, url, name, NAMESPACE],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip() == "True"
