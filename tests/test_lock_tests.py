"""CPython's own lock contract tests (``Lib/test/lock_tests.py``) on every rlocks primitive.

RLock (with ``threading.Condition``), Lock, ``rlocks.Condition`` (on an RLock and on a write
side), RWLock's write side, Semaphore and BoundedSemaphore run through the interpreter's
``test`` package, imported, not copied, so they are held to exactly the contract of their
``threading`` twins. ``threading``'s own classes run through
the same tests as control rows: if a control fails, the harness is broken, not rlocks.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from typing import Any

import pytest

lock_tests = pytest.importorskip(
    "test.lock_tests",
    reason="this Python has no stdlib test package (Debian: install libpython3-testsuite)",
)

import rlocks  # noqa: E402

from ._servers import wait_until  # noqa: E402
from ._threads import engine_threads, hub_waiters  # noqa: E402
from .conftest import NAMESPACE  # noqa: E402

_serial = itertools.count()
_client = None  # set by the autouse fixture; locktype()/semtype() are staticmethods


def _unique(prefix: str) -> str:
    # A fresh name for every primitive: these tests assume a new one is free (or full).
    return f"{prefix}-{uuid.uuid4().hex}-{next(_serial)}"


def make_rlock() -> rlocks.RLock:
    return rlocks.RLock(_unique("lock-tests"), client=_client, namespace=NAMESPACE)


def make_lock() -> rlocks.Lock:
    return rlocks.Lock(_unique("plain-lock-tests"), client=_client, namespace=NAMESPACE)


def make_write_lock() -> Any:
    return rlocks.RWLock(_unique("rw-lock-tests"), client=_client, namespace=NAMESPACE).write_lock


def make_semaphore(*args: Any, **kwargs: Any) -> rlocks.Semaphore:
    return rlocks.Semaphore(
        _unique("sem-lock-tests"), *args, client=_client, namespace=NAMESPACE, **kwargs
    )


def make_bounded_semaphore(*args: Any, **kwargs: Any) -> rlocks.BoundedSemaphore:
    return rlocks.BoundedSemaphore(
        _unique("bsem-lock-tests"), *args, client=_client, namespace=NAMESPACE, **kwargs
    )


@pytest.fixture(autouse=True)
def _shared_client_and_warm_engine(client):  # type: ignore[no-untyped-def]
    """Share the client, and start rlocks' two per-process threads before the test.

    CPython's harness counts live threads before and after each test and fails a test
    that leaves more than it found. rlocks starts its renewer and wake-up hub lazily, on
    the first hold and the first wait; started inside a test they would be counted as
    that test's leak. A contended acquire here starts both, and they serve every
    primitive on this client and namespace.
    """
    global _client
    _client = client
    lock = make_rlock()
    lock.acquire()
    # Held until both threads run: a contender with a short time-out (it was 10 ms) could
    # give up before it waited on a loaded machine, and the hub then started inside the
    # test (TestSemaphore::test_acquire_contended failed so, "failed to cleanup 1 threads").
    contender = threading.Thread(target=lambda: lock.acquire(timeout=60) and lock.release())
    contender.start()
    # The contender registered for wake-ups (its subscriber runs), and the renewer runs.
    wait_until(lambda: len(hub_waiters(lock)) == 1
               and {"rlocks-wakeups", "rlocks-renewer"} <= set(engine_threads()),
               60, "the renewer and the wake-up subscriber")
    lock.release()
    contender.join(60)
    assert not contender.is_alive()
    before = {t.ident for t in threading.enumerate()}
    yield
    # Printed (shown if the test fails): what a "failed to cleanup N threads" counted.
    started = [t.name for t in threading.enumerate() if t.ident not in before]
    if started:
        print(f"threads started during the test and still alive: {started}")


REPR_REASON = (
    "repr does no I/O, so it cannot say whether another process holds the lock or how "
    "many permits are free; it reports local holds instead of threading's '<locked ...>' "
    "/ 'value=3' (see test_repr_is_local)"
)


class _SkipLockRepr:
    @pytest.mark.skip(reason=REPR_REASON)
    def test_repr(self) -> None:  # pragma: no cover
        pass

    @pytest.mark.skip(reason=REPR_REASON)
    def test_locked_repr(self) -> None:  # pragma: no cover
        pass


class _SkipSemaphoreRepr:
    @pytest.mark.skip(reason=REPR_REASON)
    def test_repr(self) -> None:  # pragma: no cover
        pass


class TestRLock(_SkipLockRepr, lock_tests.RLockTests):
    locktype = staticmethod(make_rlock)


class TestLock(_SkipLockRepr, lock_tests.LockTests):
    locktype = staticmethod(make_lock)

    @pytest.mark.skip(reason=(
        "_at_fork_reinit() is what a fork child runs: it forgets the parent's hold, which "
        "Redis keeps for the parent to release, so in one process the test's second "
        "acquire waits for a release nobody makes (tests/test_fork.py covers fork)"))
    def test_at_fork_reinit(self) -> None:  # pragma: no cover
        pass


class TestCondition(lock_tests.ConditionTests):
    # Condition(lock=None) builds a threading.RLock; give it ours. The few tests that pass
    # their own threading.Lock keep it.
    condtype = staticmethod(
        lambda *args: threading.Condition(*args) if args else threading.Condition(make_rlock())
    )


class TestRLocksCondition(lock_tests.ConditionTests):
    # rlocks.Condition on an rlocks.RLock. test_acquire also builds a condition on a
    # threading.Lock, which rlocks.Condition refuses: that one is threading's own.
    condtype = staticmethod(
        lambda *args: threading.Condition(*args) if args else rlocks.Condition(make_rlock())
    )


class TestRLocksConditionOnWriteLock(lock_tests.ConditionTests):
    condtype = staticmethod(
        lambda *args: (
            threading.Condition(*args) if args else rlocks.Condition(make_write_lock())
        )
    )


class TestRWLockWriteSide(_SkipLockRepr, lock_tests.RLockTests):
    locktype = staticmethod(make_write_lock)


class TestSemaphore(_SkipSemaphoreRepr, lock_tests.SemaphoreTests):
    semtype = staticmethod(make_semaphore)


class TestBoundedSemaphore(_SkipSemaphoreRepr, lock_tests.BoundedSemaphoreTests):
    semtype = staticmethod(make_bounded_semaphore)


class TestThreadingRLockControl(lock_tests.RLockTests):
    """The control rows: the same contracts on ``threading``'s own classes."""

    locktype = staticmethod(threading.RLock)


class TestThreadingLockControl(lock_tests.LockTests):
    locktype = staticmethod(threading.Lock)


class TestThreadingSemaphoreControl(lock_tests.SemaphoreTests):
    semtype = staticmethod(threading.Semaphore)


class TestThreadingBoundedSemaphoreControl(lock_tests.BoundedSemaphoreTests):
    semtype = staticmethod(threading.BoundedSemaphore)
