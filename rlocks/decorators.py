"""``@rlocks.synchronized``: run every call of a function under a named rlocks primitive.

For the nested-call use case: functions that call each other, each decorated with the
same name, run under one reentrant lock held by the calling thread, so the outer call's
hold covers the inner ones without deadlock, across every process that uses the name.

The primitive is made once per decorated function, on its first call, not at decoration:
importing a module that decorates functions reads no environment (``RLOCKS_URL``) and does
no I/O. Constructor options are checked against the primitive's signature at decoration,
and its values checked by building the primitive once (with an unconnected client when
none is given), so a misspelt option or a bad value fails at import, not at the first
call.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Callable, Dict, List, Optional, TypeVar, cast

from ._engine.checks import shown
from ._engine.constructors import keyword_hint, unexpected_keyword
from .rlock import RLock
from .rwlock import RWLock
from .semaphore import BoundedSemaphore, Semaphore

__all__ = ["limited", "synchronized"]

F = TypeVar("F", bound=Callable[..., Any])

_DECORATOR_HINTS = {
    "blocking_timeout": "how long a call waits is {decorator}(timeout=...)",
    "blocking": "a call always waits; {decorator}(timeout=...) bounds the wait",
}


def synchronized(
    name: str,
    *,
    kind: Callable[..., Any] = RLock,
    timeout: Optional[float] = None,
    **options: Any,
) -> Callable[[F], F]:
    """Decorate a function so that each call runs holding the primitive ``kind(name)``.

    ``kind`` is :class:`rlocks.RLock` (the default), :class:`rlocks.Semaphore` or
    :class:`rlocks.BoundedSemaphore` (or a subclass); ``options`` go to its constructor
    (``client``, ``ttl``, ``namespace``, ``value`` for a semaphore ...). One primitive is
    made per decorated function, lazily, and shared by every call from every thread, so
    methods share it across instances (the name is global anyway).

    A call blocks until the primitive is acquired: forever with ``timeout=None``, else at
    most ``timeout`` seconds, after which it raises ``TimeoutError`` (naming the
    primitive) without calling the function. The primitive is released when the function
    returns or raises; errors from ``acquire``/``release`` (``LockLostError``, Redis
    errors) propagate as they do from a ``with`` block.

    The wrapper keeps the function's metadata (``functools.wraps``) and has a
    ``get_lock()`` attribute that returns the primitive (making it if needed; no I/O).

    Raises at decoration, before any I/O: TypeError for an unsupported ``kind``, options
    its constructor does not take, or a coroutine, generator or async generator function
    (the hold would not cover what runs after the first suspension); the constructor's
    own TypeError or ValueError for a bad name or option value (``ttl=-1``).
    """
    return _decorator("synchronized", name, kind, timeout, options)


def _check_values(kind: Callable[..., Any], name: str, options: Dict[str, Any]) -> None:
    """The constructor's own checks of ``name`` and ``options`` (``ttl=-1``, a bad
    namespace...), at decoration: rlocks' own class under ``kind`` (``kind`` may be a
    subclass that counts or logs what it makes) is built once with them and dropped.
    Without a ``client`` option it gets an unconnected one, so nothing reads
    ``RLOCKS_URL`` and nothing is sent (building a primitive does no I/O)."""
    import redis

    base = next(c for c in cast(type, kind).__mro__
                if c in (RLock, Semaphore, BoundedSemaphore))
    accepted = inspect.signature(base).parameters
    given = {k: v for k, v in options.items() if k in accepted}
    probe = None
    if "client" not in given:
        probe = given["client"] = redis.Redis()  # never connected: a client to build with
    try:
        base(name, **given)
    finally:
        if probe is not None:
            probe.close()


def _decorator(
    decorator: str,
    name: str,
    kind: Callable[..., Any],
    timeout: Optional[float],
    options: Dict[str, Any],
) -> Callable[[F], F]:
    """Validate and build ``synchronized``/``limited``; ``decorator`` names the public
    call in every error, so a ``limited()`` mistake is reported as ``limited(...)``."""
    if isinstance(kind, type) and issubclass(kind, RWLock):
        raise TypeError(
            f"{decorator}(): an RWLock has two sides; use `with rwlock.read_lock:` or "
            "`with rwlock.write_lock:` instead"
        )
    if not (isinstance(kind, type) and issubclass(kind, (RLock, Semaphore))):
        raise TypeError(
            f"{decorator}(): kind must be rlocks.RLock, rlocks.Semaphore or "
            f"rlocks.BoundedSemaphore, not {kind!r}"
        )
    if "name" in options:
        raise TypeError(f"{decorator}(): the name is the first argument, not an option")
    try:
        inspect.signature(kind).bind(name, **options)
    except TypeError as exc:
        label = getattr(kind, "_label", kind.__name__)
        message = f"{decorator}({shown(name)}): {label} options: {exc}"
        keyword = unexpected_keyword(exc)
        # Here timeout= is the decorator's own (how long a call waits for the primitive).
        own = _DECORATOR_HINTS.get(keyword or "")
        hint = own.format(decorator=decorator) if own else keyword_hint(keyword or "")
        if hint is not None:
            message += f"; {hint}"
        raise TypeError(message) from None
    _check_values(kind, name, options)
    if timeout is not None and (isinstance(timeout, bool) or not timeout >= 0):
        raise ValueError(f"{decorator}({shown(name)}): timeout must be None or >= 0 seconds")
    acquire_kwargs = {} if timeout is None else {"timeout": timeout}

    def decorate(func: F) -> F:
        if not callable(func):
            raise TypeError(
                f"{decorator}({shown(name)}) decorates a function, not {type(func).__name__} "
                "(put @classmethod / @staticmethod above it)"
            )
        if (inspect.iscoroutinefunction(func) or inspect.isgeneratorfunction(func)
                or inspect.isasyncgenfunction(func)):
            raise TypeError(
                f"{decorator}({shown(name)}) cannot wrap {func.__qualname__}: its body runs "
                "after the call returns, outside the hold"
            )
        made: List[Any] = []  # the primitive, once made
        making = threading.Lock()  # guards only the construction, which does no I/O

        def get_lock() -> Any:
            if not made:
                with making:
                    if not made:
                        made.append(kind(name, **options))
            return made[0]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            lock = get_lock()
            if not lock.acquire(**acquire_kwargs):
                raise TimeoutError(
                    f"{func.__qualname__}: could not acquire {kind.__name__}({shown(name)}) "
                    f"within {timeout} s"
                )
            try:
                return func(*args, **kwargs)
            finally:
                lock.release()

        wrapper.get_lock = get_lock  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate


def limited(
    name: str, value: int, *, timeout: Optional[float] = None, **options: Any
) -> Callable[[F], F]:
    """At most ``value`` calls at once, across every process using ``name``.

    Shorthand for ``synchronized(name, kind=BoundedSemaphore, value=value, ...)``: each
    call holds one permit of the bounded semaphore ``name`` while it runs. Blocks and raises
    as ``synchronized`` does; its errors name ``limited(...)``.
    """
    return _decorator("limited", name, BoundedSemaphore, timeout, {"value": value, **options})
