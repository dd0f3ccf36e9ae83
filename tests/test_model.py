"""Model check: random sequences of acquire / re-acquire / release / single tries by
several owners, run on an rlocks.RLock and on a threading.RLock side by side.

Each simulated owner is a thread of its own (RLock holds belong to threads), fed steps
through a queue. After every step the test compares the rlocks answer with
``threading.RLock``'s answer to the same call by the same thread (return value or
exception type), the owner's ``_recursion_count()`` / ``_is_owned()`` with the model, and
the Redis hash with the model exactly: ``{owner id: count}`` for the one holder, no key at
all when free, and a lease on the key whenever it exists.
"""

from __future__ import annotations

import queue
import threading
import uuid
from typing import Any, Callable, Optional, Tuple

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import rlocks
from rlocks._engine.identity import thread_owner

from .conftest import NAMESPACE

OWNERS = 3
SHORT = 0.02  # s: the timeout of a blocking acquire that the model says must fail


class Owner:
    """A thread that runs the steps it is given, one at a time, and returns the outcome."""

    def __init__(self, index: int) -> None:
        self.index = index
        self._steps: "queue.Queue[Optional[Callable[[], Any]]]" = queue.Queue()
        self._results: "queue.Queue[Tuple[str, Any]]" = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"owner-{index}")
        self.thread.start()
        self.id = self.run(thread_owner)

    def _run(self) -> None:
        while True:
            step = self._steps.get()
            if step is None:
                return
            try:
                self._results.put(("ok", step()))
            except Exception as exc:  # noqa: BLE001 - an outcome to compare
                self._results.put(("raised", type(exc)))

    def run(self, step: Callable[[], Any]) -> Any:
        self._steps.put(step)
        kind, value = self._results.get(timeout=20)
        return value if kind == "ok" else ("raised", value)

    def stop(self) -> None:
        self._steps.put(None)
        self.thread.join(10)


def outcome_kind(value: Any) -> Any:
    """Map an exception type to the threading category it must match."""
    if isinstance(value, tuple) and value and value[0] == "raised":
        return ("raised", RuntimeError if issubclass(value[1], RuntimeError) else value[1])
    return value


class RLockMachine(RuleBasedStateMachine):
    client: Any = None  # set by the test before running

    def __init__(self) -> None:
        super().__init__()
        self.name = f"model-{uuid.uuid4().hex[:12]}"
        self.owners = [Owner(i) for i in range(OWNERS)]
        self.ours = [
            rlocks.RLock(self.name, client=self.client, ttl=30, namespace=NAMESPACE)
            for _ in range(OWNERS)
        ]
        self.reference = threading.RLock()
        self.holder: Optional[int] = None
        self.count = 0

    # -- model helpers -----------------------------------------------------------------------

    def both(self, i: int, ours: Callable[[Any], Any], ref: Callable[[Any], Any]) -> Any:
        got = self.owners[i].run(lambda: ours(self.ours[i]))
        want = self.owners[i].run(lambda: ref(self.reference))
        assert outcome_kind(got) == outcome_kind(want), (got, want)
        return got

    def free_or_mine(self, i: int) -> bool:
        return self.holder is None or self.holder == i

    def granted(self, i: int) -> None:
        self.holder = i
        self.count += 1

    # -- rules -------------------------------------------------------------------------------

    @rule(i=st.integers(0, OWNERS - 1))
    def try_acquire(self, i: int) -> None:
        got = self.both(i, lambda l: l.acquire(blocking=False), lambda l: l.acquire(blocking=False))
        assert got is self.free_or_mine(i)
        if got:
            self.granted(i)

    @rule(i=st.integers(0, OWNERS - 1))
    def acquire_with_timeout(self, i: int) -> None:
        # Blocks only when another owner holds it: then both must give up after SHORT.
        got = self.both(i, lambda l: l.acquire(timeout=SHORT), lambda l: l.acquire(timeout=SHORT))
        assert got is self.free_or_mine(i)
        if got:
            self.granted(i)

    @precondition(lambda self: self.holder is not None)
    @rule()
    def reacquire_by_holder(self) -> None:
        i = self.holder
        assert self.both(i, lambda l: l.acquire(), lambda l: l.acquire()) is True
        self.granted(i)

    @rule(i=st.integers(0, OWNERS - 1))
    def release(self, i: int) -> None:
        got = self.both(i, lambda l: l.release(), lambda l: l.release())
        if self.holder == i:
            assert got is None
            self.count -= 1
            if self.count == 0:
                self.holder = None
        else:
            assert got == ("raised", rlocks.NotOwnedError), got

    @rule(i=st.integers(0, OWNERS - 1), bad=st.sampled_from(["negative", "nonblocking"]))
    def bad_arguments(self, i: int, bad: str) -> None:
        if bad == "negative":
            self.both(i, lambda l: l.acquire(timeout=-5), lambda l: l.acquire(timeout=-5))
        else:
            self.both(
                i, lambda l: l.acquire(False, timeout=1), lambda l: l.acquire(False, timeout=1)
            )

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def redis_matches_the_model(self) -> None:
        key = self.ours[0]._keys.hash
        state = self.client.hgetall(key)
        if self.holder is None:
            assert state == {}
            assert not self.client.exists(key)
        else:
            assert state == {self.owners[self.holder].id.encode(): str(self.count).encode()}
            assert self.client.pttl(key) > 0

    @invariant()
    def local_views_match_the_model(self) -> None:
        for i, owner in enumerate(self.owners):
            count = self.count if self.holder == i else 0
            assert owner.run(self.ours[i]._recursion_count) == count
            assert owner.run(self.ours[i]._is_owned) is (count > 0)
            assert owner.run(self.reference._is_owned) is (count > 0)

    def teardown(self) -> None:
        if self.holder is not None:
            i = self.holder
            for _ in range(self.count):
                self.owners[i].run(self.ours[i].release)
                self.owners[i].run(self.reference.release)
        for owner in self.owners:
            owner.stop()
        assert not self.client.exists(self.ours[0]._keys.hash)


@pytest.mark.timeout(120)
def test_rlock_follows_the_threading_model(client: Any) -> None:
    RLockMachine.client = client
    runner = RLockMachine.TestCase()
    runner.settings = settings(
        max_examples=40,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        database=None,
    )
    runner.runTest()
