"""All or nothing: several primitives taken together, in one order every process shares.

``acquire_all(a, b, c)`` takes each primitive in a global order and gives back what it
took if it cannot have the rest (its time ran out, or an error). Two callers that want
overlapping sets therefore never wait for each other in a circle: each waits only for a
primitive later in the order than everything it holds, and the holder of the last one
waited for is waiting for none (the classic lock ordering; Havender 1968). The order is
that of the primitives' Redis keys (namespace, kind, name), the write side of an RWLock
before its read side (a writer may take its read side; the reverse is an upgrade), then
the server's address: the same in every process, whatever order the caller named them.

What the caller holds while it waits is part of the set; another ``acquire_all`` of an
overlapping set waits behind it, never across it. A plain ``acquire`` of a later
primitive by a thread that holds an earlier one outside ``acquire_all`` can still close
a circle (as with any locks); the deadlock detector sees circles of RLocks and RWLock
sides.

The taking is written once (:func:`take_all`, a generator of :class:`Take` and
:class:`Give` steps) for the blocking and the awaited drivers (``rlocks/multi.py``,
``rlocks/asyncio/multi.py``).
"""

from __future__ import annotations

import threading
from typing import Any, Generator, List, NamedTuple, Optional, Sequence, Tuple

from .clock import monotonic
from .primitive import Primitive

__all__ = ["Give", "Take", "check_all", "give_all", "take_all"]

LABEL = "rlocks.acquire_all"
_SIDE_ORDER = {"x": 0, "w": 0, "p": 0, "r": 1}


class Take(NamedTuple):
    """Acquire ``prim``: ``wait`` seconds (None: for ever, 0: just try)."""

    prim: Any
    wait: Optional[float]


class Give(NamedTuple):
    """Release ``prim`` (one level, one permit)."""

    prim: Any


def _order(p: Any) -> Tuple[str, int, str]:
    return (p._keys.hash, _SIDE_ORDER.get(p._spec.side, 0), repr(p._backend.address))


def check_all(prims: Sequence[Any], blocking: object, timeout: object,
              aio: bool, label: str = LABEL) -> Tuple[List[Any], Optional[float]]:
    """The primitives in the order they are taken, and the wait (seconds; None: for ever).
    TypeError / ValueError before any I/O: not rlocks primitives, of the other surface
    (threading / asyncio), one named twice, none at all, a bad ``timeout``."""
    if not prims:
        raise ValueError(f"{label}(): give the primitives to acquire")
    for p in prims:
        if not isinstance(p, Primitive):
            hint = ("; pass its read_lock or write_lock" if hasattr(p, "write_lock") else
                    "; pass its lock" if hasattr(p, "notify") else "")
            raise TypeError(f"{label}(): {type(p).__name__} is not an rlocks lock or "
                            f"semaphore{hint}")
        if p._aio != aio:
            other = "rlocks.asyncio.acquire_all" if p._aio else "rlocks.acquire_all"
            raise TypeError(f"{label}(): {p._label}({p._shown}) is for "
                            f"{'asyncio' if p._aio else 'threads'}: use {other}")
    wait = _wait(blocking, timeout, label)
    ordered = sorted(prims, key=_order)
    for a, b in zip(ordered, ordered[1:]):
        if _order(a) == _order(b):
            raise ValueError(f"{label}(): {b._describe()} is named twice (the same "
                             "primitive, through one object or two)")
    return ordered, wait


def _wait(blocking: object, timeout: object, label: str) -> Optional[float]:
    if timeout is None:
        return None if blocking else 0.0
    if not blocking:
        raise ValueError(f"{label}(): can't specify a timeout for a non-blocking call")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{label}(): timeout must be a number of seconds or None, "
                        f"not {type(timeout).__name__}")
    if not timeout >= 0:  # (NaN too)
        raise ValueError(f"{label}(): timeout must be a non-negative number or None, "
                         f"got {timeout!r}")
    if timeout > threading.TIMEOUT_MAX:
        raise OverflowError(f"{label}(): timeout {timeout!r} is above threading.TIMEOUT_MAX")
    return float(timeout)


def take_all(ordered: Sequence[Any], wait: Optional[float]) -> Generator[Any, Any, List[Any]]:
    """Take every primitive of ``ordered`` in order within ``wait``: returns them all, or
    an empty list with everything taken given back. An error (or an interrupt) while
    taking gives back what was taken, then propagates."""
    deadline = None if wait is None else monotonic() + wait
    taken: List[Any] = []
    try:
        for p in ordered:
            left = wait if deadline is None or wait == 0 else max(0.0, deadline - monotonic())
            if not (yield Take(p, left)):
                break
            taken.append(p)
        else:
            return taken
    except BaseException:
        yield from give_all(taken, quiet=True)
        raise
    yield from give_all(taken, quiet=True)
    return []


def give_all(taken: Sequence[Any], quiet: bool = False) -> Generator[Any, Any, None]:
    """Give back each of ``taken``, the last taken first. Every one is given back even if
    an earlier one raised; then the first error is raised (``quiet``: not raised: the
    holds were never used, and a loss among them was reported already)."""
    first: Optional[BaseException] = None
    for p in reversed(taken):
        try:
            yield Give(p)
        except Exception as exc:  # noqa: BLE001 - the others are given back first
            first = first or exc
    if first is not None and not quiet:
        raise first
