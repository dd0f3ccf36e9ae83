"""Model check: random sequences of acquire / re-acquire / release / single tries by
several owners, run on an rlocks.RLock and on a threading.RLock side by side.

Each simulated owner is a thread of its own (RLock holds belong to threads), fed steps
through a queue. After every step the test compares the rlocks answer with
``threading.RLock``'s answer to the same call by the same thread (return value or
exception type), the owner's ``_recursion_count()`` / ``_is_owned()`` with the model, and
the Redis hash with the model exactly: ``{owner id: count}`` for the one holder, no key at
all when free, and a lease on the key whenever it exists.

A second machine (``QueueMachine``) adds what the server-side queue brings (issue 12):
threads that wait (queued), threads that time out (the head of the waiters included:
those behind it keep their places), and dead waiters ("ghosts": queue entries nobody
renews). It checks that the waiting threads are served in arrival order, within the
entry lease bound despite the ghosts, and the Redis hash and queue after every step:
one entry per waiting thread (``<arrival>:x:<owner>``, ``lua/lib.lua``), in the order
they came, and none for a thread that stopped waiting.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from typing import Any, Callable, List, Optional, Tuple

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import rlocks
from rlocks._engine.identity import thread_owner
from rlocks._engine.scripts import WAIT

from ._threads import hub_waiters
from .conftest import NAMESPACE, holds_in

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
        self.start(step)
        return self.collect(20)

    def start(self, step: Callable[[], Any]) -> None:
        """Give the thread ``step`` without waiting for it (a blocking acquire)."""
        self._steps.put(step)

    def collect(self, timeout: float) -> Any:
        """The outcome of the step started last (AssertionError after ``timeout`` s)."""
        try:
            kind, value = self._results.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"owner {self.index}: no outcome within {timeout} s") from None
        return value if kind == "ok" else ("raised", value)

    def busy(self) -> bool:
        """Whether its last step has not ended yet (no outcome waiting either)."""
        return self._results.empty()

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
        state = holds_in(self.client, key)
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


# s: the entry lease of the queue machine's locks (the ghosts' delay bound). A waiter
# renews its own entry each time it asks, at least every third of it: 1 s leaves a
# loaded machine 0.67 s before a late waiter's entry lapses (and it queues anew, last).
ENTRY = 1.0
GHOSTS = 2  # at most per example: together they delay the next holder up to ENTRY


class QueueMachine(RuleBasedStateMachine):
    """Waiting, time-outs and dead waiters on one RLock (threads of this process)."""

    client: Any = None  # set by the test before running

    def __init__(self) -> None:
        super().__init__()
        self.name = f"qmodel-{uuid.uuid4().hex[:12]}"
        self.owners = [Owner(i) for i in range(OWNERS + 1)]
        self.ours = [
            rlocks.RLock(self.name, client=self.client, ttl=30, namespace=NAMESPACE,
                         entry_lease=ENTRY)
            for _ in self.owners
        ]
        self.keys = self.ours[0]._keys
        self.holder: Optional[int] = None
        self.count = 0
        self.local: List[int] = []  # waiting threads, in arrival order
        self.ghosts = 0
        self.ghost_until = 0.0  # monotonic: every ghost's entry is over by then

    # -- helpers -----------------------------------------------------------------------------

    def idle(self) -> List[int]:
        return [i for i in range(len(self.owners)) if i != self.holder and i not in self.local]

    def local_waiters(self) -> int:
        return len(hub_waiters(self.ours[0]))

    def queued(self) -> List[Tuple[bytes, str]]:
        """The queue's live entries in arrival order: (member, owner id), ghosts too."""
        now_ms = int(self.client.time()[0]) * 1000 + int(self.client.time()[1]) // 1000
        members = self.client.zrangebyscore(self.keys.queue, now_ms, "+inf")
        entries = [(m, m.decode().split(":x:", 1)[1]) for m in members if not m.startswith(b"~")]
        return sorted(entries)  # '<16-digit arrival µs>:x:<owner>': the oldest first

    def entry(self, i: int) -> Optional[bytes]:
        """Owner ``i``'s queue entry, if it has one."""
        mine = [m for m, owner in self.queued() if owner == self.owners[i].id]
        assert len(mine) <= 1, mine
        return mine[0] if mine else None

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out after {timeout} s: {what}"
            time.sleep(0.005)

    def ghosts_over(self) -> None:
        """Wait until no ghost can still delay anyone (the next script drops them)."""
        pause = self.ghost_until - time.monotonic()
        if pause > 0:
            time.sleep(pause)

    def served(self) -> None:
        """The lock was freed: the first waiting thread gets it, within the bound."""
        if not self.local:
            return
        nxt = self.local.pop(0)
        bound = ENTRY * self.ghosts + 10.0  # ghosts' delay, plus a loaded machine's
        assert self.owners[nxt].collect(bound) is True
        self.holder, self.count = nxt, 1
        for other in self.local:
            assert self.owners[other].busy(), f"owner {other} returned out of turn"

    # -- rules -------------------------------------------------------------------------------

    @rule(data=st.data())
    def try_acquire(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from([*self.idle(), *([self.holder] if self.holder is not None else [])]))
        if self.holder is None:
            self.ghosts_over()
        got = self.owners[i].run(lambda: self.ours[i].acquire(blocking=False))
        # fair: a free lock with threads queued goes to them, not a try
        expected = self.holder == i or (self.holder is None and not self.local)
        assert got is expected, (got, i, self.holder, self.local)
        if got:
            self.holder = i
            self.count += 1

    @precondition(lambda self: self.holder is not None and bool(self.idle()))
    @rule(data=st.data())
    def wait(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(self.idle()))
        before = self.local_waiters()
        self.owners[i].start(lambda: self.ours[i].acquire(timeout=60))
        # refused, it is queued (by that very call), then waits for a wake-up
        self.wait_for(lambda: self.local_waiters() == before + 1 and self.entry(i) is not None,
                      10, "the waiter to queue and register")
        self.local.append(i)

    @precondition(lambda self: self.holder is not None and bool(self.idle()))
    @rule(data=st.data(), head=st.booleans())
    def time_out(self, data: st.DataObject, head: bool) -> None:
        """A thread waits and times out; its entry goes. ``head`` (with no thread waiting
        yet): it is the first waiter, and a thread that came after it keeps its place."""
        i = data.draw(st.sampled_from(self.idle()))
        if head and not self.local and len(self.idle()) > 1:
            j = data.draw(st.sampled_from([k for k in self.idle() if k != i]))
            self.owners[i].start(lambda: self.ours[i].acquire(timeout=0.5))
            self.wait_for(lambda: self.entry(i) is not None, 10, "the head to queue")
            self.owners[j].start(lambda: self.ours[j].acquire(timeout=60))
            self.wait_for(lambda: self.entry(j) is not None, 10, "the second waiter to queue")
            place = self.entry(j)
            ahead = {m for m, _ in self.queued() if m < place}
            assert self.owners[i].collect(10) is False
            self.local.append(j)
            assert self.entry(i) is None, "the head that timed out kept its entry"
            assert self.entry(j) == place, "the next waiter lost its place with the head"
            now_ahead = {m for m, _ in self.queued() if m < place}
            assert now_ahead <= ahead, "the next waiter lost its place with the head"
            self.wait_for(lambda: self.local_waiters() == 1, 10, "the second waiter")
        else:
            self.owners[i].start(lambda: self.ours[i].acquire(timeout=0.2))
            assert self.owners[i].collect(10) is False
            assert self.entry(i) is None, "a waiter that timed out kept its entry"

    @precondition(lambda self: self.holder is not None and self.ghosts < GHOSTS)
    @rule()
    def ghost(self) -> None:
        """A waiter that dies: its entry is queued and never renewed."""
        self.ghosts += 1
        gid = f"ghost-{uuid.uuid4().hex[:8]}:1"  # (host:pid:nonce:serial: one ':' will do)
        lock = self.ours[0]
        reply = lock._spec.acquire(lock, gid, 0, lock._entry_ms)(self.client)
        assert reply.status == WAIT, reply
        # its entry ends within ENTRY (it never asks again, so nothing is granted to it)
        self.ghost_until = time.monotonic() + ENTRY + 0.05

    @precondition(lambda self: self.holder is not None)
    @rule(leave=st.booleans())
    def release(self, leave: bool) -> None:
        i = self.holder
        assert i is not None
        times = self.count if leave else 1
        for _ in range(times):
            assert self.owners[i].run(self.ours[i].release) is None
        self.count -= times
        if self.count == 0:
            self.holder = None
            self.served()

    @precondition(lambda self: bool(self.idle()))
    @rule(data=st.data())
    def release_unowned(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(self.idle()))
        assert self.owners[i].run(self.ours[i].release) == ("raised", rlocks.NotOwnedError)

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def redis_matches_the_model(self) -> None:
        state = holds_in(self.client, self.keys.hash)
        if self.holder is not None:
            assert state == {self.owners[self.holder].id.encode(): str(self.count).encode()}
        else:
            assert state == {}  # nothing is ever granted to a waiter that is gone
        assert self.local_waiters() == len(self.local)
        # one entry per waiting thread, in the order they came (the ghosts aside)
        live = [owner for _, owner in self.queued() if not owner.startswith("ghost-")]
        assert live == [self.owners[i].id for i in self.local], (live, self.local)

    @invariant()
    def local_views_match_the_model(self) -> None:
        for i in self.idle() + ([self.holder] if self.holder is not None else []):
            count = self.count if self.holder == i else 0
            assert self.owners[i].run(self.ours[i]._recursion_count) == count

    def teardown(self) -> None:
        try:
            while self.holder is not None:
                i = self.holder
                for _ in range(self.count):
                    self.owners[i].run(self.ours[i].release)
                self.holder, self.count = None, 0
                self.served()
        finally:
            for owner in self.owners:
                owner.stop()
            self.client.delete(self.keys.hash, self.keys.queue)


@pytest.mark.timeout(120)
def test_queued_waiters_follow_the_fifo_model(client: Any) -> None:
    QueueMachine.client = client
    runner = QueueMachine.TestCase()
    runner.settings = settings(
        max_examples=15,
        stateful_step_count=15,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        database=None,
    )
    runner.runTest()
