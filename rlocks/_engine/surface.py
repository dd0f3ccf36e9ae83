"""The public surfaces over the dialogues: ``threading``'s, and asyncio's.

- :class:`LockSurface`: ``threading.RLock``'s surface (RLock, RWLock sides): acquire,
  release, ``with``, the ``threading.Condition`` protocol, plus ``owned``, ``token``,
  ``tokens`` and ``extend``;
- :class:`AsyncLockSurface`: the same for asyncio (awaited I/O, the task as owner);
- :class:`PermitSurface` / :class:`AsyncPermitSurface`: ``threading.Semaphore``'s.

Each method checks its arguments (no I/O before that), then runs one dialogue of
:mod:`.dialogues` with :func:`~.steps.drive` or :func:`~.steps.adrive`.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import logging
import os
import threading
import weakref
from typing import Any, Dict, Optional, Tuple

import redis

from ..errors import LockLostError, RLocksError
from . import checks, dialogues, holds, identity, metrics
from .backends import Server, address_of, backend_for
from .clients import CONNECT_TIMEOUT, DEFAULT_URL, SOCKET_TIMEOUT
from .constructors import public_method
from .guard import Guard
from .holds import Hold
from .primitive import Primitive
from .steps import adrive, drive

__all__ = ["AsyncLockSurface", "AsyncPermitSurface", "AsyncPrimitive", "LockSurface",
           "PermitSurface", "LoopDefault"]

log = logging.getLogger(__name__)


def _reported(p: Any, exc: Optional[BaseException]) -> bool:
    """For ``__exit__``: an inner block already raised this primitive's loss, so drop one
    level without raising the same news again (True)."""
    reported = isinstance(exc, LockLostError) and getattr(exc, "lock", None) is p
    if reported:
        owner = p._owner()
        if p._levels(owner) > 0:
            hold = p._hold(owner)
            hold.count -= 1
            p._gave(owner)
        return True
    return False


def _repair(p: Any, before: "dialogues.Books", exc: BaseException, acquiring: bool) -> None:
    """After ``exc`` escaped an acquire or release of ``p``: if it came from outside rlocks
    and Redis (a signal handler's: Ctrl-C, an alarm), make Redis and the books agree
    (``dialogues.repair``). ``before``: the books before it started. The callers catch
    in their own frame, so an exception as a callee returns is caught too."""
    if not isinstance(exc, _DELIBERATE):
        drive(dialogues.repair(p, before, acquiring))


#: What the dialogues raise on purpose, with the books and Redis agreeing already.
_DELIBERATE = (redis.RedisError, RLocksError, ValueError, RuntimeError)


class _Views(Primitive):
    """What an owner learns of its own hold without I/O (both surfaces)."""

    __slots__ = ()

    def timeout(self, seconds: float) -> "Timed":
        """``with lock.timeout(5):`` (``async with`` for the asyncio twins): acquire
        waiting at most ``seconds``, or raise TimeoutError naming the primitive; the
        ``with`` releases as usual."""
        return Timed(self, seconds)

    def owned(self) -> bool:
        """Whether the owner (the calling thread; the running task in ``rlocks.asyncio``)
        holds the lock, as far as this process knows (no I/O, not a coroutine): False
        once the hold is known lost (``release()`` is still owed and raises
        LockLostError)."""
        return self._owned(self._owner())

    def check(self) -> None:
        """Raise :class:`~rlocks.errors.LockLostError` if the owner's hold is known lost
        (its renewal or another grant of this process found it gone), else return (no
        I/O, not a coroutine: cheap enough to call between steps of long work).
        NotOwnedError if the owner holds nothing. A hold lost and not found yet passes:
        this process learns of a loss within a renewal period (a third of the ``ttl``)."""
        hold = self._current()
        if hold is None:
            raise self._not_owned("check")
        if hold.state == holds.LOST:
            raise self._lost_error(hold)

    def _current(self) -> Optional[Hold]:
        taken = self._mine.get(self._owner())
        if taken is not None:
            return taken[0]
        hold = self._hold(self._owner())
        return hold if hold.count > 0 else None

    def _is_owned(self) -> bool:
        """Whether the owner holds levels through this object (no I/O)."""
        return self._levels(self._owner()) > 0

    def _recursion_count(self) -> int:
        """How many levels the owner holds through this object (no I/O)."""
        return self._levels(self._owner())

    def __repr__(self) -> str:
        owners = [(o, n) for o, (_, n) in self._mine.items()]
        if len(owners) == 1:
            state = f"held owner={owners[0][0]!r} count={owners[0][1]}"
        elif owners:
            state = f"held here by {len(owners)} owners"
        else:
            state = "not held here"
        return (f"<{self._label} name={self._shown} namespace={self._namespace!r} "
                f"{state} at {id(self):#x}>")


class _Tokens(_Views):
    """The fencing tokens of a lock's hold (locks and RWLock sides; semaphores have none)."""

    __slots__ = ()

    @property
    def token(self) -> Optional[int]:
        """The fencing token of the owner's current hold, or None when it holds nothing
        (no I/O). Every fresh grant of this lock (this side) gets a larger token than
        every earlier grant, in any process; re-entry keeps it. Raises RLocksError on a
        :class:`rlocks.Quorum` (its masters count independently): use :attr:`tokens`."""
        if not self._backend.queues:
            raise RLocksError(
                f"{self._label}({self._shown}): a Quorum's masters count tokens "
                "independently, so no one token orders its grants: use .tokens",
                name=self._name)
        hold = self._current()
        return None if hold is None else hold.token

    @property
    def tokens(self) -> Optional[Tuple[Optional[int], ...]]:
        """The fencing tokens of the owner's current hold, one per master of a Quorum (None
        for a master that did not grant it), ``(token,)`` on one server; None when it
        holds nothing (no I/O)."""
        hold = self._current()
        return None if hold is None else hold.tokens


class _Blocking(_Views):
    """The acquire of the blocking driver (both threading surfaces)."""

    __slots__ = ()

    @metrics.measure_acquire
    def _acquire(self, owner: str, count: int, wait: Optional[float]) -> bool:
        before = dialogues.books(self, [owner])
        try:
            return bool(drive(dialogues.acquire(self, owner, wait)))
        except BaseException as exc:
            _repair(self, before, exc, True)
            raise


    @property
    def lost(self) -> threading.Event:
        """A ``threading.Event`` set as soon as this process finds the calling thread's
        current hold lost (set already if it is); a worker thread may poll ``is_set()``
        or ``wait()`` on it. The same event until the next fresh grant. NotOwnedError if
        the thread holds nothing (no I/O)."""
        hold = self._current()
        if hold is None:
            raise self._not_owned("watch")
        return hold.lost_event()


class LockSurface(_Blocking, _Tokens):
    """``threading.RLock``'s surface, for RLock and the RWLock sides."""

    __slots__ = ()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Acquire the lock, or re-enter it if the calling thread holds it already.

        Blocks while the lock is unavailable when ``blocking`` is true, for at most
        ``timeout`` seconds unless it is -1 (forever). Returns True once held, False if it
        could not be had in time. Raises what ``threading.RLock.acquire`` raises for bad
        arguments, before any I/O; LockLostError if this thread's hold was lost and is
        not released yet; a redis-py error only when Redis stayed unreachable until the
        deadline (the call is sent again meanwhile: it is safe to).
        """
        wait = checks.lock_wait(blocking, timeout, self._label, self._name)
        return self._acquire(self._owner(), 1, wait)

    acquire = public_method(acquire)
    __enter__ = acquire

    def release(self) -> None:
        """Release one level of the calling thread's hold; at the last, free the lock.

        Raises RuntimeError (:class:`~rlocks.errors.NotOwnedError`) if the calling thread
        holds no level through this object, without I/O; LockLostError if the hold had
        ended in Redis (whoever holds it now is not touched); the level is dropped either
        way.
        """
        owner = self._owner()
        before = dialogues.books(self, [owner])
        try:
            drive(dialogues.release(self, owner))
        except BaseException as exc:
            _repair(self, before, exc, False)
            raise

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        if _reported(self, exc):
            return
        self.release()

    def extend(self, ttl: Optional[float] = None) -> None:
        """Make the calling thread's hold last at least ``ttl`` seconds from now (default:
        the lock's ``ttl``); never shortens it. One round trip. NotOwnedError if it holds
        nothing, LockLostError if its hold is gone."""
        ms = self._ttl_ms if ttl is None else checks.check_ttl(ttl, self._label, self._name)
        drive(dialogues.extend(self, self._owner(), ms))

    # -- threading.Condition protocol ------------------------------------------------------

    def _release_save(self) -> Tuple[int, str, int]:
        """Release every level the calling thread took through this object (and a
        writer's read side); return what :meth:`_acquire_restore` takes back."""
        return drive(dialogues.release_save(self, self._owner()))  # type: ignore[no-any-return]

    def _acquire_restore(self, state: Tuple[int, str, int]) -> None:
        """Take back, blocking, the levels :meth:`_release_save` gave up."""
        drive(dialogues.acquire_restore(self, self._owner(), state))

    def _held_with(self) -> Any:
        """Another lock given up and taken back with this one by a Condition (a write
        side names its read side)."""
        return None


# -- asyncio -----------------------------------------------------------------------------------

_loop_clients: "weakref.WeakKeyDictionary[Any, Dict[str, Any]]" = weakref.WeakKeyDictionary()


async def aclose() -> None:
    """Close the clients rlocks opened on the running event loop for primitives made with
    ``client=None`` (one per ``RLOCKS_URL``), as ``await client.aclose()`` closes a client
    of your own. Call it before the loop ends (at the end of the coroutine given to
    ``asyncio.run``), once its primitives are released; a primitive used after it opens
    a new client. Primitives given a client of yours open nothing of their own: closing
    that client closes all."""
    clients = _loop_clients.pop(asyncio.get_running_loop(), {})
    for client in clients.values():
        await client.aclose()


def default_async_client() -> Any:
    """The shared ``redis.asyncio`` client for ``RLOCKS_URL`` on the running loop (its
    connections belong to that loop)."""
    url = os.environ.get("RLOCKS_URL") or DEFAULT_URL
    per_loop = _loop_clients.setdefault(asyncio.get_running_loop(), {})
    client = per_loop.get(url)
    if client is None:
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        try:
            client = per_loop[url] = redis.asyncio.Redis.from_url(
                url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=CONNECT_TIMEOUT,
                retry=Retry(NoBackoff(), 0))
        except ValueError as exc:
            raise ValueError(f"RLOCKS_URL={url!r} is not a Redis URL: {exc}") from None
    return client


class LoopDefault:
    """The backend of an asyncio primitive made with ``client=None``: each event loop's
    own default client (``RLOCKS_URL``)."""

    queues = True
    aio = True

    def __init__(self) -> None:
        self.url = os.environ.get("RLOCKS_URL") or DEFAULT_URL
        self.address = address_of(redis.asyncio.Redis.from_url(self.url))
        self._servers: "weakref.WeakKeyDictionary[Any, Server]" = weakref.WeakKeyDictionary()

    def server(self) -> Server:
        loop = asyncio.get_running_loop()
        found = self._servers.get(loop)
        client = default_async_client()
        if found is None or found.client is not client:  # (a new one after aclose())
            found = self._servers[loop] = backend_for(client)
        return found

    async def arun(self, call: Any) -> Any:
        return await self.server().arun(call)

    async def arun_many(self, calls: Any) -> Any:
        return await self.server().arun_many(calls)

    async def aread(self, args: Any) -> Any:
        return await self.server().aread(args)

    async def aenlist(self, channel: str, key: str, owner: str, seconds: float) -> Any:
        return await self.server().aenlist(channel, key, owner, seconds)

    def gate(self, key: str) -> Any:
        return self.server().gate(key)

    renewer = None  # (asyncio only: the loop's server has its renewer tasks)

    @property
    def async_renewers(self) -> Any:
        return self.server().async_renewers


class AsyncPrimitive(_Views):
    """What makes a primitive an asyncio one: the task owns; I/O is awaited."""

    __slots__ = ()

    _aio = True

    def __enter__(self) -> None:
        raise TypeError(f"{self._label} is for asyncio: use 'async with', not 'with'")

    def __exit__(self, *exc: Any) -> None:  # pragma: no cover - __enter__ refuses
        raise TypeError(f"{self._label} is for asyncio: use 'async with', not 'with'")

    @staticmethod
    def _owner() -> str:
        return identity.task_owner()

    def guard(self, timeout: Optional[float] = None) -> Guard:
        """``async with lock.guard():`` acquires (waiting at most ``timeout`` s, or raising
        TimeoutError), runs the body, and releases; if this process finds the hold lost
        meanwhile, the task running the body is cancelled at once and the ``async with``
        raises :class:`~rlocks.errors.LockLostError` instead (see :mod:`rlocks._engine.guard`).
        A new guard for each ``async with``."""
        return Guard(self, timeout)

    def _default_client(self) -> Any:
        return None

    @metrics.measure_async_acquire
    async def _aacquire(self, owner: str, count: int, wait: Optional[float]) -> bool:
        return bool(await adrive(dialogues.acquire(self, owner, wait)))

    def _configure(self, name: str, options: Any, kind: str, spec: Any) -> None:
        super()._configure(name, options, kind, spec)
        if self._client is None:
            self._backend = LoopDefault()

    @property
    def client(self) -> Any:
        if self._client is None:
            return self._backend.server().client
        return self._client

    def _hold_lost(self, hold: Hold) -> None:
        on_lost = self._on_lost
        if on_lost is not None and inspect.iscoroutinefunction(on_lost):
            what = f"on_lost of {self._describe()}"
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                log.error("%s not run: no running event loop", what)
                return
            task = loop.create_task(on_lost(self))

            def done(t: "asyncio.Task[Any]") -> None:
                if not t.cancelled() and t.exception() is not None:
                    log.error("%s raised", what, exc_info=t.exception())

            task.add_done_callback(done)
            return
        super()._hold_lost(hold)


class AsyncLockSurface(AsyncPrimitive, _Tokens):
    """``asyncio``'s lock surface over the same dialogues, owned by the task."""

    __slots__ = ()

    async def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Acquire (or re-enter) for the running task; ``timeout=None`` (or -1) waits for
        ever. Same results and errors as :meth:`rlocks.RLock.acquire`; a task cancelled
        while it acquires leaves nothing held."""
        if timeout is None:
            timeout = -1
        wait = checks.lock_wait(blocking, timeout, self._label, self._name)
        return await self._aacquire(self._owner(), 1, wait)

    acquire = public_method(acquire)

    async def release(self) -> None:
        """Release one level of the running task's hold (errors as
        :meth:`rlocks.RLock.release`); the round trip runs on if the task is cancelled."""
        await adrive(dialogues.release(self, self._owner()))

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        if _reported(self, exc):
            return
        await self.release()

    async def extend(self, ttl: Optional[float] = None) -> None:
        """As :meth:`rlocks.RLock.extend`, awaited."""
        ms = self._ttl_ms if ttl is None else checks.check_ttl(ttl, self._label, self._name)
        await adrive(dialogues.extend(self, self._owner(), ms))

    async def _release_save(self) -> Tuple[int, str, int]:
        return await adrive(dialogues.release_save(self, self._owner()))  # type: ignore[no-any-return]

    async def _acquire_restore(self, state: Tuple[int, str, int]) -> None:
        await adrive(dialogues.acquire_restore(self, self._owner(), state))

    def _held_with(self) -> Any:
        return None


# -- semaphores --------------------------------------------------------------------------------


def _release_count(n: object, label: str, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{label}({checks.shown(name)}): n must be an int, not {type(n).__name__}")
    if n < 1:
        raise ValueError(f"{label}({checks.shown(name)}): n must be one or more")
    return n


class PermitSurface(_Blocking):
    """``threading.Semaphore``'s surface."""

    __slots__ = ()

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take one permit for the calling thread, waiting while none is free (for ever
        with ``timeout=None``, at most ``timeout`` s, not at all with ``blocking=False``).
        Returns whether it took one. Raises what ``threading.Semaphore.acquire`` raises
        for bad arguments; LockLostError if this thread's permits were lost and are not
        all released (a permit this grant took is given back); ValueError if Redis holds
        the name as a semaphore of another value or kind."""
        wait = checks.semaphore_wait(blocking, timeout, self._label, self._name)
        return self._acquire(self._owner(), 1, wait)

    acquire = public_method(acquire)
    __enter__ = acquire

    def release(self, n: int = 1) -> None:
        """Give ``n`` permits back: the calling thread's taken through this object first,
        then other threads' of this process taken through it; the rest are a release of
        nobody's permit (a Semaphore's value grows; a BoundedSemaphore raises ValueError
        and changes nothing). LockLostError if the thread's own permits were lost."""
        n = _release_count(n, self._label, self._name)
        owner = self._owner()
        before = dialogues.books(self, [owner] + [o for o in self._mine if o != owner])
        try:
            drive(dialogues.release_permits(self, owner, n))
        except BaseException as exc:
            _repair(self, before, exc, False)
            raise

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def extend(self, ttl: Optional[float] = None) -> None:
        """Make the calling thread's permits last at least ``ttl`` s (default: ``ttl``)."""
        ms = self._ttl_ms if ttl is None else checks.check_ttl(ttl, self._label, self._name)
        drive(dialogues.extend(self, self._owner(), ms))


class AsyncPermitSurface(AsyncPrimitive):
    """``asyncio.Semaphore``'s surface over the same dialogues, owned by the task."""

    __slots__ = ()

    async def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """As :meth:`rlocks.Semaphore.acquire`, awaited."""
        wait = checks.semaphore_wait(blocking, timeout, self._label, self._name)
        return await self._aacquire(self._owner(), 1, wait)

    acquire = public_method(acquire)

    async def release(self, n: int = 1) -> None:
        n = _release_count(n, self._label, self._name)
        await adrive(dialogues.release_permits(self, self._owner(), n))

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: Any) -> None:
        await self.release()

    async def extend(self, ttl: Optional[float] = None) -> None:
        ms = self._ttl_ms if ttl is None else checks.check_ttl(ttl, self._label, self._name)
        await adrive(dialogues.extend(self, self._owner(), ms))



class Timed:
    """What ``lock.timeout(seconds)`` returns: a ``with`` (``async with`` for the asyncio
    twins) that acquires waiting at most ``seconds`` or raises TimeoutError.

    Why this shape: ``threading`` has no timed ``with``, and ``with lock:`` must keep
    waiting as threading's does; a method of the primitive reads as what it is (its
    ``timeout`` is how long acquire waits, as everywhere in rlocks) and works the same
    for every primitive, either surface."""

    __slots__ = ("_prim", "_seconds")

    def __init__(self, prim: Any, seconds: float) -> None:
        checks.lock_wait(True, seconds, prim._label, prim._name)  # TypeError / ValueError now
        self._prim, self._seconds = prim, seconds

    def _expired(self) -> TimeoutError:
        return TimeoutError(f"{self._prim._describe()} was not acquired within "
                            f"{self._seconds} s")

    def __enter__(self) -> Any:
        if not self._prim.acquire(timeout=self._seconds):
            raise self._expired()
        return self._prim

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        self._prim.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> Any:
        if not await self._prim.acquire(timeout=self._seconds):
            raise self._expired()
        return self._prim

    async def __aexit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        await self._prim.__aexit__(exc_type, exc, tb)


def _release_at_exit() -> None:
    """A process that exits normally gives back what its threads hold, so the next run
    of the program does not wait out a lease. Not for ``os._exit``, a killing signal, a
    fork child (it gives back only its own) or asyncio holds (their loop is gone): those
    end with their leases. Each release is sent once (no waiting for a server that does
    not answer: its lease ends the hold)."""
    dialogues.RELEASE_PATIENCE = 0.0
    mine = identity.process_token() + ":"
    for hold in holds.live():
        if not hold.owner.startswith(mine):
            continue
        for obj in list(hold.objects):
            if obj._aio:
                continue
            levels = obj._levels(hold.owner)
            try:
                if obj._spec.kind == "sem":
                    drive(dialogues.release_permits(obj, hold.owner, levels))
                else:
                    for _ in range(levels):
                        drive(dialogues.release(obj, hold.owner))
            except Exception:  # noqa: BLE001 - at exit: its lease ends it
                pass


atexit.register(_release_at_exit)
