"""Metrics and spans through OpenTelemetry: what the engine records, and at what cost.

What is recorded
----------------
docs/metrics.md lists the instruments, their units and attributes (the one list; the
tests check it against :class:`_Instruments`). With ``opentelemetry-api`` installed they
record to the global providers, or to those given to :func:`configure`, under the
instrumentation scope ``rlocks``.

An acquire granted at once makes no span: spans cost an allocation and an export each,
and the uncontended acquire is the one that must stay cheap. The span is not made
the current span while it waits: asyncio copies the current context into every task
created meanwhile, and the engine creates long-lived ones there (the wake-up hub, the
renewer), which would then carry, and parent their work to, one acquire's span.

Why it costs nothing when unused
--------------------------------
The instruments are resolved on first use, once, under a lock (:func:`_resolve`); until
then and afterwards the hot path reads one module global. Without the API, that global is
``None`` and the acquire wrapper is one global read and a call. With the API but no
provider configured, the instruments are the API's proxies, whose ``record`` is one
attribute test (and which forward to a provider set later, so a program may configure
OpenTelemetry after its first lock). Attribute dicts are built once per (class, name,
outcome, waited) and cached. The uncontended acquire therefore pays: a wrapper call, two
clock reads, a cache look-up, one histogram record and a ``ContextVar.get``; its release
one clock read, a cache look-up and one record. Everything that waits pays more, and
only then.

How it hooks in
---------------
The engine calls in at few places, one line each: :func:`measure_acquire` /
:func:`measure_async_acquire` decorate the acquire drivers; :func:`wait_began` is called
by a driver just before it waits and :func:`wait_over` (``Primitive._log_wait``) when the
wait returned; :func:`hold_ended` when a hold's last level is dropped; :func:`lost` where
every loss is reported; :func:`renewed` for each renewed lease. A wait in progress is
remembered in a ``ContextVar`` (per thread, and per asyncio task), which the acquire
wrapper reads when the acquire returns: it closes the span, counts the waiter out and
records ``waited=true``. The record holds no primitive (a task created during the wait
keeps a copy of the context, and must not keep the primitive and its client alive), and
is marked ended, so a copy found later by another acquire is ignored.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import threading
import time
from typing import Any, Awaitable, Callable, Dict, Optional, Tuple, TypeVar

from .clock import monotonic

__all__ = [
    "configure",
    "hold_ended",
    "lost",
    "measure_acquire",
    "measure_async_acquire",
    "renewed",
    "waits",
    "wait_began",
    "wait_closed",
    "wait_over",
]

log = logging.getLogger(__name__)

#: Bucket boundaries (s) advised for both duration histograms: the default boundaries of
#: the SDK are meant for milliseconds (0, 5, 10, ... 10000) and would put every lock wait
#: in the first bucket. From a local round trip to a long critical section.
DURATION_BUCKETS: Tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)

# Public class name (the last part of a primitive's _label) -> the ``kind`` attribute.
_KINDS = {
    "RLock": "rlock",
    "Lock": "lock",
    "RWLock": "rwlock",
    "Semaphore": "semaphore",
    "BoundedSemaphore": "bounded_semaphore",
}
_SIDES = {"r": "read", "w": "write"}
_CACHE_MAX = 4096  # attribute dicts kept; cleared when full (names may be unbounded)


class _Instruments:
    """The resolved instruments and tracer (all the API's objects, or its proxies)."""

    __slots__ = ("acquire", "hold", "waiting", "lost", "renewals", "handovers", "tracer")

    def __init__(self, meter: Any, tracer: Any) -> None:
        self.acquire = meter.create_histogram(
            "rlocks.acquire.duration",
            unit="s",
            description="Time from the call of an acquire to its return",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.hold = meter.create_histogram(
            "rlocks.hold.duration",
            unit="s",
            description="Time from a grant to its release or loss",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.waiting = meter.create_up_down_counter(
            "rlocks.waiting",
            unit="{waiter}",
            description="Threads and tasks of this process waiting to acquire",
        )
        self.lost = meter.create_counter(
            "rlocks.lost", unit="{hold}", description="Holds found lost"
        )
        self.renewals = meter.create_counter(
            "rlocks.renewals", unit="{renewal}", description="Leases renewed"
        )
        self.handovers = meter.create_counter(
            "rlocks.handovers",
            unit="{acquire}",
            description="Acquires granted after waiting",
        )
        self.tracer = tracer


_resolved = False  # whether _instruments is final (None: disabled)
_instruments: Optional[_Instruments] = None
_resolve_mutex = threading.Lock()
_include_name = False
_meter_provider: Any = None  # None: the global provider
_tracer_provider: Any = None
_attributes: Dict[Tuple[Any, ...], Dict[str, Any]] = {}


def configure(
    *,
    include_name: Optional[bool] = None,
    meter_provider: Any = None,
    tracer_provider: Any = None,
) -> None:
    """Set how rlocks records metrics; affects every primitive, from its next record on.

    ``include_name``: add the primitive's ``name`` and ``namespace`` to every value
    (default off; ``None`` keeps the current setting). Each name becomes a series of
    its own in the metrics backend: turn it on only when the program uses a small,
    fixed set of names.

    ``meter_provider`` / ``tracer_provider``: record there instead of to OpenTelemetry's
    global providers (``None``: the global ones). For tests and for programs that keep
    several providers.

    No I/O; never raises for a missing OpenTelemetry API (then nothing is recorded).
    Raises TypeError for an ``include_name`` that is not a bool.
    """
    global _include_name, _meter_provider, _tracer_provider, _resolved, _instruments
    if include_name is not None and not isinstance(include_name, bool):
        raise TypeError(f"include_name must be a bool, not {type(include_name).__name__}")
    with _resolve_mutex:
        if include_name is not None:
            _include_name = include_name
        _meter_provider = meter_provider
        _tracer_provider = tracer_provider
        _attributes.clear()
        # Resolve again on next use: new providers, and a retry of a failed import.
        _instruments = None
        _resolved = False


def _resolve() -> Optional[_Instruments]:
    """Resolve the instruments once; ``None`` (and nothing recorded) without the API."""
    global _resolved, _instruments
    with _resolve_mutex:
        if _resolved:
            return _instruments
        try:
            from opentelemetry import metrics as otel_metrics
            from opentelemetry import trace as otel_trace
        except ImportError:
            found = None
        else:
            try:
                # (read once: the package metadata scan costs milliseconds at a first acquire)
                version = _version()
                found = _Instruments(
                    (_meter_provider or otel_metrics.get_meter_provider()).get_meter(
                        "rlocks", version
                    ),
                    (_tracer_provider or otel_trace.get_tracer_provider()).get_tracer(
                        "rlocks", version
                    ),
                )
            except Exception:  # noqa: BLE001 - metrics must never break a lock
                log.warning("rlocks metrics disabled: OpenTelemetry setup failed", exc_info=True)
                found = None
        _instruments = found
        _resolved = True
        return found


@functools.lru_cache(maxsize=1)
def _version() -> Optional[str]:
    """The installed distribution's version (None: not installed as one). Cached: a
    reset of the providers resolves the instruments again, and the scan of every
    distribution on ``sys.path`` takes milliseconds."""
    try:
        from importlib.metadata import version

        return version("rlocks")
    except Exception:  # noqa: BLE001 - not installed as a distribution: no version
        return None


def _base(primitive: Any) -> Dict[str, Any]:
    """The attributes every value of ``primitive`` carries (built, not cached)."""
    label = str(primitive._label)
    kind = _KINDS.get(label.rsplit(".", 1)[-1], label.rsplit(".", 1)[-1].lower())
    # RWLock sides carry their side code ('r' / 'w'); other primitives have no side.
    spec = getattr(primitive, "_spec", None)
    side = _SIDES.get(getattr(spec, "side", ""), "-")
    attributes: Dict[str, Any] = {"kind": kind, "side": side}
    if _include_name:
        attributes["name"] = primitive._name
        attributes["namespace"] = primitive._namespace
    return attributes


def _attrs(primitive: Any, *extra: Tuple[str, Any]) -> Dict[str, Any]:
    """``primitive``'s attributes plus ``extra`` pairs: cached, never to be mutated."""
    key = (type(primitive), primitive._name if _include_name else None, extra)
    found = _attributes.get(key)
    if found is None:
        found = _base(primitive)
        found.update(extra)
        if len(_attributes) >= _CACHE_MAX:
            _attributes.clear()
        _attributes[key] = found
    return found


# The extra attributes of the common values, built once (the hot path passes these).
_ACQUIRED = (("outcome", "acquired"), ("waited", False))
_RELEASED = (("end", "released"),)


# -- acquire ------------------------------------------------------------------------------


class _Wait:
    """One acquire's wait in progress (contended path only)."""

    __slots__ = ("instruments", "attributes", "span", "ended")

    def __init__(self, instruments: _Instruments, attributes: Dict[str, Any]) -> None:
        self.instruments = instruments
        self.attributes = attributes  # the primitive's, without outcome
        self.span: Any = None
        self.ended = False


# The wait of the acquire running in this thread or task, if it waits (set by wait_began,
# cleared by the acquire wrapper). Only ever set on the contended path.
_current: contextvars.ContextVar[Optional[_Wait]] = contextvars.ContextVar(
    "rlocks_wait", default=None
)


def wait_began(primitive: Any, since: float) -> None:
    """An acquire of ``primitive`` called at ``since`` (monotonic s) starts waiting now.

    Counts the waiter in and starts the ``rlocks.acquire`` span, backdated to the call.
    """
    instruments = _instruments if _resolved else _resolve()
    if instruments is None:
        return
    base = _attrs(primitive)
    wait = _Wait(instruments, base)
    instruments.waiting.add(1, base)
    try:
        start_ns = time.time_ns() - int((monotonic() - since) * 1e9)
        wait.span = instruments.tracer.start_span(
            "rlocks.acquire", start_time=start_ns, attributes=base
        )
    except Exception:  # noqa: BLE001 - a failing tracer must not fail the acquire
        log.debug("rlocks.acquire span not started", exc_info=True)
    _current.set(wait)


def wait_over(granted: bool) -> None:
    """The waiting acquire of this thread or task learned its outcome: ``granted`` or not.

    This is where a waiter learns it was granted, so where a grant after waiting (a
    hand-over) is counted.
    """
    wait = _current.get()
    if wait is None or wait.ended:
        return
    if granted:
        wait.instruments.handovers.add(1, wait.attributes)


def wait_closed() -> None:
    """Close this thread's (task's) wait, if one is open, recording no acquire: the wait
    of a Condition taking its lock back (counted in ``rlocks.waiting`` and spanned like an
    acquire's, but no call of ``acquire`` ends it)."""
    wait = _current.get()
    if wait is not None and not wait.ended:
        _end_wait(wait, wait.attributes, None)


class waits:
    """``with metrics.waits(primitive):`` around a wait that is no acquire (an Event's, a
    Barrier's): counted in ``rlocks.waiting`` (its kind ``event`` / ``barrier``) and
    spanned as an acquire's wait is, while it lasts."""

    __slots__ = ("_primitive",)

    def __init__(self, primitive: Any) -> None:
        self._primitive = primitive

    def __enter__(self) -> None:
        wait_began(self._primitive, monotonic())

    def __exit__(self, *exc: Any) -> None:
        wait_closed()


def _end_wait(wait: _Wait, attributes: Dict[str, Any], error: Optional[BaseException]) -> None:
    """Close the wait the acquire wrapper found: count the waiter out, end the span."""
    _current.set(None)
    wait.ended = True
    wait.instruments.waiting.add(-1, wait.attributes)
    span = wait.span
    if span is None:
        return
    try:
        span.set_attributes(attributes)
        if error is not None:
            # Imported here, once an error is to be recorded: a package's from-import
            # runs importlib's Python code, on every waited acquire before.
            from opentelemetry.trace import Status, StatusCode

            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.end()
    except Exception:  # noqa: BLE001 - a failing tracer must not fail the acquire
        log.debug("rlocks.acquire span not ended", exc_info=True)


def _acquired(
    instruments: _Instruments,
    primitive: Any,
    since: float,
    granted: bool,
    error: Optional[BaseException],
) -> None:
    """Record one acquire that returned (``granted``) or raised (``error``)."""
    elapsed = monotonic() - since
    wait = _current.get()
    if wait is not None and wait.ended:
        wait = None  # a copy of an earlier acquire's context (a task created meanwhile)
    if error is not None:
        attributes = _attrs(
            primitive,
            ("outcome", "error"),
            ("waited", wait is not None),
            ("error.type", type(error).__name__),
        )
    elif granted and wait is None:
        attributes = _attrs(primitive, *_ACQUIRED)
    else:
        outcome = "acquired" if granted else "timed_out"
        attributes = _attrs(primitive, ("outcome", outcome), ("waited", wait is not None))
    instruments.acquire.record(elapsed, attributes)
    if wait is not None:
        _end_wait(wait, attributes, error)


Owner = TypeVar("Owner")
AcquireFn = Callable[[Owner, str, int, Optional[float]], bool]
AsyncAcquireFn = Callable[[Owner, str, int, Optional[float]], Awaitable[bool]]


class _Measured:
    """One acquire being measured, for both decorators below: ``with`` it around the
    call and set ``granted``; the exit records the outcome (or the exception)."""

    __slots__ = ("instruments", "primitive", "since", "granted")

    def __init__(self, instruments: _Instruments, primitive: Any) -> None:
        self.instruments = instruments
        self.primitive = primitive
        self.since = monotonic()
        self.granted = False

    def __enter__(self) -> "_Measured":
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        _acquired(self.instruments, self.primitive, self.since,
                  self.granted and exc is None, exc)


def measure_acquire(inner: AcquireFn[Owner]) -> AcquireFn[Owner]:
    """Decorate a primitive's ``_acquire``: its duration, outcome and wait are recorded."""

    @functools.wraps(inner)
    def measured(self: Owner, owner: str, count: int, wait: Optional[float]) -> bool:
        instruments = _instruments if _resolved else _resolve()
        if instruments is None:
            return inner(self, owner, count, wait)
        with _Measured(instruments, self) as acquire:
            acquire.granted = inner(self, owner, count, wait)
        return acquire.granted

    return measured


def measure_async_acquire(inner: AsyncAcquireFn[Owner]) -> AsyncAcquireFn[Owner]:
    """:func:`measure_acquire` for an asyncio primitive's ``_aacquire``."""

    @functools.wraps(inner)
    async def measured(self: Owner, owner: str, count: int, wait: Optional[float]) -> bool:
        instruments = _instruments if _resolved else _resolve()
        if instruments is None:
            return await inner(self, owner, count, wait)
        with _Measured(instruments, self) as acquire:
            acquire.granted = await inner(self, owner, count, wait)
        return acquire.granted

    return measured


# -- holds --------------------------------------------------------------------------------


def hold_ended(primitive: Any, granted: float, end: str) -> None:
    """A hold of ``primitive`` granted at ``granted`` (monotonic s) ended: ``end`` is
    ``released`` or ``lost``."""
    instruments = _instruments if _resolved else _resolve()
    if instruments is None:
        return
    extra = _RELEASED if end == "released" else (("end", end),)
    instruments.hold.record(monotonic() - granted, _attrs(primitive, *extra))


def lost(primitive: Any, granted: Optional[float]) -> None:
    """A hold of ``primitive`` was found lost (one report); ``granted``: when it was
    granted, if this process still knows (then its hold duration ends here)."""
    instruments = _instruments if _resolved else _resolve()
    if instruments is None:
        return
    instruments.lost.add(1, _attrs(primitive))
    if granted is not None:
        hold_ended(primitive, granted, "lost")


def renewed(primitive: Any) -> None:
    """The renewer extended a lease of ``primitive``."""
    instruments = _instruments if _resolved else _resolve()
    if instruments is None:
        return
    instruments.renewals.add(1, _attrs(primitive))
