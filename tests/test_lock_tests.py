"""CPython's own lock contract tests (``Lib/test/lock_tests.py``), run on rlocks.RLock.

The tests are imported from the interpreter's ``test`` package, not copied, so they are
exactly the contract ``threading.RLock`` is held to. ``threading.RLock`` itself runs
through the same classes as a control row: if the control fails, the harness is broken,
not rlocks.
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

import rlocks  # noqa: E402

from .conftest import NAMESPACE  # noqa: E402

_serial = itertools.count()
_client = None  # set by the autouse fixture below; locktype() is a staticmethod


@pytest.fixture(autouse=True)
def _shared_client_and_warm_engine(client):  # type: ignore[no-untyped-def]
    """Share the client, and start rlocks' two per-process threads before the test.

    CPython's harness counts live threads before and after each test and fails a test
    that leaves more than it found. rlocks starts its renewer and wake-up hub lazily, on
    the first hold and the first wait; started inside a test they would be counted as
    that test's leak. A contended acquire here starts both.
    """
    global _client
    _client = client
    lock = make_rlock()
    lock.acquire()
    contender = threading.Thread(target=lock.acquire, kwargs={"timeout": 0.01})
    contender.start()
    contender.join()
    lock.release()
    yield


def make_rlock() -> rlocks.RLock:
    # A fresh name for every lock: these tests assume a new lock is free.
    return rlocks.RLock(
        f"lock-tests-{uuid.uuid4().hex}-{next(_serial)}", client=_client, namespace=NAMESPACE
    )


REPR_REASON = (
    "repr does no I/O, so it cannot say whether another process holds the lock; "
    "it reports local holds instead of threading's '<locked ...>' (see test_repr_is_local)"
)


class TestRLock(lock_tests.RLockTests):
    locktype = staticmethod(make_rlock)

    @pytest.mark.skip(reason=REPR_REASON)
    def test_repr(self) -> None:  # pragma: no cover
        pass

    @pytest.mark.skip(reason=REPR_REASON)
    def test_locked_repr(self) -> None:  # pragma: no cover
        pass


class TestCondition(lock_tests.ConditionTests):
    # Condition(lock=None) builds a threading.RLock; give it ours. The few tests that pass
    # their own threading.Lock keep it.
    condtype = staticmethod(
        lambda *args: threading.Condition(*args) if args else threading.Condition(make_rlock())
    )


class TestThreadingRLockControl(lock_tests.RLockTests):
    """The control row: the same contract on ``threading.RLock``."""

    locktype = staticmethod(threading.RLock)
