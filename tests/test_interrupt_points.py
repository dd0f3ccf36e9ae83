"""An exception raised at *every* point of an acquire or a release leaves no hold astray.

A signal handler's exception (Ctrl-C, an ``alarm``-based timeout) is raised in the main
thread between any two lines of Python, in rlocks or in redis-py under it: before the
script is sent, in the middle of sending it, while its answer is read, after it was read
but before the grant is recorded, half-way through the local bookkeeping. Whichever point
it hits, the acquire must end as if it had not happened: no hold in Redis that no thread
knows of (unrenewed, blocking everyone until its lease ends), no local hold the caller was
told it did not get, no lease renewed for nothing, and the outer levels of a re-entrant
owner untouched. A release hit the same way must leave Redis and the local books agreeing.

Random signal timing finds such points only by luck (the bug hunt's test leaked in 6 of 10
runs, and passed in the others). Here the points are visited one by one, deterministically:
a ``sys.settrace`` tracer raises the exception at the n-th function entry or return of the
operation (any function, rlocks', redis-py's, the standard library's), for n = 1, 2, ...
until the operation completes before the n-th. Those are where CPython runs a pending
signal handler: on entering a function and after a call returns (an exception raised at a
return event surfaces in the caller just after the call). Line events are not used: one
falls between a ``with`` block's last line and its ``__exit__`` call, where no signal
handler can run (CPython's own ``with lock:`` would leak the lock there). The count stops
when the engine's operation returns to the public method: an exception raised in the
caller's frame after that is outside any lock's reach (``threading``'s own locks and the
``with`` statement have the same gap).

asyncio has no signal-handler exceptions in a task; its twin is cancellation, delivered at
an ``await``. The asyncio test cancels the acquiring task after n steps of the event loop,
for every n until the acquire completes first.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import sys
import time
from types import CodeType, FrameType
from typing import Any, Callable, Iterator, List, Optional, Tuple

import pytest
import redis

import rlocks
from rlocks._engine.clients import io_client
from rlocks._engine.identity import thread_owner
from rlocks._engine.primitive import Primitive
from rlocks._engine.waiting import hub_for
from rlocks.semaphore import Semaphore
from rlocks.server import TemporaryRedisServer

from .conftest import NAMESPACE

SOCKET_TIMEOUT = 10.0  # s; an interrupted operation that waits for it is a failure
SLOW = 5.0  # s; no interrupted operation takes this long unless it waited on a socket


class Interrupted(BaseException):
    """What the "signal handler" raises: a BaseException, as KeyboardInterrupt is."""


@pytest.fixture(scope="module")
def server() -> Iterator[TemporaryRedisServer]:
    with TemporaryRedisServer() as srv:
        yield srv


@pytest.fixture
def direct(server: TemporaryRedisServer) -> Iterator["redis.Redis[bytes]"]:
    c = redis.Redis.from_url(server.url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=5)
    yield c
    c.close()


def _in_finalizer(frame: Optional[FrameType]) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


class InjectAt:
    """A ``sys.settrace`` tracer raising :class:`Interrupted` at its ``at``-th event.

    Counts function entries and returns in every frame of the traced thread until a frame
    of ``stop`` returns (that event is not counted). CPython removes a tracer
    that raises, so whatever runs after the exception (clean-up included) is not traced.
    """

    def __init__(self, at: int, stop: Tuple[CodeType, ...]) -> None:
        self.at = at
        self.stop = stop
        self.seen = 0
        self.where: Optional[str] = None
        self.done = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self.done:
            return None
        if event == "call" and _in_finalizer(frame):
            # A finalizer's exception is printed and dropped, never raised in the
            # operation: not a point of the operation.
            return None
        if event == "return" and frame.f_code in self.stop:
            self.done = True
            return None
        if event in ("call", "return"):
            self.seen += 1
            if self.seen == self.at:
                code = frame.f_code
                self.where = f"{event} {code.co_name} {code.co_filename}:{frame.f_lineno}"
                raise Interrupted()
        return self

    def run(self, action: Callable[[], Any]) -> Tuple[bool, Any]:
        """Run ``action`` traced: (whether it was interrupted, its result)."""
        previous = sys.gettrace()
        hook = sys.unraisablehook
        collecting = gc.isenabled()
        gc.disable()  # a collection would run finalizers (see __call__) at random points
        # An exception raised in a generator that is being finalized (closed when its
        # last reference went) is dropped by Python: the operation goes on unharmed, the
        # point is judged as completed. Not reported: formatting it from this depth
        # trips a CPython 3.11 bug ("AST constructor recursion depth mismatch").
        sys.unraisablehook = lambda unraisable: None
        sys.settrace(self)
        try:
            return False, action()
        except Interrupted:
            return True, None
        finally:
            sys.settrace(previous)
            sys.unraisablehook = hook
            if collecting:
                gc.enable()


def make(kind: str, name: str, client: Any) -> Tuple[Any, str, str]:
    """(primitive, its hash key, the calling thread's field in it)."""
    if kind == "rlock":
        lock = rlocks.RLock(name, client=client, ttl=30, namespace=NAMESPACE)
        return lock, lock._keys.hash, thread_owner()
    if kind in ("write", "read"):
        rw = rlocks.RWLock(name, client=client, ttl=30, namespace=NAMESPACE)
        side = rw.write_lock if kind == "write" else rw.read_lock
        return side, side._keys.hash, f"{kind[0]}:{thread_owner()}"
    sem = rlocks.BoundedSemaphore(name, 3, client=client, ttl=30, namespace=NAMESPACE)
    return sem, sem._keys.hash, thread_owner()


def leases_of(prim: Any) -> int:
    """Leases the renewer keeps for ``prim`` (other tests' leases come and go)."""
    return sum(1 for lease in list(prim._renewer()._leases.values()) if lease.ref() is prim)


def state(direct: "redis.Redis[bytes]", prim: Any, key: str, field: str) -> Tuple[int, int, int]:
    """(holds in Redis, holds in the local books, leases renewed) of this thread."""
    in_redis = int(direct.hget(key, field) or 0)
    return in_redis, prim._held(thread_owner()), leases_of(prim)


def reset(direct: "redis.Redis[bytes]", prim: Any, key: str) -> None:
    """Start again from nothing after a failed point (so later points are judged alone)."""
    for owner in list(prim._holds):
        prim._release_locally(owner, 10**6)
    renewer = prim._renewer()
    for lease in list(renewer._leases.values()):
        if lease.ref() is prim:
            renewer.cancel(lease)
    direct.delete(key)


def visit_every_point(
    direct: "redis.Redis[bytes]",
    prim: Any,
    key: str,
    field: str,
    operation: Callable[[], Any],
    setup: Callable[[], None],
    expect: Callable[[Tuple[int, int, int], bool], Optional[str]],
    stop: Tuple[CodeType, ...],
) -> Tuple[int, List[str]]:
    """Interrupt ``operation`` at its 1st, 2nd, ... trace event until it completes first.

    ``setup`` brings the state each point starts from; ``expect(state, interrupted)``
    says what is wrong with the state after it (None: nothing). Returns (points visited,
    failures).
    """
    failures: List[str] = []
    # The same path at every point: the wake-up hub a blocking acquire looks up stays
    # (an unreferenced one is rebuilt each time), and each point starts on an open
    # connection (an interrupted one was closed: reopening it would put a connection's
    # handshake before the points that matter, and a point after a handshake-free try
    # could end the visit before them).
    hub = hub_for(prim.client, prim.namespace)
    sender = io_client(prim.client)
    at = 0
    while True:
        at += 1
        assert at < 20000, "the operation never completed"
        setup()
        sender.ping()
        assert hub is hub_for(prim.client, prim.namespace)
        inject = InjectAt(at, stop)
        started = time.monotonic()
        interrupted, _ = inject.run(operation)
        took = time.monotonic() - started
        if not interrupted:
            # Completed: before its at-th event, or the exception was raised where a
            # finalizer (a generator's, dropped mid-way) printed and dropped it.
            wrong = expect(state(direct, prim, key, field), False)
            if wrong:
                failures.append(f"completed (event {at}: {inject.where}): {wrong}")
            if inject.where is None:
                return at - 1, failures
            continue
        wrong = expect(state(direct, prim, key, field), True)
        if took > SLOW:
            wrong = f"{wrong or ''} took {took:.1f} s (waited on a socket)"
        if wrong:
            failures.append(f"at event {at} ({inject.where}): {wrong}")
            reset(direct, prim, key)
            if len(failures) >= 3:
                return at, failures


KINDS = ["rlock", "write", "read", "sem"]


@pytest.mark.timeout(600)
@pytest.mark.skipif(sys.gettrace() is not None, reason="a tracer (coverage?) is active")
@pytest.mark.parametrize("outer", [0, 1], ids=["fresh", "reentry"])
@pytest.mark.parametrize("kind", KINDS)
def test_interrupt_at_every_point_of_acquire_leaves_no_hold(
    direct: "redis.Redis[bytes]", name: str, kind: str, outer: int
) -> None:
    """Whatever point of ``acquire()`` an exception hits, the thread's holds in Redis and
    in the local books are the ``outer`` ones it had before (with their one lease), and
    the exception propagates; once not interrupted, the acquire holds one more level."""
    prim, key, field = make(kind, name, direct)
    for script in (prim._acquire_script, prim._release_script, prim._renew_script):
        direct.script_load(script.source)
    claim = f"#c:{thread_owner()}"

    def setup() -> None:
        while prim._held(thread_owner()) > outer:
            prim.release()
        while prim._held(thread_owner()) < outer:
            assert prim.acquire(timeout=10)

    def expect(now: Tuple[int, int, int], interrupted: bool) -> Optional[str]:
        want = outer if interrupted else outer + 1
        if now != (want, want, min(want, 1)):
            return f"(redis, local, leases) = {now}, expected {(want, want, min(want, 1))}"
        if kind == "write" and direct.hexists(key, claim):
            return "a writer's claim was left"
        return None

    try:
        points, failures = visit_every_point(
            direct, prim, key, field, prim.acquire, setup, expect, (inspect.unwrap(Primitive._acquire).__code__,)
        )
        assert not failures, f"{len(failures)} bad points:\n" + "\n".join(failures)
        assert points > 30, f"only {points} points: is the tracer seeing the acquire?"
        print(f"{points} points")
        # The primitive is still usable (its connection pool was left clean).
        while prim._held(thread_owner()):
            prim.release()
        assert prim.acquire(timeout=10)
        prim.release()
        assert not direct.exists(key) or kind == "sem"
    finally:
        reset(direct, prim, key)


@pytest.mark.timeout(600)
@pytest.mark.skipif(sys.gettrace() is not None, reason="a tracer (coverage?) is active")
@pytest.mark.parametrize("outer", [0, 1], ids=["last", "inner"])
@pytest.mark.parametrize("kind", KINDS)
def test_interrupt_at_every_point_of_release_leaves_books_and_redis_agreeing(
    direct: "redis.Redis[bytes]", name: str, kind: str, outer: int
) -> None:
    """Whatever point of ``release()`` an exception hits, Redis and the local books agree
    afterwards: either the level was released (in both) or it is still held (in both,
    renewed), never released in one and held in the other."""
    prim, key, field = make(kind, name, direct)
    for script in (prim._acquire_script, prim._release_script, prim._renew_script):
        direct.script_load(script.source)
    stop = (inspect.unwrap(Primitive._release).__code__, Semaphore.release.__code__)

    def setup() -> None:
        while prim._held(thread_owner()) > outer + 1:
            prim.release()
        while prim._held(thread_owner()) < outer + 1:
            assert prim.acquire(timeout=10)

    def expect(now: Tuple[int, int, int], interrupted: bool) -> Optional[str]:
        allowed = [(outer, outer, min(outer, 1))]
        if interrupted:
            allowed.append((outer + 1, outer + 1, 1))
        if now not in allowed:
            return f"(redis, local, leases) = {now}, expected one of {allowed}"
        return None

    try:
        points, failures = visit_every_point(
            direct, prim, key, field, prim.release, setup, expect, stop
        )
        assert not failures, f"{len(failures)} bad points:\n" + "\n".join(failures)
        assert points > 20, f"only {points} points: is the tracer seeing the release?"
        print(f"{points} points")
    finally:
        reset(direct, prim, key)


# -- asyncio: cancellation at every step -------------------------------------------------------


@pytest.mark.timeout(600)
@pytest.mark.parametrize("outer", [0, 1], ids=["fresh", "reentry"])
@pytest.mark.parametrize("kind", KINDS)
def test_cancel_at_every_step_of_async_acquire_leaves_no_hold(
    server: TemporaryRedisServer,
    direct: "redis.Redis[bytes]",
    name: str,
    kind: str,
    outer: int,
) -> None:
    """A task cancelled after n steps of the event loop, for every n until its acquire
    completes first, leaves its holds as they were (Redis, local books, leases)."""
    import redis.asyncio

    import rlocks.asyncio as ra
    from rlocks._engine.identity import task_owner

    async def main() -> List[str]:
        c = redis.asyncio.Redis.from_url(
            server.url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=5
        )
        prim: Any
        if kind == "rlock":
            prim = ra.RLock(name, client=c, ttl=30, namespace=NAMESPACE)
        elif kind in ("write", "read"):
            rw = ra.RWLock(name, client=c, ttl=30, namespace=NAMESPACE)
            prim = rw.write_lock if kind == "write" else rw.read_lock
        else:
            prim = ra.BoundedSemaphore(name, 3, client=c, ttl=30, namespace=NAMESPACE)
        prefix = f"{kind[0]}:" if kind in ("write", "read") else ""
        key = prim._keys.hash
        for script in (prim._acquire_script, prim._release_script, prim._renew_script):
            await c.script_load(script.source)
        failures: List[str] = []

        async def acquire(owner: List[str], ready: asyncio.Event, go: asyncio.Event) -> bool:
            # The owner is the task: the outer level is taken by the same task.
            owner.append(task_owner())
            for _ in range(outer):
                assert await prim.acquire(timeout=10)
            ready.set()
            await go.wait()
            result: bool = await prim.acquire()
            return result

        try:
            steps = 0
            while True:
                assert steps < 5000, "the acquire never completed"
                owner: List[str] = []
                ready, go = asyncio.Event(), asyncio.Event()
                task = asyncio.ensure_future(acquire(owner, ready, go))
                await ready.wait()
                go.set()
                for _ in range(steps):
                    await asyncio.sleep(0)
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                cancelled = task.cancelled()
                want = outer if cancelled else outer + 1
                now = (
                    int(direct.hget(key, prefix + owner[0]) or 0),
                    prim._held(owner[0]),
                    leases_of(prim),
                )
                if now != (want, want, min(want, 1)):
                    failures.append(
                        f"cancelled after {steps} steps: (redis, local, leases) = {now}, "
                        f"expected {(want, want, min(want, 1))}"
                    )
                reset(direct, prim, key)  # each try is a new task, hence a new owner
                if not cancelled:
                    break
                steps += 1
            assert steps > 3, f"only {steps} steps: did the cancellation land?"
        finally:
            reset(direct, prim, key)
            await c.aclose()
        return failures

    failures = asyncio.run(main())
    assert not failures, f"{len(failures)} bad points:\n" + "\n".join(failures)
