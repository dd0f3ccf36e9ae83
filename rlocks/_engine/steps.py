"""The steps of every I/O-free dialogue, and the blocking and awaited drivers that run them.

A dialogue (acquire, release, extend, a Condition's wait, a renewal pass, the deadlock
check) is a generator: it yields the step it needs and receives the step's result, or the
step's exception thrown in. It never does I/O itself, so one dialogue serves both
:func:`drive` (threads) and :func:`adrive` (asyncio), and a difference between the two is
a difference between these two short functions only.

Steps:

- :class:`Run`: one script call through a backend (a Redis client, or a Quorum); its
  :class:`~.scripts.Reply` comes back;
- :class:`RunMany`: several script calls in one pipeline (renewals);
- :class:`Read`: one plain read command (the deadlock walk, settling an unknown outcome);
- :class:`Pause`: sleep; :class:`Listen`: wait for a wake-up (True) or the time (False);
- :class:`Enlist`: register a waiter with the process's wake-up hub (a :class:`~.wakeups.Waiter`).

An interrupt that is not Redis's (KeyboardInterrupt, a task's cancellation) during a
:class:`Run` is thrown in as :class:`Interrupted`: for a cancellation the call itself
runs to its end first (shielded), and ``reply`` is its answer (``None`` if it failed or,
for a thread, could not be known), so the dialogue can give back what it was granted.

:func:`call` is the one retry policy: every script call is safe to send again (each says
what it expects to find, so a repeat is recognised), so a call that failed on the link is
sent again with back-off until the dialogue's deadline.
"""

from __future__ import annotations

import asyncio
import queue
import time
from typing import Any, Generator, List, NamedTuple, Optional, Sequence

import redis.exceptions as rx

from .clock import monotonic

__all__ = [
    "TRANSIENT", "Enlist", "Interrupted", "Listen", "NoTurn", "Pause", "Read", "Run", "RunMany",
    "adrive", "call", "drive", "refused", "transient",
]


class Run(NamedTuple):
    backend: Any
    call: Any


class RunMany(NamedTuple):
    backend: Any
    calls: Sequence[Any]


class Read(NamedTuple):
    backend: Any
    args: Sequence[Any]
    gate: Any = None  # as Call.gate and Call.until
    until: Optional[float] = None


class Pause(NamedTuple):
    seconds: float


class Listen(NamedTuple):
    waiter: Any
    seconds: float


class Enlist(NamedTuple):
    backend: Any
    namespace: str
    key: str
    owner: str
    until: Optional[float] = None  # waits for a subscriber not yet listening: as Call.until


#: The longest an Enlist waits for its subscriber to listen (it asks again after anyway).
SUBSCRIBE_WAIT = 5.0


def _left(until: Optional[float]) -> float:
    return SUBSCRIBE_WAIT if until is None else max(0.0, min(SUBSCRIBE_WAIT, until - monotonic()))


class Interrupted(BaseException):
    """An interrupt (``cause``) that hit a :class:`Run`; ``reply``: its answer, if known."""

    def __init__(self, cause: BaseException, reply: Any) -> None:
        super().__init__(cause)
        self.cause = cause
        self.reply = reply


#: Failures of the link or of a server in transition: the call may be sent again.
TRANSIENT = (rx.ConnectionError, rx.TimeoutError, rx.BusyLoadingError, rx.TryAgainError,
             rx.ClusterDownError, rx.ReadOnlyError, rx.MasterDownError)


def transient(exc: BaseException) -> bool:
    if isinstance(exc, rx.AuthenticationError):
        return False
    if isinstance(exc, (TRANSIENT, OSError)):  # (a socket error redis-py did not wrap)
        return True
    return isinstance(exc, rx.ResponseError) and str(exc).startswith(
        ("LOADING", "MASTERDOWN", "READONLY", "CLUSTERDOWN", "TRYAGAIN"))


def call(backend: Any, script_call: Any, until: Optional[float],
         sends: Optional[List[bool]] = None) -> Generator[Any, Any, Any]:
    """Run ``script_call``, sending it again after a failure of the link until ``until``
    (monotonic; ``None``: for ever). Raises the last failure after that. ``sends``, if
    given, gets an entry for each send: False when it surely did not run (:func:`refused`),
    else True."""
    delay = 0.01
    while True:
        if sends is not None:
            sends.append(True)
        try:
            return (yield Run(backend, script_call))
        except BaseException as exc:
            if sends is not None and refused(exc):
                sends[-1] = False
            if not transient(exc) or (until is not None and monotonic() + delay >= until):
                raise
        yield Pause(delay)
        delay = min(delay * 2, 0.5)


def refused(exc: BaseException) -> bool:
    """Whether a failed send surely did not run: the server answered with an error (it
    runs no part of a script it refuses: LOADING, READONLY, MOVED, ...), or no connection
    could be made (redis-py's "Error 111 connecting to ...", "Timeout connecting to
    server"), or it never left (:class:`NoTurn`). When a client's own retries hid an
    earlier try, this may call a send refused that ran: the caller then reports a loss
    it cannot rule out, never a release it cannot prove. (A Quorum's error is marked
    ``_rlocks_ran`` unless the call surely ran on no master.)"""
    if getattr(exc, "_rlocks_ran", False):
        return False
    if isinstance(exc, (rx.ResponseError, NoTurn)):
        return True
    return isinstance(exc, (rx.ConnectionError, rx.TimeoutError)) and "connecting to" in str(exc)


def _foreign(exc: BaseException) -> bool:
    return not isinstance(exc, (rx.RedisError, Interrupted, StopIteration))


class NoTurn(rx.TimeoutError):
    """A waiter's call found no free turn (:class:`backends.Server.gate`) before its
    deadline: nothing was sent."""


def _through(gate: Any, fn: Any, arg: Any, until: Optional[float]) -> Any:
    if gate is None:
        return fn(arg)
    try:  # (C: see backends.Server.gate) then at once the try below
        gate.get(timeout=None if until is None else max(0.0, until - monotonic()))
    except queue.Empty:
        raise NoTurn("no turn to send before the deadline") from None
    try:
        return fn(arg)
    finally:
        gate.put(None)


def drive(dialogue: Generator[Any, Any, Any]) -> Any:
    """Run ``dialogue`` in this thread; returns its value or raises its exception."""
    value: Any = None
    error: Optional[BaseException] = None
    while True:
        try:
            step = dialogue.throw(error) if error is not None else dialogue.send(value)
        except StopIteration as done:
            return done.value
        value, error = None, None
        try:
            kind = type(step)
            if kind is Run:
                try:
                    value = _through(step.call.gate, step.backend.run, step.call,
                                     step.call.until)
                except BaseException as exc:
                    # The call's answer, when scripts.Call learned it after the interrupt.
                    error = (Interrupted(exc, getattr(exc, "_rlocks_reply", None))
                             if _foreign(exc) else exc)
            elif kind is Listen:
                value = step.waiter.wait(step.seconds)
            elif kind is Pause:
                time.sleep(step.seconds)
            elif kind is Read:
                value = _through(step.gate, step.backend.read, step.args, step.until)
            elif kind is RunMany:
                value = step.backend.run_many(step.calls)
            elif kind is Enlist:
                value = step.backend.enlist(step.namespace, step.key, step.owner,
                                            _left(step.until))
            else:
                raise TypeError(f"not a step: {step!r}")
        except BaseException as exc:  # noqa: BLE001 - the dialogue decides
            error = exc


async def adrive(dialogue: Generator[Any, Any, Any]) -> Any:
    """Run ``dialogue`` in the running task; returns its value or raises its exception.

    A cancellation while a :class:`Run` is on its way lets that call finish (shielded)
    and throws :class:`Interrupted` with its answer; a cancellation at any other step is
    thrown as it is. Clean-up calls the dialogue makes after either run shielded too.
    """
    value: Any = None
    error: Optional[BaseException] = None
    while True:
        try:
            step = dialogue.throw(error) if error is not None else dialogue.send(value)
        except StopIteration as done:
            return done.value
        value, error = None, None
        try:
            kind = type(step)
            if kind is Run:
                running = asyncio.ensure_future(_gated(step.call.gate, step.backend.arun,
                                                       step.call, step.call.until))
                try:
                    value = await asyncio.shield(running)
                except asyncio.CancelledError as exc:
                    error = Interrupted(exc, await _outcome(running))
            elif kind is Listen:
                value = await step.waiter.await_(step.seconds)
            elif kind is Pause:
                await asyncio.sleep(step.seconds)
            elif kind is Read:
                value = await _gated(step.gate, step.backend.aread, step.args, step.until)
            elif kind is RunMany:
                value = await step.backend.arun_many(step.calls)
            elif kind is Enlist:
                value = await step.backend.aenlist(step.namespace, step.key, step.owner,
                                                   _left(step.until))
            else:
                raise TypeError(f"not a step: {step!r}")
        except BaseException as exc:  # noqa: BLE001 - the dialogue decides
            error = exc


async def _gated(gate: Any, fn: Any, arg: Any, until: Optional[float]) -> Any:
    if gate is None:
        return await fn(arg)
    try:
        async with asyncio.timeout(None if until is None else max(0.0, until - monotonic())):
            await gate.acquire()
    except TimeoutError:
        raise NoTurn("no turn to send before the deadline") from None
    try:
        return await fn(arg)
    finally:
        gate.release()


async def _outcome(running: "asyncio.Future[Any]") -> Any:
    """The result of a call whose caller was cancelled: waited for (it runs on, shielded
    again if the task is cancelled once more), None if it failed."""
    while True:
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            if running.cancelled():
                return None
            continue
        except BaseException:  # noqa: BLE001 - the call's own failure: outcome unknown
            return None
