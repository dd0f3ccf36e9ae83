"""A quorum of independent Redis masters (the Redlock algorithm), as a backend.

``rlocks.Quorum(clients)`` is passed as ``client=`` to an ``RLock`` or ``RWLock``. Each of
the N masters (N odd, at least 3, no replication between them) keeps its own copy of the
primitive, changed by the primitive's own scripts. A hold exists only while a *majority*
(N // 2 + 1) of the masters have it:

- an acquire runs on every master at once (a thread per master; the asyncio twins
  gather), and is granted only when a majority granted it and ``ttl - elapsed - drift``
  is still positive (the validity window; :func:`drift_allowance`); otherwise what the
  minority granted is given back at once and the caller tries again;
- re-entry, renewal, ``extend`` and release go to every master; a hold is lost when fewer
  than a majority still have it;
- nothing is queued on a master (``queues = False``): with one queue per master the heads
  could differ. Waiters re-try with a growing pause (up to 0.2 s), so quorum waiters are
  not served first come, first served.

Clock assumption: like every Redlock, each master's clock must advance at about the rate
of the client's monotonic clock, and a lease must end no earlier on a master than
``ttl - drift`` after it was set. A holder paused past the validity window is not
detected (no lock service can detect it without fencing): see docs/operations.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar, Union

from .clients import is_cluster, pool_of
from .clock import monotonic
from .scripts import GRANTED, LOST, WAIT, Call, Reply, arun_many, run_many
from .steps import refused, transient

__all__ = ["DRIFT_FACTOR", "Quorum", "drift_allowance"]

T = TypeVar("T")

log = logging.getLogger(__name__)

DRIFT_FACTOR = 0.01  # share of the lease allowed for clock drift between the masters
DRIFT_FIXED = 0.002  # s added to it (Redis' own expiry resolution is 1 ms)


def drift_allowance(ttl: float) -> float:
    """The clock-drift allowance (s) of a lease of ``ttl`` s: 1 % of it plus 2 ms."""
    return ttl * DRIFT_FACTOR + DRIFT_FIXED


def _address(client: Any) -> Optional[Tuple[Any, ...]]:
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return None
    if kwargs.get("path"):
        return (kwargs["path"], kwargs.get("db", 0))
    return (kwargs.get("host"), kwargs.get("port"), kwargs.get("db", 0))


def _is_async(client: Any) -> bool:
    return type(client).__module__.startswith("redis.asyncio")


Result = Union[Reply, BaseException]


def _results(futures: Sequence[Any]) -> List[Any]:
    out: List[Any] = []
    for future in futures:
        error = future.exception()
        out.append(future.result() if error is None else error)
    return out


class Quorum:
    """Independent Redis masters that hold a lock together: a majority decides.

    ``Quorum(clients)``: a sequence of an odd number (3, 5, ...) of ``redis.Redis``
    clients, or of ``redis.asyncio.Redis`` clients (for the ``rlocks.asyncio`` twins),
    each for a different master. Pass it as ``client=`` to ``rlocks.RLock`` or
    ``rlocks.RWLock``. Every process using a name must pass the same masters, in the same
    order (fencing tokens are per master, by position).

    Raises TypeError for something that is not such a sequence of clients (a string, a
    cluster client, sync and asyncio clients mixed) and ValueError for fewer than 3
    clients, an even number, or two clients of the same pool or address. No I/O.
    """

    __slots__ = ("_masters", "_majority", "aio", "_executor", "_pid", "_mutex", "address",
                 "renewer", "async_renewers", "__weakref__")

    queues = False

    def __init__(self, clients: Sequence[Any]) -> None:
        if isinstance(clients, (str, bytes)) or not isinstance(clients, (list, tuple)):
            raise TypeError("rlocks.Quorum: clients must be a list or tuple of redis clients, "
                            f"not {type(clients).__name__}")
        masters = tuple(clients)
        for client in masters:
            if not callable(getattr(client, "evalsha", None)):
                raise TypeError("rlocks.Quorum: every client must be a redis.Redis or "
                                f"redis.asyncio.Redis, not {type(client).__name__}")
            if is_cluster(client) or type(client).__name__ == "RedisCluster":
                raise TypeError("rlocks.Quorum: a Redis Cluster client is not one master; "
                                "pass one redis.Redis per independent master")
        kinds = {_is_async(client) for client in masters}
        if len(kinds) > 1:
            raise TypeError("rlocks.Quorum: clients mix redis.Redis and redis.asyncio.Redis; "
                            "use one kind (asyncio clients for rlocks.asyncio primitives)")
        if len(masters) < 3 or len(masters) % 2 == 0:
            raise ValueError(
                f"rlocks.Quorum: needs an odd number of masters, at least 3, not "
                f"{len(masters)} (an even number tolerates no more failures than one "
                "fewer, and a majority of fewer than 3 survives no failure)")
        pools = [id(pool_of(client)) for client in masters]
        addresses = [a for a in (_address(client) for client in masters) if a is not None]
        if len(set(pools)) != len(pools) or len(set(addresses)) != len(addresses):
            raise ValueError("rlocks.Quorum: two clients are for the same master (same pool "
                             "or address); a quorum needs independent masters")
        self._masters: Tuple[Any, ...] = masters
        self._majority = len(masters) // 2 + 1
        self.aio = kinds == {True}
        self.address = ("quorum", tuple(_address(c) or id(c) for c in masters))
        self._executor: Optional[ThreadPoolExecutor] = None
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        #: Its renewer thread, and renewer task per event loop (``renewal.renewer_for``).
        self.renewer: Any = None
        self.async_renewers: "weakref.WeakKeyDictionary[Any, Any]" = (
            weakref.WeakKeyDictionary())

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
        return self.aio

    def __repr__(self) -> str:
        return f"<rlocks.Quorum of {len(self._masters)} masters, majority {self._majority}>"

    # -- fan-out ---------------------------------------------------------------------------

    def _map(self, fn: Callable[[Any], T], masters: Optional[Sequence[Any]] = None,
             abandoned: Optional[Callable[[List[Any]], None]] = None) -> List[T | BaseException]:
        chosen = self._masters if masters is None else tuple(masters)
        pid = os.getpid()
        with self._mutex:
            if self._executor is None or self._pid != pid:
                self._executor = ThreadPoolExecutor(max_workers=4 * len(self._masters),
                                                    thread_name_prefix="rlocks-quorum")
                self._pid = pid
            executor = self._executor
        futures = [executor.submit(fn, master) for master in chosen]
        try:
            wait_all(futures)
        except BaseException:
            # An interrupt (a signal handler's exception): it propagates, and what the
            # calls sent already do is handed to ``abandoned`` once they are done.
            if abandoned is not None:
                executor.submit(lambda: (wait_all(futures), abandoned(_results(futures))))
            raise
        return _results(futures)

    async def _amap(self, fn: Callable[[Any], Any], masters: Optional[Sequence[Any]] = None
                    ) -> List[Any]:
        chosen = self._masters if masters is None else tuple(masters)
        return list(await asyncio.gather(*(fn(m) for m in chosen), return_exceptions=True))

    # -- combining answers -----------------------------------------------------------------

    def _combine(self, call: Call, results: Sequence[Result],
                 since: float) -> Tuple[Reply, List[Any]]:
        """The majority's answer to ``call``, and the masters whose grant must be given
        back (an acquire granted by a minority, or outside its validity window)."""
        replies = [r for r in results if isinstance(r, Reply)]
        granted = [m for m, r in zip(self._masters, results) if isinstance(r, Reply) and r.ok]
        undo = getattr(call, "undo", None)
        if undo is not None:  # an acquire
            ttl = call.ttl_ms / 1000.0
            valid = ttl - (monotonic() - since) - drift_allowance(ttl)
            if len(granted) >= self._majority and valid > 0:
                best = max((r for r in replies if r.ok), key=lambda r: r.a)
                tokens = tuple(r.b if isinstance(r, Reply) and r.ok else None for r in results)
                return best._replace(tokens=tokens), []
            if sum(1 for r in replies if r.status == LOST) >= self._majority:
                return Reply(LOST), granted
            if len(replies) < self._majority:
                self._raise(results)
            return Reply(WAIT, 1), granted
        ok = [r for r in replies if r.ok]
        if len(ok) >= self._majority:
            return ok[0], []
        lost = sum(1 for r in replies if r.status == LOST)
        if lost >= self._majority:  # more than a minority say it is gone
            return Reply(LOST), []
        minority = len(self._masters) - self._majority
        unreached = len(results) - len(replies)
        if call.script.name.split("[")[0].endswith("_release") and unreached <= minority \
                and lost <= minority:
            # The reachable majority is free; the unreached keep their copy until its
            # lease ends, and nobody waits for them.
            log.warning("%s released on %d of %d masters; %d unreachable keep it until its "
                        "lease ends", call.keys[0], len(ok), len(results), unreached)
            return Reply(GRANTED, 0), []
        self._raise(results)
        return Reply(LOST), []  # pragma: no cover - _raise raises

    def _raise(self, results: Sequence[Result]) -> None:
        errors = [r for r in results if isinstance(r, BaseException)]
        error = next((e for e in errors if transient(e)), errors[0])
        if len(errors) < len(results) or not all(refused(e) for e in errors):
            error._rlocks_ran = True  # type: ignore[attr-defined]  # a master may have run it
        raise error

    # -- the backend's operations (see backends.py) ----------------------------------------

    def run(self, call: Call) -> Reply:
        since = monotonic()
        give_back = call.undo

        def undo_on(masters: Sequence[Any]) -> None:
            if give_back is not None and masters:
                self._map(lambda m: give_back(m), masters)

        def abandoned(results: List[Any]) -> None:
            # An interrupted acquire: what the masters granted goes back once they answer.
            undo_on([m for m, r in zip(self._masters, results)
                     if isinstance(r, Reply) and r.ok])

        reply, undo = self._combine(call, self._map(lambda m: call(m), abandoned=abandoned),
                                    since)
        undo_on(undo)
        return reply

    async def arun(self, call: Call) -> Reply:
        since = monotonic()
        reply, undo = self._combine(call, await self._amap(call.arun), since)
        if undo and call.undo is not None:
            await self._amap(call.undo.arun, undo)
        return reply

    def run_many(self, calls: Sequence[Call]) -> List[Result]:
        per = self._map(lambda m: run_many(m, calls))
        return self._per_call(calls, per)

    async def arun_many(self, calls: Sequence[Call]) -> List[Result]:
        per = await self._amap(lambda m: arun_many(m, calls))
        return self._per_call(calls, per)

    def _per_call(self, calls: Sequence[Call], per: Sequence[Any]) -> List[Result]:
        out: List[Result] = []
        for i, call in enumerate(calls):
            results = [r if isinstance(r, BaseException) else r[i] for r in per]
            try:
                out.append(self._combine(call, results, monotonic())[0])
            except BaseException as exc:  # noqa: BLE001 - this call's answer: no majority
                out.append(exc)
        return out

    def read(self, args: Sequence[Any]) -> Any:
        return self._agreed(self._map(lambda m: m.execute_command(*args)))

    async def aread(self, args: Sequence[Any]) -> Any:
        return self._agreed(await self._amap(lambda m: m.execute_command(*args)))

    def _agreed(self, results: Sequence[Any]) -> Any:
        """The largest answer a majority reaches (a minority's copy of a hold is none);
        the first error when too few masters answered."""
        answers = [r for r in results if not isinstance(r, BaseException)]
        if len(answers) < self._majority:
            raise next(r for r in results if isinstance(r, BaseException))
        try:
            return sorted(answers, reverse=True)[self._majority - 1]
        except TypeError:
            return answers[0]

    def gate(self, key: str) -> Any:
        return None  # its calls fan out to every master at once: nothing to bound

    def enlist(self, channel: str, key: str, owner: str, seconds: float) -> Any:
        raise NotImplementedError("a Quorum queues nobody")  # pragma: no cover

    async def aenlist(self, channel: str, key: str, owner: str, seconds: float) -> Any:
        raise NotImplementedError("a Quorum queues nobody")  # pragma: no cover
