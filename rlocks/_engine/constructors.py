"""Constructor argument errors that name the public class and the keyword meant.

A primitive's ``__init__`` is inherited from an engine class (``Primitive.__init__``), so
Python's own binding error names that class: ``RLock("x", timeout=10)`` would say
``Primitive.__init__() got an unexpected keyword argument 'timeout'``. Users coming from
redis-py's ``Lock`` or python-redis-lock pass exactly such keywords, whose meaning here
has another name (``timeout`` is the *lease* there, ``ttl`` here).

:func:`public_init` wraps an ``__init__`` without changing its signature (``wraps`` keeps
``__wrapped__``, so ``help()``, ``inspect.signature`` and mypy still see the explicit
parameters): only when the call raises TypeError *and* the arguments do not bind to that
signature is the error replaced by one naming the public class and, for a keyword known
from the peers, the keyword to use. A successful call pays nothing; a TypeError raised by
validation inside ``__init__`` passes unchanged.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, Optional, TypeVar, cast

from .checks import shown

__all__ = ["keyword_hint", "public_init", "public_method", "unexpected_keyword"]

F = TypeVar("F", bound=Callable[..., None])

# Keywords of redis-py's Lock (redis/lock.py) and python-redis-lock's Lock (redis_lock),
# and what each is called in rlocks.
_HINTS: Dict[str, str] = {
    "timeout": "the lease is ttl= (seconds); timeout= is how long acquire() waits",
    "expire": "the lease is ttl= (seconds)",
    "blocking_timeout": "how long to wait is acquire(timeout=...)",
    "blocking": "blocking= is an argument of acquire()",
    "sleep": "waiters are woken by a message and do not poll: there is no sleep=",
    "auto_renewal": "use auto_renew= (on by default)",
    "thread_local": "holds always belong to the calling thread (task for asyncio)",
    "redis": "pass the Redis client as client=",
    "redis_client": "pass the Redis client as client=",
    "id": "owner ids are made per thread (task) and cannot be given",
    "token": "owner ids are made per thread (task) and cannot be given",
}


def keyword_hint(keyword: str) -> Optional[str]:
    """What to use instead of ``keyword`` if it is a peer library's name for something."""
    return _HINTS.get(keyword)


def unexpected_keyword(error: TypeError) -> Optional[str]:
    """The keyword a binding error is about ("... unexpected keyword argument 'x'")."""
    text = str(error)
    if "unexpected keyword argument" in text and text.endswith("'"):
        return text.rsplit("'", 2)[-2]
    return None


def _label(instance: Any) -> str:
    return str(getattr(type(instance), "_label", type(instance).__qualname__))


def _explain(label: str, name: object, error: TypeError) -> str:
    text = str(error)
    # inspect's binding errors read "got an unexpected keyword argument 'timeout'",
    # "missing a required argument: 'name'", "too many positional arguments".
    where = f"{label}({shown(name)})" if isinstance(name, str) else f"{label}()"
    message = f"{where}: {text}"
    keyword = unexpected_keyword(error)
    if keyword is not None:
        hint = keyword_hint(keyword)
        if hint is not None:
            message += f"; {hint}"
    return message


def public_init(init: F) -> F:
    """Wrap a primitive's ``__init__`` so that argument binding errors name the public
    class (its ``_label``) and hint at the right keyword; the signature is unchanged."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except TypeError:
            try:
                signature.bind(self, *args, **kwargs)
            except TypeError as binding:
                name = args[0] if args else kwargs.get("name")
                raise TypeError(_explain(_label(self), name, binding)) from None
            raise

    return cast(F, wrapper)


#: What the peers' acquire keywords are called in rlocks (a method's own hints).
_METHOD_HINTS: Dict[str, str] = {
    "blocking_timeout": "how long to wait is timeout=",
    "timeout_ms": "timeout= is in seconds",
    "ttl": "the lease is set when the primitive is made: ttl= of its constructor",
}


M = TypeVar("M", bound=Callable[..., Any])


def public_method(method: M) -> M:
    """Wrap a public method (``acquire``) so that an argument it does not take raises a
    TypeError naming the public class and the rlocks argument to use, not an engine
    class; the signature is unchanged, and a call that binds pays one try block."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except TypeError:
            try:
                signature.bind(self, *args, **kwargs)
            except TypeError as binding:
                text = f"{_label(self)}({shown(self._name)}).{method.__name__}(): {binding}"
                keyword = unexpected_keyword(binding)
                hint = _METHOD_HINTS.get(keyword or "")
                raise TypeError(text + (f"; {hint}" if hint else "")) from None
            raise

    return cast(M, wrapper)
