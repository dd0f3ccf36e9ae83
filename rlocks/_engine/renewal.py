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
    """The renewer thread of one backend."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.schedule = _Schedule()
        self._cond = threading.Condition(threading.Lock())
        self._thread: Optional[threading.Thread] = None

    def add(self, hold: Hold) -> None:
        with self._cond:
            self.schedule.add(hold)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="rlocks-renewer")
                self._thread.start()
            else:
                self._cond.notify()

    def _run(self) -> None:
        idle = monotonic()
        while True:
            with self._cond:
                while True:
                    now = monotonic()
                    due = self.schedule.next_due()
                    if due is not None and due <= now:
                        batch = self.schedule.take_due(now)
                        break
                    if due is None and now - idle > IDLE:
                        self._thread = None
                        return
                    self._cond.wait(IDLE if due is None else due - now)
            drive(renew_pass(self.backend, batch))
            idle = monotonic()
            with self._cond:
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


_renewers: "weakref.WeakKeyDictionary[Any, Renewer]" = weakref.WeakKeyDictionary()
_async: "weakref.WeakKeyDictionary[Any, Dict[Any, AsyncRenewer]]" = weakref.WeakKeyDictionary()
_mutex = threading.Lock()


def renewer_for(backend: Any, aio: bool = False) -> Any:
    """The renewer of ``backend`` (for asyncio: of the running loop)."""
    if aio:
        per_loop = _async.setdefault(asyncio.get_running_loop(), {})
        for other in per_loop.values():
            other.revive()  # any acquire of the loop restarts a cancelled renewer
        task = per_loop.get(backend)
        if task is None:
            task = per_loop[backend] = AsyncRenewer(backend)
        return task
    with _mutex:
        thread = _renewers.get(backend)
        if thread is None:
            thread = _renewers[backend] = Renewer(backend)
        return thread


def _reset_after_fork() -> None:
    global _mutex
    _mutex = threading.Lock()
    _renewers.clear()
    _async.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
