"""The renewer: keeps this process's leases alive, in batched round trips.

One per backend (a client, or a Quorum) and driver: a daemon thread for blocking clients,
a task per event loop for ``redis.asyncio`` ones. Each hold is renewed a third of its ttl
after its lease was last set, so a renewer may come up to two thirds of a ttl late
before a lease ends; every hold due within :data:`BATCH` of the first goes in the same
pipeline. What a renewal finds goes to the hold (:mod:`.holds`), which alone decides:

- renewed: the lease lasts a ttl from the send of the renewal;
- gone from Redis: ``Hold.found_gone`` (lost, unless a release of it is on its way);
- no answer (the link, a server restarting): tried again soon, and once the lease as
  last renewed has surely ended, the hold is lost.

The renewer holds holds weakly: a hold nobody holds any more (collected) is dropped. A
thread with nothing to renew exits after :data:`IDLE` seconds; the next grant starts a
new one. A ``fork()`` child starts with none.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import queue
import threading
import weakref
from typing import Any, Dict, Generator, List, Optional, Tuple

from . import metrics
from .clock import monotonic
from .holds import Hold
from .scripts import LOST, Reply
from .steps import RunMany, adrive, drive, transient

__all__ = ["BATCH", "IDLE", "renewer_for"]

log = logging.getLogger(__name__)

BATCH = 0.05  # s: holds due this soon after the first go in its pipeline
IDLE = 60.0  # s with nothing to renew after which a renewer thread exits
RETRY = 0.1  # s, at most, between renewals that found no server

_Entry = Tuple[float, int, "weakref.ref[Hold]"]
_seq = itertools.count()


class _Schedule:
    """The holds to renew, by due time (weakly held)."""

    def __init__(self) -> None:
        self.heap: List[_Entry] = []

    def add(self, hold: Hold) -> None:
        heapq.heappush(self.heap, (hold.due, next(_seq), weakref.ref(hold)))

    def next_due(self) -> Optional[float]:
        while self.heap:
            due, _, ref = self.heap[0]
            hold = ref()
            if hold is None or not hold.alive or hold.due != due:
                heapq.heappop(self.heap)  # gone, or rescheduled (a later entry has it)
                continue
            return due
        return None

    def take_due(self, now: float) -> List[Hold]:
        first = self.next_due()
        if first is None or first > now:
            return []
        batch: Dict[int, Hold] = {}
        while self.heap and self.heap[0][0] <= first + BATCH:
            due, _, ref = heapq.heappop(self.heap)
            hold = ref()
            if hold is not None and hold.alive and hold.due == due:
                batch[id(hold)] = hold
        return list(batch.values())


def renew_pass(backend: Any, holds: List[Hold]) -> Generator[Any, Any, None]:
    """Renew ``holds`` in one round trip (written once for both drivers)."""
    calls = [h.renew_call for h in holds]
    sent = monotonic()
    try:
        results = yield RunMany(backend, calls)
    except Exception as exc:  # noqa: BLE001 - the link: every hold of the batch failed
        results = [exc] * len(holds)
    now = monotonic()
    if log.isEnabledFor(logging.DEBUG):
        names = ", ".join(h.label for h in holds[:3])
        more = f" and {len(holds) - 3} more" if len(holds) > 3 else ""
        log.debug("renewed %d lease(s) in one round trip: %s%s", len(holds), names, more)
    for hold, result in zip(holds, results):
        if isinstance(result, Reply) and result.ok:
            hold.renewed(sent)
            asked = hold.renew_call.replication
            if asked is not None and 0 <= result.replicas < asked[0]:
                log.warning("renewal of %s: only %d of %d replicas acknowledged it within "
                            "%d ms (the lease was extended on the primary)", hold.label,
                            result.replicas, asked[0], asked[1])
            obj = hold.any_object()
            if obj is not None:
                metrics.renewed(obj)
        elif isinstance(result, Reply) and result.status == LOST:
            hold.found_gone("its lease ended before it was renewed")
        else:
            if isinstance(result, BaseException) and not transient(result):
                # Not the link: a bug, or a server that refuses the call. Named, loudly.
                log.error("renewal of %s failed", hold.label, exc_info=result)
            else:
                log.debug("renewal of %r failed: %r", hold, result)
            if now >= hold.lease_end:
                hold.found_gone(f"it could not be renewed within its lease ({result!r})")
            else:
                hold.due = now + min(RETRY, max(0.01, (hold.lease_end - now) / 4))


class Renewer:
    """The renewer thread of one backend.

    Its lock and its wake-up queue are C objects (``threading.Lock``, ``queue.SimpleQueue``):
    an interrupt (a signal handler's exception) in :meth:`add` cannot strike inside them
    and leave the lock held or the thread asleep."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.schedule = _Schedule()
        self._lock = threading.Lock()
        self._wake: "queue.SimpleQueue[None]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._until = 0.0  # monotonic: when the sleeping thread wakes by itself
        _threads.add(self)

    def after_fork(self) -> None:
        """In a fork child: no thread, nothing to renew, a lock nobody holds."""
        self._lock = threading.Lock()
        self._wake = queue.SimpleQueue()
        self._thread = None
        self._until = 0.0
        self.schedule = _Schedule()

    def add(self, hold: Hold) -> None:
        with self._lock:
            self.schedule.add(hold)
            thread = self._thread
            if thread is None or not thread.is_alive():  # (a start cut short: again)
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="rlocks-renewer")
                self._thread.start()
                return
            # Woken only if it would sleep past this hold's renewal (rarely: a fresh hold
            # is due a third of a ttl from now, after the holds it sleeps for).
            early = hold.due < self._until
        if early:
            self._wake.put(None)

    def _run(self) -> None:
        idle = monotonic()
        while True:
            batch: Optional[List[Hold]] = None
            with self._lock:
                now = monotonic()
                due = self.schedule.next_due()
                if due is not None and due <= now:
                    batch = self.schedule.take_due(now)
                elif due is None and now - idle > IDLE:
                    if self._thread is threading.current_thread():
                        self._thread = None
                    return
                sleep = IDLE if due is None else due - now
                self._until = now + sleep
            if batch is None:
                try:
                    self._wake.get(timeout=sleep)
                except queue.Empty:
                    pass
                continue
            drive(renew_pass(self.backend, batch))
            idle = monotonic()
            with self._lock:
                for hold in batch:
                    if hold.alive:
                        self.schedule.add(hold)


class AsyncRenewer:
    """The renewer task of one backend in one event loop."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.schedule = _Schedule()
        self._wake = asyncio.Event()
        self._task: Optional["asyncio.Task[None]"] = None

    def add(self, hold: Hold) -> None:
        self.schedule.add(hold)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        else:
            self._wake.set()

    async def _run(self) -> None:
        batch: List[Hold] = []
        try:
            while True:
                now = monotonic()
                due = self.schedule.next_due()
                if due is None:
                    return
                if due > now:
                    self._wake.clear()
                    try:
                        async with asyncio.timeout(due - now):
                            await self._wake.wait()
                    except TimeoutError:
                        pass
                    continue
                batch = self.schedule.take_due(now)
                await adrive(renew_pass(self.backend, batch))
                for hold in batch:
                    if hold.alive:
                        self.schedule.add(hold)
                batch = []
        except asyncio.CancelledError:
            # Cancelled by code that cancels every task of a loop that goes on: its holds
            # stay on the schedule, and the loop's next grant starts a new task for them.
            for hold in batch:
                if hold.alive:
                    self.schedule.add(hold)
            left = sum(1 for _ in self.schedule.heap)
            if left:
                log.warning("the rlocks lease renewer of this event loop was cancelled with %d "
                            "hold(s) to renew: none is renewed until the loop's next acquire",
                            left)
            raise

    def revive(self) -> None:
        """Start a new task if this one ended (cancelled) with holds still to renew."""
        if (self._task is None or self._task.done()) and self.schedule.next_due() is not None:
            self._task = asyncio.ensure_future(self._run())


# Every renewer (for the fork hook), and the asyncio renewers of each loop (any acquire
# of a loop restarts its cancelled ones). A renewer lives on its backend (``renewer``,
# ``async_renewers``): it goes when the backend goes.
_threads: "weakref.WeakSet[Renewer]" = weakref.WeakSet()
_by_loop: "weakref.WeakKeyDictionary[Any, weakref.WeakSet[AsyncRenewer]]" = (
    weakref.WeakKeyDictionary())
_mutex = threading.Lock()


def renewer_for(backend: Any, aio: bool = False) -> Any:
    """The renewer of ``backend`` (for asyncio: of the running loop)."""
    if aio:
        loop = asyncio.get_running_loop()
        others = _by_loop.setdefault(loop, weakref.WeakSet())
        for other in list(others):
            other.revive()  # any acquire of the loop restarts a cancelled renewer
        task = backend.async_renewers.get(loop)
        if task is None:
            task = backend.async_renewers[loop] = AsyncRenewer(backend)
            others.add(task)
        return task
    with _mutex:
        thread = backend.renewer
        if thread is None:
            thread = backend.renewer = Renewer(backend)
        return thread


def _reset_after_fork() -> None:
    # The parent's holds are forgotten (holds.py); its renewer threads are not here, and a
    # lock one of them held at the fork would stay held: every renewer starts afresh.
    global _mutex
    _mutex = threading.Lock()
    for renewer in list(_threads):
        renewer.after_fork()
    _by_loop.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
