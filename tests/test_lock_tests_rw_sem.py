"""CPython's lock contract tests (``Lib/test/lock_tests.py``) on RWLock's write side,
Semaphore and BoundedSemaphore.

The tests come from the interpreter's ``test`` package, unchanged. ``threading``'s own
semaphores run through the same classes as control rows.
"""

from __future__ import annotations

import itertools
import threading
import uuid

import pytest

lock_tests = pytest.importorskip(
    "test.lock_tests",
    reason="this Python has no stdlib test package (Debian: install libpython3-testsuite)",
)

from rlocks.rwlock import RWLock  # noqa: E402
from rlocks.semaphore import BoundedSemaphore, Semaphore  # noqa: E402

from .conftest import NAMESPACE  # noqa: E402

_serial = itertools.count()
_client = None  # set by the autouse fixture; locktype()/semtype() are staticmethods


def _unique(prefix: str) -> str:
    # A fresh name for every primitive: these tests assume a new one is free / full.
    return f"{prefix}-{uuid.uuid4().hex}-{next(_serial)}"


@pytest.fixture(autouse=True)
def _shared_client_and_warm_engine(client):  # type: ignore[no-untyped-def]
    """Share the client and start rlocks' renewer and wake-up hub before the test.

    CPython's harness fails a test that leaves more threads than it found; rlocks starts
    its two per-process threads lazily, so a contended acquire here starts both.
    """
    global _client
    _client = client
    sem = Semaphore(_unique("warm"), 1, client=client, namespace=NAMESPACE)
    sem.acquire()
    contender = threading.Thread(target=sem.acquire, kwargs={"timeout": 0.01})
    contender.start()
    contender.join()
    sem.release()
    yield


def make_write_lock():  # type: ignore[no-untyped-def]
    return RWLock(_unique("rw-lock-tests"), client=_client, namespace=NAMESPACE).write_lock


def make_semaphore(*args, **kwargs):  # type: ignore[no-untyped-def]
    return Semaphore(
        _unique("sem-lock-tests"), *args, client=_client, namespace=NAMESPACE, **kwargs
    )


def make_bounded_semaphore(*args, **kwargs):  # type: ignore[no-untyped-def]
    return BoundedSemaphore(
        _unique("bsem-lock-tests"), *args, client=_client, namespace=NAMESPACE, **kwargs
    )


REPR_REASON = (
    "repr does no I/O: it shows local holds, not the lock state or free count that only "
    "Redis knows (threading's '<locked ...>' / 'value=3')"
)


class TestRWLockWriteSide(lock_tests.RLockTests):
    locktype = staticmethod(make_write_lock)

    @pytest.mark.skip(reason=REPR_REASON)
    def test_repr(self) -> None:  # pragma: no cover
        pass

    @pytest.mark.skip(reason=REPR_REASON)
    def test_locked_repr(self) -> None:  # pragma: no cover
        pass


class TestSemaphore(lock_tests.SemaphoreTests):
    semtype = staticmethod(make_semaphore)

    @pytest.mark.skip(reason=REPR_REASON)
    def test_repr(self) -> None:  # pragma: no cover
        pass


class TestBoundedSemaphore(lock_tests.BoundedSemaphoreTests):
    semtype = staticmethod(make_bounded_semaphore)

    @pytest.mark.skip(reason=REPR_REASON)
    def test_repr(self) -> None:  # pragma: no cover
        pass


class TestThreadingSemaphoreControl(lock_tests.SemaphoreTests):
    semtype = staticmethod(threading.Semaphore)


class TestThreadingBoundedSemaphoreControl(lock_tests.BoundedSemaphoreTests):
    semtype = staticmethod(threading.BoundedSemaphore)
