"""Fork and thread identity: who owns a hold must never be inherited or reused.

A ``fork()`` child is a copy of its parent's memory, including an RLock object whose local
bookkeeping says "held". It must not believe it holds anything: its owner ids are new, so
it can neither release nor re-enter the parent's hold. Threads started with the low-level
``_thread.start_new_thread`` reuse idents of dead threads; owner ids must not.

The fork tests call ``os.fork`` directly. The child reports over a pipe (one JSON object a
line) and always leaves with ``os._exit``, so no pytest machinery runs twice.
"""

from __future__ import annotations

import _thread
import json
import logging
import os
import select
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, List, Tuple

import pytest
import redis

import rlocks
from rlocks._engine import identity, renewal
from rlocks._engine.identity import thread_owner

from ._threads import engine_threads
from .conftest import NAMESPACE, holds_in

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def hash_key(name: str) -> str:
    return f"{NAMESPACE}:rlock:{{{name}}}"


def renewing(prim: Any) -> int:
    """How many live holds of ``prim`` this process's renewer renews (no I/O)."""
    schedule = renewal.renewer_for(prim._backend).schedule
    return len({id(h) for h in (ref() for _, _, ref in list(schedule.heap))
                if h is not None and h.alive and h.ident[1] == prim._keys.hash})


class Pipe:
    """One end of a pair of pipes carrying JSON lines."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd
        self.buffer = b""

    def send(self, obj: Any) -> None:
        data = (json.dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(self.write_fd, data) :]

    def recv(self, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                raise AssertionError(f"no message over the pipe within {timeout} s")
            chunk = os.read(self.read_fd, 65536)
            if not chunk:
                raise AssertionError("the other side closed the pipe")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def fork(child: Callable[[Pipe], None]) -> Tuple[int, Pipe]:
    """Fork; the child runs ``child(pipe)`` and exits 0, or sends its traceback and exits 1."""
    to_parent_r, to_parent_w = os.pipe()
    to_child_r, to_child_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, which os._exit()s
        code = 1
        try:
            os.close(to_parent_r)
            os.close(to_child_w)
            pipe = Pipe(to_child_r, to_parent_w)
            try:
                child(pipe)
                code = 0
            except BaseException:  # noqa: BLE001 - reported to the parent
                pipe.send({"child_error": traceback.format_exc()})
        finally:
            os._exit(code)
    os.close(to_parent_w)
    os.close(to_child_r)
    return pid, Pipe(to_parent_r, to_child_w)


def reap(pid: int, timeout: float = 10.0) -> int:
    """Wait for the child to exit and return its exit code (killing it if it hangs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("the fork child did not exit")


def checked(message: Any) -> Any:
    if isinstance(message, dict) and "child_error" in message:
        raise AssertionError("the fork child failed:\n" + message["child_error"])
    return message


@pytest.mark.timeout(30)
def test_fork_child_owns_nothing_of_its_parents_hold(
    client: "redis.Redis[bytes]", name: str
) -> None:
    key = hash_key(name)
    lock = rlocks.RLock(name, client=client, ttl=10.0, namespace=NAMESPACE)
    assert lock.acquire() and lock.acquire()  # held twice by the forking thread
    parent_owner = thread_owner()

    def child(pipe: Pipe) -> None:
        # Same object, same memory: its local table still says parent_owner holds 2.
        report: dict = {"owner": thread_owner()}
        report["is_owned"] = lock._is_owned()
        report["count"] = lock._recursion_count()
        report["renewing"] = renewing(lock)
        try:
            lock.release()
            report["release"] = "returned"
        except RuntimeError as exc:
            report["release"] = type(exc).__name__
            report["release_is_runtime_error"] = isinstance(exc, RuntimeError)
        report["try_acquire"] = lock.acquire(blocking=False)
        pipe.send(report)

        assert pipe.recv(20) == "released"
        after: dict = {"acquired": lock.acquire(timeout=5)}
        after["count"] = lock._recursion_count()
        after["hash"] = {k.decode(): v.decode() for k, v in holds_in(client, key).items()}
        lock.release()
        after["exists"] = client.exists(key)
        pipe.send(after)

    assert renewing(lock) == 1  # (so the child's 0 below is the fork's doing)
    pid, pipe = fork(child)
    try:
        report = checked(pipe.recv(20))
        assert report["owner"] != parent_owner
        assert report["is_owned"] is False
        assert report["count"] == 0
        assert report["renewing"] == 0  # the child does not renew the parent's lease
        assert report["release"] == "NotOwnedError" and report["release_is_runtime_error"]
        assert report["try_acquire"] is False
        # The child's attempts changed nothing: the parent still holds, twice.
        assert holds_in(client, key) == {parent_owner.encode(): b"2"}
        assert lock._recursion_count() == 2

        lock.release()
        lock.release()
        assert not client.exists(key)
        pipe.send("released")

        after = checked(pipe.recv(20))
        assert after == {
            "acquired": True,
            "count": 1,
            "hash": {report["owner"]: "1"},
            "exists": 0,
        }
        assert reap(pid) == 0
        pid = 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        pipe.close()
        client.delete(key)


@pytest.mark.parametrize("bounded", [False, True], ids=["Semaphore", "BoundedSemaphore"])
def test_fork_childs_semaphore_release_never_gives_back_its_parents_permits(
    client: "redis.Redis[bytes]", name: str, bounded: bool
) -> None:
    # A semaphore lets any thread release permits other threads of *this process* took
    # through the object. The child's copy of the object still lists the parent's thread:
    # those permits are not the child's process's, so its release is a release of nobody's
    # permit (counted for a Semaphore, refused for a full BoundedSemaphore), and the
    # parent keeps its permit in Redis and in its books.
    key = f"{NAMESPACE}:sem:{{{name}}}"
    cls = rlocks.BoundedSemaphore if bounded else rlocks.Semaphore
    sem = cls(name, 1, client=client, ttl=10.0, namespace=NAMESPACE)
    assert sem.acquire()
    parent_owner = thread_owner()

    def child(pipe: Pipe) -> None:
        report: dict = {"owned": sem.owned()}
        try:
            sem.release()
            report["release"] = "returned"
        except ValueError:
            report["release"] = "ValueError"
        report["hash"] = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
        pipe.send(report)

    pid, pipe = fork(child)
    try:
        report = checked(pipe.recv(20))
        assert report["owned"] is False
        # The parent's permit is still held, under the parent's owner, either way.
        assert report["hash"].get(parent_owner) == "1", report
        assert report["hash"]["#h"] == "1", report  # permits held: the parent's one
        if bounded:
            # one permit in circulation already: a release of nobody's is refused
            assert report["release"] == "ValueError"
            assert report["hash"]["#v"] == "1"
        else:
            # counted as threading counts it: the value grows past the initial one
            assert report["release"] == "returned"
            assert report["hash"]["#v"] == "2"
        assert reap(pid) == 0
        pid = 0
        assert sem.owned()
        sem.release()  # the parent's own permit, still its own
        assert client.hget(key, parent_owner) is None
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        pipe.close()
        client.delete(key, f"{key}:l", f"{key}:q")


@pytest.mark.timeout(30)
def test_fork_children_of_one_parent_get_distinct_owner_ids(
    client: "redis.Redis[bytes]", name: str
) -> None:
    # Two children forked from the same state (same nonce, same serial counter in memory)
    # must still differ from each other and from the parent, thread by thread.
    parent = thread_owner()

    def child(pipe: Pipe) -> None:
        ids: List[str] = [thread_owner()]
        t = threading.Thread(target=lambda: ids.append(thread_owner()))
        t.start()
        t.join()
        pipe.send(ids)

    seen = [parent]
    for _ in range(2):
        pid, pipe = fork(child)
        try:
            ids = checked(pipe.recv(20))
            assert reap(pid) == 0
        finally:
            pipe.close()
        assert all(f":{pid}:" in owner for owner in ids), ids
        seen.extend(ids)
    assert len(set(seen)) == len(seen) == 5, seen


@pytest.mark.timeout(60)
def test_fork_child_waiting_on_its_parent_is_woken_by_the_release(
    client: "redis.Redis[bytes]", name: str
) -> None:
    # The parent has a running wake-up subscriber (a contended acquire below starts it)
    # and a renewer when it forks. The child must start its own, on its own process's
    # channel, not count on the parent's thread or connection, and must be woken by the
    # release, long before it would ask again by itself: a waiter never woken asks again
    # after a third of its entry lease (20 s here) or when the hold's lease would end
    # (later still: a 60 s lease, renewed), and no deadlock check (off) cuts that short.
    # The bound on the wake-up, half of that, leaves seconds of slack under load.
    key = hash_key(name)
    ttl = 60.0
    woken_within = 10.0
    lock = rlocks.RLock(name, client=client, ttl=ttl, entry_lease=ttl, deadlock_timeout=None,
                        namespace=NAMESPACE)
    assert lock.acquire()
    contender = threading.Thread(target=lambda: lock.acquire(timeout=0.05) and lock.release())
    contender.start()
    contender.join()
    assert "rlocks-wakeups" in engine_threads(), "the parent's subscriber is not running"

    def child(pipe: Pipe) -> None:
        # Each process hears its wake-ups on its own channel.
        pipe.send({"channel": lock._keys.wake + identity.process_token()})
        began = time.monotonic()
        acquired = lock.acquire(timeout=30)
        waited = time.monotonic() - began
        if acquired:
            lock.release()
        pipe.send({"acquired": acquired, "waited": waited, "owner": thread_owner()})

    queue = lock._keys.queue
    pid, pipe = fork(child)
    try:
        channel = checked(pipe.recv(20))["channel"]
        assert channel != lock._keys.wake + identity.process_token()
        # Subscribed on its own channel, and queued: the release must wake it (before it
        # queued, the release would leave the lock free for the child's first ask).
        deadline = time.monotonic() + 20
        while not (dict(client.pubsub_numsub(channel)).get(channel.encode())
                   and client.zcard(queue) == 1):
            assert time.monotonic() < deadline, "the child never subscribed and queued"
            time.sleep(0.005)
        released = time.monotonic()
        lock.release()
        report = checked(pipe.recv(40))
        woken_after = time.monotonic() - released
        assert report["acquired"] is True
        assert woken_after < woken_within, f"child took {woken_after:.3f} s: not woken"
        assert reap(pid) == 0
        pid = 0
        assert not client.exists(key)
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        pipe.close()
        client.delete(key)


# -- thread identity -----------------------------------------------------------------------


def _run_raw_thread(body: Callable[[], None]) -> None:
    """Run ``body`` in a ``_thread.start_new_thread`` thread; return once it has exited."""
    baseline = _thread._count()
    finished = _thread.allocate_lock()
    finished.acquire()

    def run() -> None:
        try:
            body()
        finally:
            finished.release()

    _thread.start_new_thread(run, ())
    assert finished.acquire(timeout=10), "raw thread did not finish"
    # _thread._count() drops once the thread's bootstrap returned: wait for that state, so
    # the next thread is started after this one is really gone (and may reuse its ident).
    deadline = time.monotonic() + 10
    while _thread._count() > baseline:
        assert time.monotonic() < deadline, "raw thread did not exit"
        time.sleep(0.001)


@pytest.mark.timeout(30)
def test_owner_ids_are_unique_across_raw_threads_even_when_idents_repeat() -> None:
    records: List[Tuple[int, str]] = []
    for _ in range(50):
        _run_raw_thread(lambda: records.append((_thread.get_ident(), thread_owner())))
    idents = [ident for ident, _ in records]
    owners = [owner for _, owner in records]
    assert len(records) == 50
    assert len(set(owners)) == 50, "two threads got the same owner id"
    assert thread_owner() not in owners
    # Informative: on glibc a dead thread's ident is reused by the next thread, which is
    # the case that matters (an owner id derived from the ident would repeat here).
    if len(set(idents)) == 50:  # pragma: no cover - platform without ident reuse
        pytest.skip("this platform did not reuse any thread ident; uniqueness checked anyway")


@pytest.mark.timeout(30)
def test_thread_reusing_a_dead_holders_ident_does_not_inherit_its_hold(
    client: "redis.Redis[bytes]", name: str
) -> None:
    key = hash_key(name)
    lock = rlocks.RLock(name, client=client, ttl=10.0, auto_renew=False, namespace=NAMESPACE)
    dead: dict = {}

    def holder() -> None:
        dead["ident"] = _thread.get_ident()
        dead["owner"] = thread_owner()
        dead["acquired"] = lock.acquire(blocking=False)
        # ... and exits without releasing: the hold stays until its lease ends.

    try:
        _run_raw_thread(holder)
        assert dead["acquired"]
        assert holds_in(client, key) == {dead["owner"].encode(): b"1"}
        for _ in range(20):
            seen: dict = {}

            def successor() -> None:
                seen["ident"] = _thread.get_ident()
                seen["owner"] = thread_owner()
                seen["is_owned"] = lock._is_owned()
                seen["count"] = lock._recursion_count()
                seen["acquired"] = lock.acquire(blocking=False)
                try:
                    lock.release()
                    seen["release"] = "returned"
                except RuntimeError as exc:
                    seen["release"] = type(exc).__name__

            _run_raw_thread(successor)
            assert seen["owner"] != dead["owner"]
            assert seen["is_owned"] is False and seen["count"] == 0
            assert seen["acquired"] is False
            assert seen["release"] == "NotOwnedError"
            if seen["ident"] == dead["ident"]:
                break
        else:  # pragma: no cover - platform without ident reuse
            pytest.skip("no thread reused the dead holder's ident")
        assert holds_in(client, key) == {dead["owner"].encode(): b"1"}  # untouched
    finally:
        client.delete(key)


# -- fork hooks of other libraries, and what a child shows --------------------------------


@pytest.mark.timeout(30)
def test_logging_handler_with_an_rlock_survives_fork(
    client: "redis.Redis[bytes]", name: str
) -> None:
    # logging's after-fork hook calls handler.lock._at_fork_reinit() for every handler,
    # then releases logging's module lock. A lock without that method stops the hook half
    # way, and every other thread of the child then hangs on logging's module lock.
    key = hash_key(name)
    handler = logging.Handler()
    lock = rlocks.RLock(name, client=client, ttl=10.0, namespace=NAMESPACE)
    handler.lock = lock  # type: ignore[assignment]
    assert lock.acquire()  # the parent holds it while it forks
    parent_owner = thread_owner()

    def child(pipe: Pipe) -> None:
        report: dict = {"repr": repr(lock), "holds": len(lock._mine)}
        t = threading.Thread(target=lambda: logging.getLogger(f"{name}-child"), daemon=True)
        t.start()
        t.join(5)
        report["logging_usable"] = not t.is_alive()
        report["hash"] = {k.decode(): v.decode() for k, v in holds_in(client, key).items()}
        pipe.send(report)

    pid, pipe = fork(child)
    try:
        report = checked(pipe.recv(20))
        assert report["logging_usable"], "a thread of the child hung on logging's lock"
        assert report["holds"] == 0  # the child forgot the parent's holds...
        assert "not held here" in report["repr"]
        assert report["hash"] == {parent_owner: "1"}  # ...and left them alone in Redis
        assert reap(pid) == 0
        pid = 0
        assert lock._recursion_count() == 1  # the parent is unaffected
        lock.release()
        assert not client.exists(key)
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        pipe.close()
        handler.close()
        client.delete(key)


@pytest.mark.timeout(30)
def test_fork_child_repr_lists_none_of_its_parents_holds(
    client: "redis.Redis[bytes]", name: str
) -> None:
    lock = rlocks.RLock(name, client=client, ttl=10.0, namespace=NAMESPACE)
    rw = rlocks.RWLock(name, client=client, ttl=10.0, namespace=NAMESPACE)
    sem = rlocks.Semaphore(name, 2, client=client, ttl=10.0, namespace=NAMESPACE)
    assert lock.acquire() and rw.write_lock.acquire() and rw.read_lock.acquire()
    assert sem.acquire()
    prims = (lock, rw, rw.read_lock, rw.write_lock, sem)
    in_parent = [repr(p) for p in prims]

    def child(pipe: Pipe) -> None:
        pipe.send([repr(p) for p in prims])

    pid, pipe = fork(child)
    try:
        seen = checked(pipe.recv(20))
        assert reap(pid) == 0
        pid = 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        pipe.close()
        for release in (lock.release, rw.read_lock.release, rw.write_lock.release, sem.release):
            release()
    assert "held owner=" in in_parent[0] and "held here=1" in in_parent[4]
    assert "not held here" in seen[0], seen[0]
    assert "readers here=0 writers here=0" in seen[1], seen[1]
    assert "not held here" in seen[2] and "not held here" in seen[3], seen
    assert "held here=0" in seen[4], seen[4]


@pytest.mark.timeout(60)
def test_fork_child_gets_its_own_callback_thread(
    client: "redis.Redis[bytes]", name: str
) -> None:
    # At the fork the parent's callback thread is busy in a slow on_lost. That thread does
    # not exist in the child: the child's own losses must still reach its callbacks.
    entered, finish = threading.Event(), threading.Event()

    def slow(_lock: Any) -> None:
        entered.set()
        finish.wait(30)

    parents = rlocks.RLock(name + "-p", client=client, ttl=0.5, namespace=NAMESPACE, on_lost=slow)
    assert parents.acquire()
    client.delete(parents._keys.hash)
    assert entered.wait(10), "the parent's on_lost was never called"

    def child(pipe: Pipe) -> None:
        called = threading.Event()
        own = rlocks.RLock(
            name + "-c", client=client, ttl=0.5, namespace=NAMESPACE,
            on_lost=lambda _lock: called.set(),
        )
        assert own.acquire()
        client.delete(own._keys.hash)
        pipe.send({"called": called.wait(10)})

    pid, pipe = fork(child)
    try:
        report = checked(pipe.recv(30))
        assert report == {"called": True}
        assert reap(pid) == 0
        pid = 0
    finally:
        finish.set()
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        pipe.close()
        client.delete(parents._keys.hash, hash_key(name + "-c"))
