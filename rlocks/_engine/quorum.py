"""A quorum of independent Redis masters (the Redlock algorithm).

``rlocks.Quorum(clients)`` is passed as ``client=`` to an ``RLock`` or ``RWLock``. Each of
the N masters (N odd, at least 3, no replication between them) keeps its own copy of the
primitive's hash, changed by the primitive's own scripts. A hold exists only while a
*majority* (N // 2 + 1) of the masters have it:

- an acquire runs the acquire script on every master at once (one thread per master from
  a small pool, so the attempt costs the slowest *answering* master's round trip, and a
  master that is down, paused or slow costs at most the client's socket timeout). It is
  granted only when a majority granted it and ``ttl - elapsed - drift`` is still
  positive (the validity window; ``drift`` is :func:`drift_allowance`). Otherwise what
  the minority granted is given back at once and the caller waits or returns False;
- re-entry, renewal, ``extend`` and release go to every master; a hold is lost when
  fewer than a majority still have it;
- every try is the scripts' *single-try* form (nothing is queued on any master). The
  hand-over queue hands a freed lock to the head waiter inside the release script of one
  master; with one queue per master, heads may differ, and a waiter granted by hand-over
  on a minority would hold grants it must give back and that block everyone else until
  then. Single tries never leave a grant behind on a minority for longer than the give-
  back round trip (or a lease, when that fails). The price is fairness: quorum waiters
  are not served first come, first served; they re-try with a randomised, growing pause
  (Redlock's own advice against synchronised retries), and a release by this process
  wakes this process's waiters at once. A waiter in another process notices a release
  at its next re-try (at most :data:`RETRY_MAX` s later).

Clock assumption: like every Redlock, this needs each master's clock to advance at about
the rate of the client's monotonic clock (no jumps; Redis 7 measures expiry with its own
clock) and a lease to end no earlier on a master than ``ttl - drift`` after it was set.
A GC pause or SIGSTOP of the *holder* longer than the validity window is not detected
(no lock service can detect it without fencing): see docs/operations.md.
"""

from __future__ import annotations

import os
import random
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar

from .clients import is_cluster, pool_of

__all__ = ["DRIFT_FACTOR", "RETRY_MAX", "RETRY_MIN", "Quorum", "drift_allowance"]

T = TypeVar("T")

DRIFT_FACTOR = 0.01  # share of the lease allowed for clock drift between the masters
DRIFT_FIXED = 0.002  # s added to it (Redis' own expiry resolution is 1 ms)
RETRY_MIN = 0.01  # s, first pause between a waiter's tries
RETRY_MAX = 0.2  # s, the longest pause between a waiter's tries


def drift_allowance(ttl: float) -> float:
    """The clock-drift allowance (s) of a lease of ``ttl`` s: 1 % of it plus 2 ms."""
    return ttl * DRIFT_FACTOR + DRIFT_FIXED


def _address(client: Any) -> Optional[Tuple[Any, ...]]:
    """(host, port, db) or (unix path, db) of a plain client's pool, if it has one."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return None
    if kwargs.get("path"):
        return (kwargs["path"], kwargs.get("db", 0))
    return (kwargs.get("host"), kwargs.get("port"), kwargs.get("db", 0))


def _is_async(client: Any) -> bool:
    return type(client).__module__.startswith("redis.asyncio")


class Quorum:
    """Independent Redis masters that hold a lock together: a majority decides.

    ``Quorum(clients)``: a sequence of an odd number (3, 5, ...) of ``redis.Redis``
    clients, or of ``redis.asyncio.Redis`` clients (for the ``rlocks.asyncio`` twins),
    each for a different master. Pass it as ``client=`` to ``rlocks.RLock`` or
    ``rlocks.RWLock``. Every process using a name must pass the same masters.

    Raises TypeError for something that is not such a sequence of clients (a string, a
    cluster client, sync and asyncio clients mixed) and ValueError for fewer than 3
    clients, an even number, or two clients of the same pool or address. No I/O.

    Give each client a socket timeout: it bounds what a paused or unreachable master
    costs an operation (rlocks caps it at 10 s, see docs/operations.md).
    """

    __slots__ = ("_masters", "_majority", "_async", "_executor", "_pid", "_mutex",
                 "_changed", "_generation", "_listeners", "__weakref__")

    def __init__(self, clients: Sequence[Any]) -> None:
        if isinstance(clients, (str, bytes)) or not isinstance(clients, (list, tuple)):
            raise TypeError(
                "rlocks.Quorum: clients must be a list or tuple of redis clients, "
                f"not {type(clients).__name__}"
            )
        masters = tuple(clients)
        for client in masters:
            if not callable(getattr(client, "evalsha", None)):
                raise TypeError(
                    "rlocks.Quorum: every client must be a redis.Redis or "
                    f"redis.asyncio.Redis, not {type(client).__name__}"
                )
            if is_cluster(client) or type(client).__name__ == "RedisCluster":
                raise TypeError(
                    "rlocks.Quorum: a Redis Cluster client is not one master; pass one "
                    "redis.Redis per independent master"
                )
        kinds = {_is_async(client) for client in masters}
        if len(kinds) > 1:
            raise TypeError(
                "rlocks.Quorum: clients mix redis.Redis and redis.asyncio.Redis; use one "
                "kind (asyncio clients for rlocks.asyncio primitives)"
            )
        if len(masters) < 3 or len(masters) % 2 == 0:
            raise ValueError(
                f"rlocks.Quorum: needs an odd number of masters, at least 3, not "
                f"{len(masters)} (an even number tolerates no more failures than one "
                "fewer, and a majority of fewer than 3 survives no failure)"
            )
        pools = [id(pool_of(client)) for client in masters]
        addresses = [a for a in (_address(client) for client in masters) if a is not None]
        if len(set(pools)) != len(pools) or len(set(addresses)) != len(addresses):
            raise ValueError(
                "rlocks.Quorum: two clients are for the same master (same pool or "
                "address); a quorum needs independent masters"
            )
        self._masters: Tuple[Any, ...] = masters
        self._majority = len(masters) // 2 + 1
        self._async = kinds == {True}
        self._executor: Optional[ThreadPoolExecutor] = None
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._changed = threading.Condition(self._mutex)
        self._generation = 0
        self._listeners: List[Callable[[], None]] = []

    @property
    def masters(self) -> Tuple[Any, ...]:
        """The clients, one per master, in the order given."""
        return self._masters

    @property
    def majority(self) -> int:
        """How many masters must agree: ``len(masters) // 2 + 1``."""
        return self._majority

    @property
    def is_async(self) -> bool:
        """Whether the clients are ``redis.asyncio`` clients."""
        return self._async

    def __repr__(self) -> str:
        return f"<rlocks.Quorum of {len(self._masters)} masters, majority {self._majority}>"

    # -- fan-out (threads; the asyncio twins use asyncio.gather instead) ----------------

    def _pool(self) -> ThreadPoolExecutor:
        pid = os.getpid()
        with self._mutex:
            if self._executor is None or self._pid != pid:
                # A fork child has none of its parent's worker threads: make its own.
                self._executor = ThreadPoolExecutor(
                    max_workers=4 * len(self._masters), thread_name_prefix="rlocks-quorum"
                )
                self._pid = pid
            return self._executor

    def map(
        self,
        fn: Callable[[Any], T],
        masters: Sequence[Any] | None = None,
        abandoned: Callable[[List[T | Exception]], None] | None = None,
    ) -> List[T | Exception]:
        """``fn(master)`` on every master (or on ``masters``) at once, blocking until all
        answered: each result, or the Exception it raised, in the masters' order.

        Each call is as long as its client's socket timeout allows; the slowest bounds
        the whole. A BaseException that is not an Exception (an interrupt raised in the
        caller by a signal handler) propagates at once; the calls already sent still
        run, and ``abandoned`` (if given) is then called with their results, on a worker
        thread, once all have answered (to give back what nobody will record).
        """
        chosen = self._masters if masters is None else tuple(masters)
        futures = [self._pool().submit(fn, master) for master in chosen]
        try:
            wait_futures(futures)
        except BaseException:
            if abandoned is not None:
                self._pool().submit(self._after_abandoned, futures, abandoned)
            raise
        return self._results(futures)

    @staticmethod
    def _results(futures: Sequence[Future[T]]) -> List[T | Exception]:
        results: List[T | Exception] = []
        for future in futures:
            error = future.exception()
            if error is None:
                results.append(future.result())
            elif isinstance(error, Exception):
                results.append(error)
            else:
                raise error
        return results

    @staticmethod
    def _after_abandoned(
        futures: Sequence[Future[T]], abandoned: Callable[[List[T | Exception]], None]
    ) -> None:
        wait_futures(futures)
        try:
            abandoned(Quorum._results(futures))
        except BaseException:  # noqa: BLE001 - best effort: what is left ends with its lease
            pass

    # -- local wake-ups -----------------------------------------------------------------

    @property
    def generation(self) -> int:
        """A counter :meth:`released` advances (read before a try, passed to pause)."""
        return self._generation

    def released(self) -> None:
        """Something was released through this quorum here: wake this process's waiters."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()
            listeners = list(self._listeners)
        for listener in listeners:  # outside the mutex: a listener may take its own
            try:
                listener()
            except RuntimeError:  # a waiter's event loop closed under it: nobody to wake
                pass

    def listen(self, listener: Callable[[], None]) -> None:
        """Have ``listener()`` called at each :meth:`released` (an asyncio waiter's
        ``call_soon_threadsafe(event.set)``) until :meth:`unlisten`. It must not block."""
        with self._mutex:
            self._listeners.append(listener)

    def unlisten(self, listener: Callable[[], None]) -> None:
        with self._mutex:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def pause(self, generation: int, seconds: float) -> None:
        """Sleep ``seconds``, or less when a release here advanced past ``generation``."""
        with self._changed:
            if self._generation == generation:
                self._changed.wait(seconds)

    @staticmethod
    def next_pause(previous: float) -> Tuple[float, float]:
        """(this pause, the next one's base): randomised and growing up to RETRY_MAX."""
        base = min(max(previous, RETRY_MIN), RETRY_MAX)
        return random.uniform(base / 2, base), min(base * 2, RETRY_MAX)

    # -- what RLock.locked() asks ------------------------------------------------------

    def agreed(self, results: Sequence[int | Exception]) -> int:
        """The largest count at least a majority of ``results`` (one per master) reach:
        a minority's copy of a hold is not a hold. Raises the first error when too few
        masters answered to tell."""
        answers = sorted((r for r in results if not isinstance(r, Exception)), reverse=True)
        if len(answers) < self._majority:
            raise next(r for r in results if isinstance(r, Exception))
        return answers[self._majority - 1]

    def exists(self, *keys: str) -> int:
        """How many of ``keys`` a majority of the masters have (what ``RLock.locked``
        asks; one round trip to each master at once)."""
        return self.agreed(self.map(lambda master: int(master.exists(*keys))))
