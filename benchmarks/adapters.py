"""One small interface over every lock library the suite compares.

Each library is wrapped in an :class:`Adapter` that knows how to build a lock on a given
redis-py client and how to take it with a *bounded* wait.  Apart from that bound, locks are
built with the library's own defaults (named in :attr:`Adapter.defaults` and printed with
the results), because "what you get out of the box" is what the comparison is about.

A library that cannot be imported, or does not work with the installed redis-py, is kept in
the registry and reported as ``unavailable: <reason>``; it is never dropped silently.

Adapters are looked up by key (:func:`get_adapter`) so that spawned worker processes can
rebuild them from a picklable string.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
from typing import Any, Callable, Dict, List, Optional, Protocol, Type

import redis

# python-redis-lock logs a warning for every failed non-blocking attempt; that is noise here.
logging.getLogger("redis_lock").setLevel(logging.ERROR)
logging.getLogger("portalocker").setLevel(logging.ERROR)


class LockHandle(Protocol):
    """What the sections need from a lock object."""

    def acquire(self, timeout: float) -> bool:
        """Block until acquired (True) or ``timeout`` seconds passed (False)."""

    def release(self) -> None:
        """Release a lock this handle holds."""


class Adapter:
    """Base class: subclasses set the class attributes and implement :meth:`_make`."""

    key: str = ""
    #: distribution name on PyPI, for the version shown in the output
    dist: str = ""
    #: the library defaults that matter for latency, named in the output
    defaults: str = ""
    #: True when one lock object may be shared by all threads of a process (threading.RLock
    #: style).  Otherwise every thread builds its own object on the shared client.
    share_across_threads: bool = False
    #: True when the same thread can take the lock again while holding it.
    reentrant: bool = False

    def __init__(self) -> None:
        self._reason: Optional[str] = None
        self._checked = False

    # -- availability -------------------------------------------------------------------
    def _probe(self) -> None:
        """Import the library; raise with a readable message if it cannot be used."""

    def unavailable_reason(self) -> Optional[str]:
        """``None`` if usable, else why not (cached)."""
        if not self._checked:
            self._checked = True
            try:
                self._probe()
            except Exception as exc:  # any failure here means "cannot benchmark it"
                self._reason = f"{type(exc).__name__}: {exc}".strip()
        return self._reason

    def version(self) -> str:
        try:
            from importlib.metadata import version

            return version(self.dist)
        except Exception:
            return "?"

    # -- locks --------------------------------------------------------------------------
    def make(self, client: redis.Redis, name: str) -> LockHandle:
        """A lock called ``name`` on ``client``, with the library's defaults."""
        return self._make(client, name)

    def _make(self, client: redis.Redis, name: str) -> LockHandle:
        raise NotImplementedError

    def make_for_many(self, client: redis.Redis, name: str, ttl: Optional[float]) -> LockHandle:
        """Like :meth:`make`; ``ttl`` lets the many-locks section shorten a renewal period so
        that renewal shows up within its measuring window (only rlocks renews by default)."""
        return self._make(client, name)


# ---------------------------------------------------------------------------------------
# rlocks
# ---------------------------------------------------------------------------------------
class _RLocksHandle:
    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def acquire(self, timeout: float) -> bool:
        return bool(self.lock.acquire(blocking=True, timeout=timeout))

    def release(self) -> None:
        self.lock.release()


class RLocksAdapter(Adapter):
    key = "rlocks"
    dist = "rlocks"
    defaults = "RLock(ttl=30.0, auto_renew=True, namespace='rlocks')"
    share_across_threads = True
    reentrant = True

    def _probe(self) -> None:
        mod = importlib.import_module("rlocks")
        if not hasattr(mod, "RLock"):
            raise ImportError("rlocks.RLock is not there yet (rlocks/rlock.py not landed)")

    def version(self) -> str:
        try:
            return str(importlib.import_module("rlocks").__version__)
        except Exception:
            return "dev"

    def _make(self, client: redis.Redis, name: str) -> LockHandle:
        import rlocks

        return _RLocksHandle(rlocks.RLock(name, client=client))

    def make_for_many(self, client: redis.Redis, name: str, ttl: Optional[float]) -> LockHandle:
        import rlocks

        if ttl is None:
            return _RLocksHandle(rlocks.RLock(name, client=client))
        return _RLocksHandle(rlocks.RLock(name, client=client, ttl=ttl))


class RLocksUnfairAdapter(RLocksAdapter):
    """rlocks with ``fair=False`` (a free lock goes to whoever asks first while a woken
    waiter's patience runs).  An ``rlocks.RLock`` without ``fair=`` is reported as
    unavailable, never left out."""

    key = "rlocks (fair=False)"
    defaults = "RLock(fair=False), other options at their defaults"
    reentrant = False  # measured in the contended section only

    def _probe(self) -> None:
        super()._probe()
        import inspect

        import rlocks

        if "fair" not in inspect.signature(rlocks.RLock).parameters:
            raise ImportError("rlocks.RLock has no fair=")

    def unavailable_reason(self) -> Optional[str]:
        reason = super().unavailable_reason()
        # the row reads "unavailable: rlocks.RLock has no fair=", no class name
        return reason.split(": ", 1)[-1] if reason else None

    def _make(self, client: redis.Redis, name: str) -> LockHandle:
        import rlocks

        return _RLocksHandle(rlocks.RLock(name, client=client, fair=False))


#: Where the runner tells every process (spawned workers inherit it) the URLs of the other
#: masters of the Quorum row, comma-separated; the run's own server is the first master.
QUORUM_ENV = "RLOCKS_BENCH_QUORUM_URLS"


class RLocksQuorumAdapter(RLocksAdapter):
    """rlocks on ``rlocks.Quorum`` of 3 local masters (issue 13: the Redlock algorithm): the
    run's server and two more throwaway ones the runner starts.  Measured in the
    uncontended and hand-off sections only."""

    key = "rlocks (Quorum, 3)"
    defaults = ("RLock(client=Quorum([run's server, 2 more local servers])): single tries on "
                "every master at once, waiters re-try after U(b/2, b), b 10 ms doubling to 0.2 s")
    reentrant = False  # the re-entrant row is the single-server one's

    def __init__(self) -> None:
        super().__init__()
        self._masters: Dict[str, redis.Redis] = {}  # per process: one client per master

    def _probe(self) -> None:
        super()._probe()
        if not hasattr(importlib.import_module("rlocks"), "Quorum"):
            raise ImportError("rlocks.Quorum is not there (issue 13)")
        if len(self._urls()) != 2:
            raise RuntimeError("needs 2 more local masters, started by the runner "
                               "(not when the server was given with --url and none started)")

    def unavailable_reason(self) -> Optional[str]:
        reason = super().unavailable_reason()
        return reason.split(": ", 1)[-1] if reason else None

    @staticmethod
    def _urls() -> List[str]:
        return [u for u in os.environ.get(QUORUM_ENV, "").split(",") if u]

    def _make(self, client: redis.Redis, name: str) -> LockHandle:
        import rlocks

        others = [self._masters.setdefault(u, redis.Redis.from_url(u, socket_timeout=10.0))
                  for u in self._urls()]
        return _RLocksHandle(rlocks.RLock(name, client=rlocks.Quorum([client, *others])))


# ---------------------------------------------------------------------------------------
# redis-py's own Lock
# ---------------------------------------------------------------------------------------
class _RedisPyHandle:
    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def acquire(self, timeout: float) -> bool:
        return bool(self.lock.acquire(blocking=True, blocking_timeout=timeout))

    def release(self) -> None:
        self.lock.release()


class RedisPyAdapter(Adapter):
    key = "redis-py"
    dist = "redis"
    defaults = "client.lock(name): timeout=None (no expiry), polls every sleep=0.1 s"

    def _make(self, client: redis.Redis, name: str) -> LockHandle:
        return _RedisPyHandle(client.lock(name))


# ---------------------------------------------------------------------------------------
# python-redis-lock
# ---------------------------------------------------------------------------------------
class _PRLHandle:
    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def acquire(self, timeout: float) -> bool:
        # It truncates the timeout with int(), and 0 means "wait forever": round up to >= 1 s.
        return bool(self.lock.acquire(blocking=True, timeout=max(1, math.ceil(timeout))))

    def release(self) -> None:
        self.lock.release()


class PythonRedisLockAdapter(Adapter):
    key = "python-redis-lock"
    dist = "python-redis-lock"
    defaults = "redis_lock.Lock(client, name): expire=None, auto_renewal=False, waits in BLPOP"

    def _probe(self) -> None:
        importlib.import_module("redis_lock")

    def _make(self, client: redis.Redis, name: str) -> LockHandle:
        import redis_lock

        return _PRLHandle(redis_lock.Lock(client, name))


# ---------------------------------------------------------------------------------------
# pottery Redlock (single master here: there is one server)
# ---------------------------------------------------------------------------------------
class _PotteryHandle:
    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def acquire(self, timeout: float) -> bool:
        return bool(self.lock.acquire(blocking=True, timeout=timeout))

    def release(self) -> None:
        self.lock.release()


class PotteryAdapter(Adapter):
    key = "pottery"
    dist = "pottery"
    defaults = "Redlock(key, masters={client}): auto_release_time=10 s, retry sleep U(0, 0.2 s)"

    def _probe(self) -> None:
        importlib.import_module("pottery")

    def _make(self, client: redis.Redis, name: str) -> LockHandle:
        import pottery

        return _PotteryHandle(pottery.Redlock(key=name, masters={client}))


# ---------------------------------------------------------------------------------------
# sherlock
# ---------------------------------------------------------------------------------------
class _SherlockHandle:
    def __init__(self, lock: Any, exc: Type[BaseException]) -> None:
        self.lock = lock
        self.exc = exc

    def acquire(self, timeout: float) -> bool:
        # sherlock's blocking acquire takes its bound from the lock's own ``timeout``
        # (default 10 s) and raises when it runs out.
        try:
            return bool(self.lock.acquire(blocking=True))
        except self.exc:
            return False

    def release(self) -> None:
        self.lock.release()


class SherlockAdapter(Adapter):
    key = "sherlock"
    dist = "sherlock"
    defaults = "RedisLock(name, client=c): expire=60 s, timeout=10 s, retry_interval=0.1 s"

    def _probe(self) -> None:
        importlib.import_module("sherlock")

    def _make(self, client: redis.Redis, name: str) -> LockHandle:
        import sherlock

        return _SherlockHandle(sherlock.RedisLock(name, client=client),
                               sherlock.LockTimeoutException)


# ---------------------------------------------------------------------------------------
# portalocker RedisLock (pub/sub based: one subscription connection per held lock)
# ---------------------------------------------------------------------------------------
class _PortalockerHandle:
    def __init__(self, lock: Any, exc: Type[BaseException]) -> None:
        self.lock = lock
        self.exc = exc

    def acquire(self, timeout: float) -> bool:
        try:
            self.lock.acquire(timeout=timeout)
            return True
        except self.exc:
            return False

    def release(self) -> None:
        self.lock.release()


class PortalockerAdapter(Adapter):
    key = "portalocker"
    dist = "portalocker"
    defaults = ("RedisLock(name, connection=c): timeout=5 s, check_interval=0.25 s, "
                "1 pub/sub connection + 1 thread per held lock")

    def _probe(self) -> None:
        importlib.import_module("portalocker.redis")

    def _make(self, client: redis.Redis, name: str) -> LockHandle:
        import portalocker
        from portalocker import exceptions

        return _PortalockerHandle(portalocker.RedisLock(name, connection=client),
                                  exceptions.LockException)


# ---------------------------------------------------------------------------------------
# Reference (not a library): a token passed through a Redis list.  acquire = BLPOP the
# token, release = LPUSH it back: the least a Redis hand-off between two redis-py processes
# can cost (one blocking pop answered by one push), with no scripts, leases or owners.
# ---------------------------------------------------------------------------------------
class _TokenHandle:
    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.name = name

    def acquire(self, timeout: float) -> bool:
        return self.client.blpop([self.name], timeout=max(timeout, 0.01)) is not None

    def release(self) -> None:
        self.client.lpush(self.name, "t")


class TokenReference(Adapter):
    key = "ref: BLPOP token"
    dist = "redis"
    defaults = "no library: acquire = BLPOP a token from a list, release = LPUSH it back"
    reference = True

    def prepare(self, client: redis.Redis, name: str) -> None:
        """Put the one token in the list before the workers start."""
        client.delete(name)
        client.lpush(name, "t")

    def _make(self, client: redis.Redis, name: str) -> LockHandle:
        return _TokenHandle(client, name)


_REFERENCES: List[Callable[[], Adapter]] = [TokenReference]
#: rlocks built with other options, measured where the issue asks for them
_VARIANTS: List[Callable[[], Adapter]] = [RLocksUnfairAdapter]
#: rlocks on a quorum of masters (uncontended and hand-off sections)
_QUORUM: List[Callable[[], Adapter]] = [RLocksQuorumAdapter]

_ADAPTERS: List[Callable[[], Adapter]] = [
    RLocksAdapter,
    RedisPyAdapter,
    PythonRedisLockAdapter,
    PotteryAdapter,
    SherlockAdapter,
    PortalockerAdapter,
]
_CACHE: Dict[str, Adapter] = {}


def all_adapters() -> List[Adapter]:
    """Every adapter, available or not, rlocks first."""
    for factory in _ADAPTERS:
        a = factory()
        _CACHE.setdefault(a.key, a)
    return [_CACHE[f().key] for f in _ADAPTERS]


def reference_adapters() -> List[Adapter]:
    """Baselines that are not lock libraries (shown as ``ref: ...`` rows)."""
    for factory in _REFERENCES:
        a = factory()
        _CACHE.setdefault(a.key, a)
    return [_CACHE[f().key] for f in _REFERENCES]


def variant_adapters() -> List[Adapter]:
    """rlocks with non-default options (``rlocks (fair=False)``)."""
    for factory in _VARIANTS:
        a = factory()
        _CACHE.setdefault(a.key, a)
    return [_CACHE[f().key] for f in _VARIANTS]


def quorum_adapters() -> List[Adapter]:
    """rlocks on a Quorum of 3 local masters (``rlocks (Quorum, 3)``)."""
    for factory in _QUORUM:
        a = factory()
        _CACHE.setdefault(a.key, a)
    return [_CACHE[f().key] for f in _QUORUM]


def get_adapter(key: str) -> Adapter:
    if key not in _CACHE:
        all_adapters()
        reference_adapters()
        variant_adapters()
        quorum_adapters()
    return _CACHE[key]


def make_client(url: str) -> redis.Redis:
    """A redis-py client on ``url``; every process builds its own (clients do not pickle)."""
    return redis.Redis.from_url(url)
