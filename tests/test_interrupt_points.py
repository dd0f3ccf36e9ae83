"""An exception raised at *every* point of an acquire or a release leaves no hold astray.

A signal handler's exception (Ctrl-C, an ``alarm``-based timeout) is raised in the main
thread between any two lines of Python, in rlocks or in redis-py under it: before the
script is sent, in the middle of sending it, while its answer is read, after it was read
but before the grant is recorded, half-way through the local bookkeeping. Whichever point
it hits, the acquire must end as if it had not happened: no hold in Redis that no thread
knows of (unrenewed, blocking everyone until its lease ends), no local hold the caller was
told it did not get, no lease renewed for nothing, and the outer levels of a re-entrant
owner untouched. A release hit the same way must leave Redis and the local books agreeing.

What this process knows of a hold (the lean core, ``rlocks/_engine``): the object's books
(``_levels``), the shared ``holds.Hold`` (its count, and its state: a hold left
``releasing`` would keep a loss the renewer finds from ever being reported), the
renewer's schedule, and the per-primitive gate that bounds the calls of its waiters
(``backends.Server.gate``; a permit kept by an interrupt, or its lock left held, blocks
every later acquire). The operation is a dialogue (``dialogues.py``) driven by
``steps.drive``; the points are every call and return in it and under it.

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
import contextlib
import gc
import inspect
import signal
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Any, Callable, Iterator, List, Optional, Tuple

import pytest
import redis

import rlocks
from rlocks._engine.backends import GATE
from rlocks._engine.clients import io_client
from rlocks._engine.holds import GONE, HELD
from rlocks._engine.identity import thread_owner
from rlocks._engine.renewal import renewer_for
from rlocks._engine.surface import LockSurface, PermitSurface
from rlocks.server import TemporaryRedisServer

from .conftest import NAMESPACE

SOCKET_TIMEOUT = 10.0  # s; an interrupted operation that waits for it is a failure
SLOW = 5.0  # s; no interrupted operation takes this long unless it waited on a socket
# s: the holds' lease; renewed a third of it after each grant, so no renewal pass (which
# takes a hold out of the renewer's schedule for its round trip) falls in a visit
TTL = 600
MAX_FAILURES = 6  # a visit stops after this many bad points

#: Where the engine's operation returns to the public method: the count stops there.
ACQUIRED = (inspect.unwrap(LockSurface._acquire).__code__,
            inspect.unwrap(PermitSurface._acquire).__code__)
RELEASED = (LockSurface.release.__code__, PermitSurface.release.__code__,
            rlocks.Lock.release.__code__)


class Interrupted(BaseException):
    """What the "signal handler" raises: a BaseException, as KeyboardInterrupt is."""


class Stalled(BaseException):
    """What the watchdog raises in a point that blocks (on a permit or a hold nobody
    gives back): the visit reports it instead of hanging."""


def _fire(signum: int, frame: Any) -> None:
    raise Stalled()


@contextlib.contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Raise :class:`Stalled` in this (the main) thread if the block lasts ``seconds``:
    a signal from a timer thread (not SIGALRM: pytest-timeout's own), which interrupts
    a blocking lock acquire too."""
    previous = signal.signal(signal.SIGUSR1, _fire)
    main = threading.get_ident()
    timer = threading.Timer(seconds, lambda: signal.pthread_kill(main, signal.SIGUSR1))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGUSR1, previous)


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
        if event == "call" and frame.f_code is _fire.__code__:
            return None  # the watchdog's handler: not a point of the operation
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
        lock = rlocks.RLock(name, client=client, ttl=TTL, namespace=NAMESPACE)
        return lock, lock._keys.hash, thread_owner()
    if kind == "lock":  # (not reentrant: its fresh acquire and last release only)
        plain = rlocks.Lock(name, client=client, ttl=TTL, namespace=NAMESPACE)
        return plain, plain._keys.hash, thread_owner()
    if kind in ("write", "read"):
        rw = rlocks.RWLock(name, client=client, ttl=TTL, namespace=NAMESPACE)
        side = rw.write_lock if kind == "write" else rw.read_lock
        return side, side._keys.hash, f"{kind[0]}:{thread_owner()}"
    sem = rlocks.BoundedSemaphore(name, 3, client=client, ttl=TTL, namespace=NAMESPACE)
    return sem, sem._keys.hash, thread_owner()


def load(direct: "redis.Redis[bytes]", prim: Any) -> None:
    """Load ``prim``'s scripts: no NOSCRIPT round trip in the points that matter."""
    spec = prim._spec
    for script in (spec.acquire_script, spec.release_script, spec.renew_script,
                   spec.leave_script):
        direct.script_load(script.source)


def renewed(prim: Any, owner: str, aio: bool = False) -> int:
    """1 if the renewer keeps the owner's hold of ``prim`` (alive, in its schedule)."""
    schedule = renewer_for(prim._backend, aio).schedule
    hold = prim._hold(owner)
    return int(hold.alive and any(ref() is hold and due == hold.due
                                  for due, _, ref in list(schedule.heap)))


State = Tuple[int, int, int, int, str, str]


def state(direct: "redis.Redis[bytes]", prim: Any, key: str, field: str,
          owner: Optional[str] = None, aio: bool = False) -> State:
    """(holds in Redis, levels on this object's books, the hold's count, renewed, the
    hold's state, what else is wrong in Redis) of the owner (default: this thread)."""
    owner = owner or thread_owner()
    in_redis = int(direct.hget(key, field) or 0)
    hold = prim._hold(owner)
    odd = []
    if direct.exists(prim._keys.queue):
        odd.append("a queue entry was left")
    if prim._spec.kind == "sem" and int(direct.hget(key, "#h") or 0) != in_redis:
        odd.append(f"permits held {direct.hget(key, '#h')!r}")
    gate = prim._backend.gate(key)  # what bounds the calls of its waiters
    free = gate.qsize() if hasattr(gate, "qsize") else gate._value
    if free != GATE:
        odd.append("a gate permit was kept")
    if stuck(getattr(gate, "_cond", None)):
        odd.append("the gate's lock was left held")
    if not aio and stuck(renewer_for(prim._backend)._lock):
        odd.append("the renewer's lock was left held")
    return (in_redis, prim._levels(owner), hold.count, renewed(prim, owner, aio),
            hold.state if hold.count > 0 else "-", "; ".join(odd))


def stuck(lock: Any) -> bool:
    """Whether ``lock`` (a ``threading`` lock or Condition; None: none) stays held: an
    interrupt left it so (its owner may hold it a moment: it is given a second)."""
    if lock is None:
        return False
    if not lock.acquire(timeout=1.0):
        return True
    lock.release()
    return False


def holding(levels: int) -> State:
    """The state of an owner holding ``levels`` levels, all known and renewed."""
    if levels == 0:
        return (0, 0, 0, 0, "-", "")
    return (levels, levels, levels, 1, HELD, "")


def reset(direct: "redis.Redis[bytes]", prim: Any, key: str) -> None:
    """Start again from nothing after a failed point (so later points are judged alone)."""
    for owner in list(prim._mine):
        hold = prim._hold(owner)
        prim._gave(owner, prim._levels(owner))
        hold.count = 0
        hold.state = GONE  # the renewer drops it
    direct.delete(key, prim._keys.queue, prim._keys.leases)
    # A gate whose permit was kept, or whose own lock an interrupt left held: the next
    # acquire makes a new one; so does the next grant for a renewer whose lock was left
    # held (its thread stays blocked).
    prim._backend._gates.pop(key, None)
    prim._backend.renewer = None
    loop = asyncio_loop()
    if loop is not None:
        prim._backend.async_renewers.pop(loop, None)


def asyncio_loop() -> Any:
    """The running event loop, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def visit_every_point(
    direct: "redis.Redis[bytes]",
    prim: Any,
    key: str,
    field: str,
    operation: Callable[[], Any],
    setup: Callable[[], None],
    expect: Callable[[State, bool], Optional[str]],
    stop: Tuple[CodeType, ...],
) -> Tuple[int, List[str]]:
    """Interrupt ``operation`` at its 1st, 2nd, ... trace event until it completes first.

    ``setup`` brings the state each point starts from; ``expect(state, interrupted)``
    says what is wrong with the state after it (None: nothing). Returns (points visited,
    failures).
    """
    failures: List[str] = []
    # The same path at every point: each point starts on an open connection (an
    # interrupted one was closed: reopening it would put a connection's handshake before
    # the points that matter, and a point after a handshake-free try could end the visit
    # before them).
    sender = io_client(prim.client)
    # Once untraced: what runs at a process's first acquire only (the metrics' set-up,
    # the renewer thread's start) is not part of every acquire.
    # (Before setup: a Lock's second acquire would wait for ever.)
    prim.acquire()
    prim.release()
    setup()
    at = 0
    while True:
        at += 1
        assert at < 20000, "the operation never completed"
        inject = InjectAt(at, stop)
        try:
            with watchdog(2 * SLOW):
                setup()
                sender.ping()
                started = time.monotonic()
                interrupted, _ = inject.run(operation)
                took = time.monotonic() - started
        except Stalled:
            failures.append(f"at event {at} ({inject.where}): stalled {2 * SLOW} s")
            reset(direct, prim, key)
            if len(failures) >= MAX_FAILURES:
                return at, failures
            continue
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
            if len(failures) >= MAX_FAILURES:
                return at, failures


KINDS = ["rlock", "write", "read", "sem", "lock"]


def reentrant(kind: str, outer: int) -> None:
    if kind == "lock" and outer:
        pytest.skip("a Lock is not reentrant: no inner level to acquire or release")


@pytest.mark.timeout(600)
@pytest.mark.skipif(sys.gettrace() is not None, reason="a tracer (coverage?) is active")
@pytest.mark.parametrize("outer", [0, 1], ids=["fresh", "reentry"])
@pytest.mark.parametrize("kind", KINDS)
def test_interrupt_at_every_point_of_acquire_leaves_no_hold(
    direct: "redis.Redis[bytes]", name: str, kind: str, outer: int
) -> None:
    """Whatever point of ``acquire()`` an exception hits (in the dialogue, between its
    steps, in a step's round trip, in the bookkeeping of a grant), the thread's holds in
    Redis and on the books are the ``outer`` ones it had before, renewed and held (so a
    later loss is still reported), no queue entry is left, and the exception propagates;
    once not interrupted, the acquire holds one more level."""
    reentrant(kind, outer)
    prim, key, field = make(kind, name, direct)
    load(direct, prim)
    owner = thread_owner()

    def setup() -> None:
        while prim._levels(owner) > outer:
            prim.release()
        while prim._levels(owner) < outer:
            assert prim.acquire(timeout=10)

    def expect(now: State, interrupted: bool) -> Optional[str]:
        want = holding(outer if interrupted else outer + 1)
        if now != want:
            return (f"(redis, books, hold, renewed, state, odd) = {now}, expected {want}")
        return None

    try:
        points, failures = visit_every_point(
            direct, prim, key, field, prim.acquire, setup, expect, ACQUIRED
        )
        assert not failures, f"{len(failures)} bad points:\n" + "\n".join(failures)
        assert points > 30, f"only {points} points: is the tracer seeing the acquire?"
        print(f"{points} points")
        # The primitive is still usable (its connection pool was left clean).
        while prim._levels(owner):
            prim.release()
        assert prim.acquire(timeout=10)
        prim.release()
        assert not direct.exists(key)
    finally:
        reset(direct, prim, key)


@pytest.mark.timeout(600)
@pytest.mark.skipif(sys.gettrace() is not None, reason="a tracer (coverage?) is active")
@pytest.mark.parametrize("outer", [0, 1], ids=["last", "inner"])
@pytest.mark.parametrize("kind", KINDS)
def test_interrupt_at_every_point_of_release_leaves_books_and_redis_agreeing(
    direct: "redis.Redis[bytes]", name: str, kind: str, outer: int
) -> None:
    """Whatever point of ``release()`` an exception hits, Redis and the books agree
    afterwards: either the level was released (in both) or it is still held (in both,
    renewed and held, so a later loss is still reported), never released in one and held
    in the other (a hold left in Redis that nobody renews or releases blocks everyone
    until its lease ends)."""
    reentrant(kind, outer)
    prim, key, field = make(kind, name, direct)
    load(direct, prim)
    owner = thread_owner()

    def setup() -> None:
        while prim._levels(owner) > outer + 1:
            prim.release()
        while prim._levels(owner) < outer + 1:
            assert prim.acquire(timeout=10)

    def expect(now: State, interrupted: bool) -> Optional[str]:
        allowed = [holding(outer)]
        if interrupted:
            allowed.append(holding(outer + 1))
        if now not in allowed:
            return (f"(redis, books, hold, renewed, state, odd) = {now}, "
                    f"expected one of {allowed}")
        return None

    try:
        points, failures = visit_every_point(
            direct, prim, key, field, prim.release, setup, expect, RELEASED
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
    completes first, leaves its holds as they were (Redis, books, renewal)."""
    import redis.asyncio

    import rlocks.asyncio as ra
    from rlocks._engine.identity import task_owner

    async def main() -> List[str]:
        c = redis.asyncio.Redis.from_url(
            server.url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=5
        )
        prim: Any
        if kind == "rlock":
            prim = ra.RLock(name, client=c, ttl=TTL, namespace=NAMESPACE)
        elif kind in ("write", "read"):
            rw = ra.RWLock(name, client=c, ttl=TTL, namespace=NAMESPACE)
            prim = rw.write_lock if kind == "write" else rw.read_lock
        else:
            prim = ra.BoundedSemaphore(name, 3, client=c, ttl=TTL, namespace=NAMESPACE)
        key = prim._keys.hash
        load(direct, prim)
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
                want = holding(outer if cancelled else outer + 1)
                field = prim._spec.field(owner[0])
                now = state(direct, prim, key, field, owner[0], aio=True)
                if now != want:
                    failures.append(
                        f"cancelled after {steps} steps: (redis, books, hold, renewed, "
                        f"state, odd) = {now}, expected {want}"
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
