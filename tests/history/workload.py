"""What a worker's thread or task does, written once for both drivers.

Each workload is a generator that yields actions and receives their results; the
blocking driver (threads) and the awaited driver (asyncio tasks) in ``worker`` carry
them out and record them. So the two drivers run the same sections, and the random
choices depend only on the seed.

Kinds: ``rlock``, ``lock`` (rlocks.Lock: the same sections without re-entry), ``rw``,
``sem``, ``bsem``, ``cond``, ``barrier`` (every thread a party of one Barrier of
``PARTIES``: it waits, and after a BrokenBarrierError one thread of each worker resets it).

Handles: every process makes two objects of each primitive's name (``a`` and ``b``, with
different ``ttl``s: two objects of one name are one primitive), used at random, and
re-enters through either. A Condition has one object (``c``, its lock's only object: a
waiter must hold every level through the Condition's lock), a BoundedSemaphore a third
(``spare``) through which nothing is ever taken, for releases of nobody's permit.

A result sent back is the outcome string the driver recorded: ``ok`` (True, or done),
``false`` (an acquire that timed out, ``owned()`` False), ``lost`` (LockLostError),
``refused`` (the error the call promises for misuse), ``cancelled`` (the asyncio driver
cancelled the call) or ``error`` (anything else).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Generator, Optional

__all__ = [
    "Acquire", "Release", "Sleep", "Write", "Owned", "Wait", "Notify", "Spurious",
    "BarrierWait", "BarrierReset", "KINDS", "PARTIES", "SIDES", "workload",
]

#: The primitives a run can exercise, and the side (role) each hold has: ``x`` exclusive,
#: ``r``/``w`` an RWLock's read/write side, ``p`` a permit.
KINDS = ("rlock", "lock", "rw", "sem", "bsem", "cond", "barrier")
SIDES = {"rlock": "x", "lock": "x", "cond": "x", "sem": "p", "bsem": "p"}


@dataclass(frozen=True)
class Acquire:
    obj: str  # handle: "a", "b", "c"
    side: str  # "x", "r", "w", "p"
    hold: str  # the hold this acquire starts (or re-enters)
    depth: int  # 1: the thread's outermost acquire of this primitive (a wait); >1: nested
    new: bool  # whether it starts a hold (False: a re-entry of ``hold``)
    timeout: float


@dataclass(frozen=True)
class Release:
    obj: str
    side: str
    hold: str
    end: bool  # whether it ends ``hold`` (the last level of it)


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Write:
    """A write to the fenced store with the hold's current token."""

    obj: str
    side: str
    hold: str


@dataclass(frozen=True)
class Owned:
    obj: str
    side: str
    hold: str


@dataclass(frozen=True)
class Wait:
    """``Condition.wait(timeout)``: ends ``hold`` when called, starts ``new`` on return."""

    hold: str
    new: str
    timeout: float


@dataclass(frozen=True)
class Notify:
    hold: str
    n: int  # 0: notify_all()


@dataclass(frozen=True)
class Spurious:
    """A release of nobody's permit (BoundedSemaphore: must be refused)."""


@dataclass(frozen=True)
class BarrierWait:
    """``Barrier.wait(timeout)``: ``ok`` (passed: its index is recorded) or ``broken``."""

    obj: str
    timeout: float


@dataclass(frozen=True)
class BarrierReset:
    obj: str


#: The parties of the run's Barrier (fewer than its threads: some wait for the next).
PARTIES = 3

Action = object
Work = Generator[Action, str, None]


@dataclass(frozen=True)
class Shape:
    """The workload's timing: section lengths and waits, in seconds."""

    timeout: float = 5.0  # acquire(timeout=...)
    hold_min: float = 0.005
    hold_max: float = 0.06
    #: Some pauses are long, so that holds outlive several renewals (ttl / 3 apart):
    #: this share of them lasts ``long_min`` to ``long_max`` seconds.
    long_share: float = 0.04
    long_min: float = 0.3
    long_max: float = 1.5
    wait_timeout: float = 2.0  # Condition.wait(timeout=...)
    barrier_timeout: float = 3.0  # Barrier.wait(timeout=...)


def workload(kind: str, thread: str, seed: int, shape: Shape, role: int = 0) -> Work:
    """The endless action stream of one thread (or task) named ``thread``."""
    rng = random.Random(f"{seed}/{thread}/{kind}")
    holds = (f"{thread}/{n}" for n in itertools.count())
    if kind == "rlock":
        return _exclusive(rng, holds, shape)
    if kind == "lock":  # not reentrant: no nested acquire
        return _exclusive(rng, holds, shape, reenter=False)
    if kind == "rw":
        return _readers_writers(rng, holds, shape)
    if kind in ("sem", "bsem"):
        return _permits(rng, holds, shape, bounded=kind == "bsem")
    if kind == "cond":
        return _notifier(rng, holds, shape) if role == 0 else _waiter(rng, holds, shape)
    if kind == "barrier":
        return _party(rng, shape, role)
    raise ValueError(kind)


def _pause(rng: random.Random, shape: Shape) -> Sleep:
    if rng.random() < shape.long_share:
        return Sleep(rng.uniform(shape.long_min, shape.long_max))
    return Sleep(rng.uniform(shape.hold_min, shape.hold_max))


def _inside(rng: random.Random, obj: str, side: str, hold: str, shape: Shape,
            reenter: bool = True) -> Work:
    """One to three steps inside a hold: re-enter (through either object), write to the
    fenced store, look at ``owned()``, and pause between them."""
    for _ in range(rng.randint(1, 3)):
        pick = rng.random()
        if pick < 0.35 and reenter:
            other = rng.choice("ab")
            got = yield Acquire(other, side, hold, 2, False, shape.timeout)
            if got == "ok":
                yield _pause(rng, shape)
                yield Release(other, side, hold, False)
        elif pick < 0.7 and side in ("x", "w"):
            yield Write(obj, side, hold)  # only exclusive holds write to the fenced store
        else:
            yield Owned(obj, side, hold)
        yield _pause(rng, shape)


def _exclusive(rng: random.Random, holds, shape: Shape, reenter: bool = True) -> Work:
    while True:
        obj, hold = rng.choice("ab"), next(holds)
        got = yield Acquire(obj, "x", hold, 1, True, shape.timeout)
        if got != "ok":
            yield Sleep(0.02)
            continue
        yield from _inside(rng, obj, "x", hold, shape, reenter)
        yield Release(obj, "x", hold, True)


def _readers_writers(rng: random.Random, holds, shape: Shape) -> Work:
    while True:
        obj, hold = rng.choice("ab"), next(holds)
        side = "w" if rng.random() < 0.4 else "r"
        got = yield Acquire(obj, side, hold, 1, True, shape.timeout)
        if got != "ok":
            yield Sleep(0.02)
            continue
        yield from _inside(rng, obj, side, hold, shape)
        if side == "w" and rng.random() < 0.3:
            # Downgrade: take the read side while writing, give the write side back
            # first, go on reading.
            read = next(holds)
            got = yield Acquire(obj, "r", read, 2, True, shape.timeout)
            yield Release(obj, "w", hold, True)
            if got == "ok":
                yield from _inside(rng, obj, "r", read, shape)
                yield Release(obj, "r", read, True)
            continue
        yield Release(obj, side, hold, True)


def _permits(rng: random.Random, holds, shape: Shape, bounded: bool) -> Work:
    while True:
        if bounded and rng.random() < 0.05:
            yield Spurious()
        obj, hold = rng.choice("ab"), next(holds)
        got = yield Acquire(obj, "p", hold, 1, True, shape.timeout)
        if got != "ok":
            yield Sleep(0.02)
            continue
        yield from _inside(rng, obj, "p", hold, shape, reenter=False)
        if rng.random() < 0.2:
            # A second permit for the same thread (it may have to wait for it).
            # Each permit goes back through the object that took it: an object gives
            # back only what was taken through it, so a release through the other one
            # would be a release of nobody's permit (an unbounded semaphore grows).
            second, through = next(holds), rng.choice("ab")
            got = yield Acquire(through, "p", second, 2, True, shape.timeout)
            if got == "ok":
                yield _pause(rng, shape)
                yield Release(through, "p", second, True)
        yield Release(obj, "p", hold, True)


def _party(rng: random.Random, shape: Shape, role: int) -> Work:
    while True:
        got = yield BarrierWait(rng.choice("ab"), shape.barrier_timeout)
        if got == "ok":
            yield Sleep(rng.uniform(0.0, shape.hold_max))
            continue
        yield Sleep(rng.uniform(0.05, 0.3))
        if got == "broken" and role == 0:
            yield BarrierReset(rng.choice("ab"))


def _waiter(rng: random.Random, holds, shape: Shape) -> Work:
    hold: Optional[str] = None
    while True:
        hold = next(holds)
        got = yield Acquire("c", "x", hold, 1, True, shape.timeout)
        if got != "ok":
            yield Sleep(0.02)
            continue
        after = next(holds)
        yield Wait(hold, after, shape.wait_timeout)
        yield Write("c", "x", after)
        yield Release("c", "x", after, True)
        yield _pause(rng, shape)


def _notifier(rng: random.Random, holds, shape: Shape) -> Work:
    while True:
        yield Sleep(rng.uniform(0.05, 0.4))
        hold = next(holds)
        got = yield Acquire("c", "x", hold, 1, True, shape.timeout)
        if got != "ok":
            continue
        yield Write("c", "x", hold)
        yield Notify(hold, rng.choice((1, 1, 2, 0)))
        yield Release("c", "x", hold, True)
