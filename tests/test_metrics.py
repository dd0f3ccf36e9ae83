"""OpenTelemetry metrics and spans (rlocks.metrics) against scripted scenarios on a real server.

Each test gets its own SDK MeterProvider (InMemoryMetricReader) and TracerProvider
(InMemorySpanExporter), given to ``rlocks.metrics.configure``, so values never carry over
between tests. Every bound on a recorded duration comes from clock readings the test takes
around the scenario's steps (the library reads the same monotonic clock): a value can only
be inside them.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Callable, Iterator, List, Tuple

import pytest
import redis
import redis.asyncio

import rlocks
import rlocks.asyncio as ra
import rlocks.metrics
from rlocks._engine import state as engine_inspect

from ._servers import RENEWED_TTL
from ._threads import joined
from ._threads import started as in_thread
from .conftest import NAMESPACE

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)


class Telemetry:
    """One test's providers, and look-ups of what they recorded."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.exporter = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.exporter))

    def points(self, metric: str, **attributes: Any) -> List[Any]:
        """Data points of ``metric`` whose attributes include ``attributes``."""
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name != metric:
                        continue
                    for point in m.data.data_points:
                        if all(point.attributes.get(k) == v for k, v in attributes.items()):
                            found.append(point)
        return found

    def total(self, metric: str, **attributes: Any) -> float:
        """Sum of a counter's points (or of a histogram's counts) matching ``attributes``."""
        points = self.points(metric, **attributes)
        return sum(getattr(p, "count", None) or getattr(p, "value", 0) for p in points)

    def histogram(self, metric: str, **attributes: Any) -> Any:
        """The one histogram point matching ``attributes`` (it must be exactly one)."""
        points = [p for p in self.points(metric, **attributes) if p.count]
        assert len(points) == 1, (metric, attributes, points)
        return points[0]

    def spans(self, name: str) -> List[Any]:
        return [
            s for s in self.exporter.get_finished_spans()
            if s.attributes.get("name") == name
        ]


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    telemetry = Telemetry()
    rlocks.metrics.configure(
        include_name=True, meter_provider=telemetry.meters, tracer_provider=telemetry.tracers
    )
    try:
        yield telemetry
    finally:
        rlocks.metrics.configure(include_name=False)


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def timed(call: Callable[[], Any]) -> Tuple[Any, float, float]:
    """``call()``, with the monotonic readings just before and just after it."""
    before = time.monotonic()
    result = call()
    return result, before, time.monotonic()


def _hub_listening(prim: Any) -> bool:
    """Whether this process's wake-up subscriber for ``prim``'s channel listens (no I/O)."""
    hub = prim._backend._hubs.get(prim._keys.wake)
    return hub is not None and hub.ready.is_set()


def test_uncontended_acquire_and_hold(otel: Telemetry, client: Any, name: str) -> None:
    lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    _, t0, t1 = timed(lock.acquire)
    _, r0, r1 = timed(lock.acquire)  # a re-entry: the same hold, not a second one
    lock.release()
    time.sleep(0.1)  # a hold of known length; the bounds below are the readings around it
    t2 = time.monotonic()
    _, _, t3 = timed(lock.release)

    acquire = otel.histogram(
        "rlocks.acquire.duration", name=name, outcome="acquired", waited=False
    )
    assert acquire.count == 2  # the call and the re-entry
    # Each call is bounded by the readings around it; the re-entry is a round trip of its
    # own, so it may be the slower of the two under load.
    assert acquire.max <= max(t1 - t0, r1 - r0)
    assert acquire.sum <= (t1 - t0) + (r1 - r0)
    hold = otel.histogram("rlocks.hold.duration", name=name, end="released")
    assert hold.count == 1
    assert t2 - t1 <= hold.sum <= t3 - t0
    assert hold.attributes["kind"] == "rlock" and hold.attributes["side"] == "-"
    assert hold.attributes["namespace"] == NAMESPACE
    # An acquire that did not wait makes no span and never counts as waiting.
    assert otel.spans(name) == []
    assert otel.total("rlocks.waiting", name=name) == 0
    assert otel.total("rlocks.handovers", name=name) == 0


def test_known_wait_and_time_out(otel: Telemetry, client: Any, name: str) -> None:
    holder = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    waiter = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    assert holder.acquire()

    # A waiter (another thread: threads are owners) that gives up: at least its
    # timeout, at most its own call.
    gave_up, u0, u1 = joined(*in_thread(lambda: timed(lambda: waiter.acquire(timeout=0.3))))
    assert gave_up is False
    timed_out = otel.histogram(
        "rlocks.acquire.duration", name=name, outcome="timed_out", waited=True
    )
    assert timed_out.count == 1 and 0.3 <= timed_out.sum <= u1 - u0
    # A single try never waits, even when refused.
    assert joined(*in_thread(lambda: waiter.acquire(blocking=False))) is False
    assert otel.histogram(
        "rlocks.acquire.duration", name=name, outcome="timed_out", waited=False
    ).count == 1

    # A waiter that is granted when the holder releases.
    def wait_then_release() -> Tuple[float, float]:
        w0 = time.monotonic()
        assert waiter.acquire(timeout=60)
        w1 = time.monotonic()
        waiter.release()
        return w0, w1

    thread, out = in_thread(wait_then_release)
    wait_for(lambda: otel.total("rlocks.waiting", name=name) == 1, "the waiter to wait")
    # The waiter's clock started before it counted in, so before ``seen``; it stops after
    # ``released_at``. The pause makes that lower bound one a wrong metric would miss.
    seen = time.monotonic()
    time.sleep(0.1)
    released_at = time.monotonic()
    holder.release()
    w0, w1 = joined(thread, out)

    granted = otel.histogram(
        "rlocks.acquire.duration", name=name, outcome="acquired", waited=True
    )
    assert granted.count == 1
    # It cannot have been granted before the holder released, nor after it returned.
    assert released_at - seen <= granted.sum <= w1 - w0
    assert otel.total("rlocks.handovers", name=name) == 1
    assert otel.total("rlocks.waiting", name=name) == 0  # counted in, then out

    spans = sorted(otel.spans(name), key=lambda s: s.start_time)
    assert [s.attributes["outcome"] for s in spans] == ["timed_out", "acquired"]
    for span, bound in zip(spans, (u1 - u0, w1 - w0)):
        assert span.name == "rlocks.acquire"
        assert span.attributes["waited"] is True and span.attributes["kind"] == "rlock"
        # The span is backdated to the call from the wall clock: allow that conversion 5 ms.
        assert (span.end_time - span.start_time) / 1e9 <= bound + 0.005
    assert (spans[1].end_time - spans[1].start_time) / 1e9 >= released_at - seen - 0.005

    # The process's wake-up subscriber still listens after those waits (it idles a while
    # before it closes); an acquire now is granted by its first call (the lock is free):
    # it did not wait.
    assert _hub_listening(waiter)
    assert joined(*in_thread(lambda: (waiter.acquire(timeout=5), waiter.release())[0]))
    assert otel.histogram(
        "rlocks.acquire.duration", name=name, outcome="acquired", waited=False
    ).count == 2  # the holder's acquire, and this one
    assert len(otel.spans(name)) == 2 and otel.total("rlocks.waiting", name=name) == 0


def test_known_loss_renewals_and_error(otel: Telemetry, client: Any, name: str) -> None:
    lost = threading.Event()
    lock = rlocks.RLock(
        name, client=client, namespace=NAMESPACE, ttl=RENEWED_TTL, on_lost=lambda _: lost.set()
    )
    _, t0, t1 = timed(lock.acquire)
    # Renewed every ttl/3 = 1 s: wait for two renewals of this lock.
    wait_for(lambda: otel.total("rlocks.renewals", name=name) >= 2, "two renewals")
    assert otel.total("rlocks.renewals", name=name, kind="rlock", side="-") >= 2

    removed_at = time.monotonic()
    assert engine_inspect.force_release(client, NAMESPACE, "rlock", name)
    wait_for(lost.is_set, "the renewer to find the hold lost")
    found_at = time.monotonic()

    assert otel.total("rlocks.lost", name=name) == 1
    hold = otel.histogram("rlocks.hold.duration", name=name, end="lost")
    assert removed_at - t1 <= hold.sum <= found_at - t0

    # Re-entering a lost hold raises before any I/O: an acquire with outcome=error.
    with pytest.raises(rlocks.LockLostError):
        lock.acquire()
    error = otel.histogram("rlocks.acquire.duration", name=name, outcome="error")
    assert error.count == 1 and error.attributes["error.type"] == "LockLostError"
    assert error.attributes["waited"] is False

    # Releasing the lost hold ends nothing more: its duration was recorded at the loss.
    with pytest.raises(rlocks.LockLostError):
        lock.release()
    assert otel.points("rlocks.hold.duration", name=name, end="released") == []
    assert otel.total("rlocks.lost", name=name) == 1


def test_waiters_queued_in_one_process(otel: Telemetry, client: Any, name: str) -> None:
    # Two writers of one process wait on readers: both queue, and both count as waiting,
    # with the write side.
    rw = rlocks.RWLock(name, client=client, namespace=NAMESPACE)
    rw.read_lock.acquire()

    def write() -> bool:
        granted = rw.write_lock.acquire(timeout=60)
        rw.write_lock.release()
        return granted

    writers = [in_thread(write) for _ in range(2)]
    wait_for(
        lambda: otel.total("rlocks.waiting", name=name, kind="rwlock", side="write") == 2,
        "both writers to wait",
    )
    rw.read_lock.release()
    assert [joined(*w) for w in writers] == [True, True]
    assert otel.total("rlocks.handovers", name=name, side="write") == 2
    assert otel.total("rlocks.waiting", name=name) == 0
    assert otel.histogram(
        "rlocks.acquire.duration", name=name, side="write", outcome="acquired", waited=True
    ).count == 2
    assert len(otel.spans(name)) == 2


def test_kinds_and_sides(otel: Telemetry, client: Any, name: str) -> None:
    rw = rlocks.RWLock(name, client=client, namespace=NAMESPACE)
    with rw.write_lock:
        pass
    with rw.read_lock:
        pass
    sem = rlocks.BoundedSemaphore(name, 2, client=client, namespace=NAMESPACE)
    with sem:
        pass
    for kind, side in (("rwlock", "write"), ("rwlock", "read"), ("bounded_semaphore", "-")):
        assert otel.histogram(
            "rlocks.acquire.duration", name=name, kind=kind, side=side, outcome="acquired"
        ).count == 1
        assert otel.histogram("rlocks.hold.duration", name=name, kind=kind, side=side).count == 1


def test_a_refused_semaphore_release_ends_no_hold(
    otel: Telemetry, client: Any, name: str
) -> None:
    # release(2) of a BoundedSemaphore(1) holding one permit is refused by Redis after the
    # permit came off the local books: the hold is restored as the one it was, so the
    # later release records one hold, from the first grant.
    sem = rlocks.BoundedSemaphore(name, 1, client=client, namespace=NAMESPACE)
    _, t0, t1 = timed(sem.acquire)
    with pytest.raises(ValueError, match="released too many times"):
        sem.release(2)
    assert otel.points("rlocks.hold.duration", name=name) == []
    time.sleep(0.1)  # a hold longer than the refused release's moment
    t2 = time.monotonic()
    _, _, t3 = timed(sem.release)
    hold = otel.histogram("rlocks.hold.duration", name=name, end="released")
    assert hold.count == 1
    assert t2 - t1 <= hold.sum <= t3 - t0


def test_a_refused_asyncio_semaphore_release_ends_no_hold(
    otel: Telemetry, redis_url: str, name: str
) -> None:
    async def scenario() -> Tuple[float, float, float, float]:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        sem = ra.BoundedSemaphore(name, 1, client=aclient, namespace=NAMESPACE)
        t0 = time.monotonic()
        assert await sem.acquire()
        t1 = time.monotonic()
        with pytest.raises(ValueError, match="released too many times"):
            await sem.release(2)
        assert otel.points("rlocks.hold.duration", name=name) == []
        await asyncio.sleep(0.1)
        t2 = time.monotonic()
        await sem.release()
        t3 = time.monotonic()
        await aclient.aclose()
        return t0, t1, t2, t3

    t0, t1, t2, t3 = asyncio.run(scenario())
    hold = otel.histogram("rlocks.hold.duration", name=name, end="released")
    assert hold.count == 1
    assert t2 - t1 <= hold.sum <= t3 - t0


def test_names_only_when_configured(client: Any, name: str) -> None:
    telemetry = Telemetry()
    rlocks.metrics.configure(meter_provider=telemetry.meters, tracer_provider=telemetry.tracers)
    try:
        with rlocks.RLock(name, client=client, namespace=NAMESPACE):
            pass
    finally:
        rlocks.metrics.configure()
    points = telemetry.points("rlocks.acquire.duration")
    assert points and all(set(p.attributes) == {"kind", "side", "outcome", "waited"}
                          for p in points)


def test_configure_refuses_a_non_bool(otel: Telemetry) -> None:
    with pytest.raises(TypeError, match="include_name"):
        rlocks.metrics.configure(include_name="yes")  # type: ignore[arg-type]


def test_asyncio_wait(otel: Telemetry, redis_url: str, name: str) -> None:
    async def scenario() -> Tuple[float, float, float]:
        client = redis.asyncio.Redis.from_url(redis_url)
        holder = ra.RLock(name, client=client, namespace=NAMESPACE)
        waiter = ra.RLock(name, client=client, namespace=NAMESPACE)

        async def wait() -> Tuple[float, float]:
            w0 = time.monotonic()
            assert await waiter.acquire()
            w1 = time.monotonic()
            await waiter.release()
            return w0, w1

        assert await holder.acquire()
        task = asyncio.ensure_future(wait())
        deadline = time.monotonic() + 15
        while otel.total("rlocks.waiting", name=name) != 1:
            assert time.monotonic() < deadline, "the waiting task never counted in"
            await asyncio.sleep(0.005)
        seen = time.monotonic()  # the waiter's clock started before this (see the sync test)
        await asyncio.sleep(0.1)
        released_at = time.monotonic()
        await holder.release()
        w0, w1 = await task
        await client.aclose()
        return seen, released_at, w0, w1

    seen, released_at, w0, w1 = asyncio.run(scenario())
    granted = otel.histogram(
        "rlocks.acquire.duration", name=name, outcome="acquired", waited=True
    )
    assert released_at - seen <= granted.sum <= w1 - w0
    assert otel.total("rlocks.handovers", name=name) == 1
    assert otel.total("rlocks.waiting", name=name) == 0
    assert [s.attributes["outcome"] for s in otel.spans(name)] == ["acquired"]
    assert otel.histogram("rlocks.hold.duration", name=name).count == 2


def test_tasks_started_during_a_wait_inherit_nothing(
    otel: Telemetry, redis_url: str, name: str
) -> None:
    # The loop's renewer task is started by the first grant that needs renewal: here, a
    # grant after waiting, so the renewer's context is a copy taken inside that wait. An
    # async on_lost runs as a task started by the renewer; an acquire made there is its
    # own, uncontended: it must not be taken for the earlier waiter (waited=true, waiting
    # counted out a second time).
    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        inside: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()

        async def on_lost(_: Any) -> None:
            try:
                async with ra.RLock(name + "-other", client=client, namespace=NAMESPACE):
                    pass
                inside.set_result(None)
            except BaseException as exc:  # noqa: BLE001 - re-raised by the test
                inside.set_exception(exc)

        holder = ra.RLock(name, client=client, namespace=NAMESPACE, auto_renew=False)
        waiter = ra.RLock(name, client=client, namespace=NAMESPACE, ttl=1.5, on_lost=on_lost)
        assert await holder.acquire()
        task = asyncio.ensure_future(waiter.acquire())
        deadline = time.monotonic() + 15
        while otel.total("rlocks.waiting", name=name) != 1:
            assert time.monotonic() < deadline, "the waiting task never counted in"
            await asyncio.sleep(0.005)
        await holder.release()
        assert await task
        sync_client = redis.Redis.from_url(redis_url)
        assert engine_inspect.force_release(sync_client, NAMESPACE, "rlock", name)
        await asyncio.wait_for(inside, 15)
        sync_client.close()
        await client.aclose()

    asyncio.run(scenario())
    assert otel.histogram(
        "rlocks.acquire.duration", name=name + "-other", outcome="acquired", waited=False
    ).count == 1
    assert otel.points("rlocks.acquire.duration", name=name + "-other", waited=True) == []
    assert otel.total("rlocks.waiting", name=name) == 0
    assert [s.attributes["outcome"] for s in otel.spans(name)] == ["acquired"]


def _child(code: str, redis_url: str) -> str:
    env = dict(os.environ, RLOCKS_URL=redis_url)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_without_the_api_nothing_is_recorded(redis_url: str, name: str) -> None:
    out = _child(
        f"""
        import sys, threading
        sys.modules["opentelemetry"] = None  # the API cannot be imported
        import rlocks
        from rlocks._engine import metrics

        lock = rlocks.RLock({name!r})
        lock.acquire()
        waiter = threading.Thread(target=lambda: rlocks.RLock({name!r}).acquire(timeout=0.2))
        waiter.start(); waiter.join()  # an acquire that waits, then times out
        lock.release()
        with rlocks.Semaphore({name!r}, 1):
            pass
        assert metrics._resolved and metrics._instruments is None
        assert not any(m.startswith("opentelemetry.") for m in sys.modules)
        print("ok")
        """,
        redis_url,
    )
    assert out.strip() == "ok"


def test_global_provider_set_after_first_use(redis_url: str, name: str) -> None:
    # The default path: the global providers, configured after rlocks resolved its
    # instruments (the API's proxies forward to a provider set later).
    out = _child(
        f"""
        import rlocks
        with rlocks.RLock({name!r}):
            pass
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        with rlocks.RLock({name!r}):
            pass
        data = reader.get_metrics_data()
        names = {{m.name: m for r in data.resource_metrics for s in r.scope_metrics
                 for m in s.metrics}}
        print(sum(p.count for p in names["rlocks.acquire.duration"].data.data_points))
        """,
        redis_url,
    )
    assert out.strip() == "1"  # the acquire after set_meter_provider, not the one before


def test_plot_percentiles_follow_histogram_quantile() -> None:
    # benchmarks/otel_plot.py reads percentiles off bucket counts as Prometheus's
    # histogram_quantile does: linear inside the bucket that holds the rank.
    from benchmarks.otel_plot import _quantile

    bounds = (0.001, 0.01, 0.1)
    assert _quantile(0.5, bounds, [0, 10, 0, 0]) == pytest.approx(0.0055)
    assert _quantile(0.25, bounds, [10, 10, 20, 0]) == pytest.approx(0.001)
    assert _quantile(0.75, bounds, [10, 10, 20, 0]) == pytest.approx(0.055)
    assert _quantile(0.99, bounds, [0, 0, 0, 5]) == 0.1  # +Inf bucket: the last bound
    assert _quantile(0.5, bounds, [0, 0, 0, 0]) is None


def test_a_quorum_lock_reports_as_a_single_server_one(otel: Telemetry, name: str) -> None:
    """On a Quorum: an uncontended acquire and its hold as usual (waited=False, no
    span); a waiter between tries is counted waiting, spans its wait, and its grant
    after the wait counts as a hand-over (before, a waiting quorum acquire reported
    waited=False and never counted in)."""
    from .test_quorum import PATIENT, Masters

    masters = Masters(3)
    try:
        lock = rlocks.RLock(name, client=masters.quorum(PATIENT), ttl=10)
        _, t0, t1 = timed(lock.acquire)
        plain = otel.histogram(
            "rlocks.acquire.duration", name=name, outcome="acquired", waited=False
        )
        assert plain.count == 1 and plain.sum <= t1 - t0
        assert otel.spans(name) == []

        def wait_then_release() -> Tuple[float, float]:
            w0 = time.monotonic()
            assert lock.acquire(timeout=60)
            w1 = time.monotonic()
            lock.release()
            return w0, w1

        thread, out = in_thread(wait_then_release)
        wait_for(lambda: otel.total("rlocks.waiting", name=name) == 1, "the waiter to wait")
        seen = time.monotonic()
        time.sleep(0.1)  # a wait of known length (bounds from readings around it)
        released_at = time.monotonic()
        lock.release()
        w0, w1 = joined(thread, out)
        granted = otel.histogram(
            "rlocks.acquire.duration", name=name, outcome="acquired", waited=True
        )
        assert granted.count == 1 and released_at - seen <= granted.sum <= w1 - w0
        assert otel.total("rlocks.handovers", name=name) == 1
        assert otel.total("rlocks.waiting", name=name) == 0
        assert [s.attributes["outcome"] for s in otel.spans(name)] == ["acquired"]
        hold = otel.histogram("rlocks.hold.duration", name=name, end="released")
        assert hold.count == 2 and hold.attributes["kind"] == "rlock"
    finally:
        masters.stop()


def test_the_docs_table_lists_every_instrument_with_its_kind_and_unit() -> None:
    """docs/metrics.md is the one list of the instruments (the engine's docstring points
    there): each row's name, instrument and unit are what the engine creates."""
    from pathlib import Path

    from rlocks._engine.metrics import _Instruments

    created = {}

    class Meter:
        def __getattr__(self, method: str) -> Callable[..., None]:
            def create(name: str, unit: str = "", **_: Any) -> None:
                kind = method[len("create_"):].replace("_", "-")
                created[name] = (kind, "" if unit.startswith("{") else unit)
            return create

    _Instruments(Meter(), tracer=None)
    page = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
    rows = {}
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `rlocks."):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0].strip("`")] = (cells[1].replace(" ", "-"), cells[2])
    assert rows == created


def test_a_condition_wait_that_waits_to_retake_its_lock_leaves_no_wait_open(
    otel: Telemetry, client: Any, name: str
) -> None:
    """A Condition wait that has to wait for its lock back counts as waiting while it does,
    and no longer once it holds again: the thread's next acquire did not wait."""
    lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    cond = rlocks.Condition(lock)
    other = rlocks.RLock(name + "-other", client=client, namespace=NAMESPACE)
    waiting = threading.Event()

    def waiter() -> Tuple[float, float]:
        with cond:
            waiting.set()
            assert cond.wait(10)
        assert otel.total("rlocks.waiting", name=name) == 0
        _, t0, t1 = timed(other.acquire)
        other.release()
        return t0, t1

    thread, out = in_thread(waiter)
    assert waiting.wait(10)
    with cond:
        cond.notify()
        # Keep the lock a while: the woken wait is refused and waits to take it back.
        wait_for(lambda: otel.total("rlocks.waiting", name=name) == 1, "the wait to wait")
    (t0, t1) = joined(thread, out)
    acquired = otel.histogram("rlocks.acquire.duration", name=name + "-other",
                              outcome="acquired", waited=False)
    assert acquired.count == 1 and acquired.sum <= t1 - t0
    assert otel.total("rlocks.waiting", name=name) == 0


def test_event_and_barrier_waits_count_as_waiting(otel: Telemetry, client: Any,
                                                  name: str) -> None:
    event = rlocks.Event(name, client=client, namespace=NAMESPACE)
    barrier = rlocks.Barrier(name, 2, client=client, namespace=NAMESPACE)
    waiting = [in_thread(lambda: event.wait(30)), in_thread(lambda: barrier.wait(30))]
    wait_for(lambda: otel.total("rlocks.waiting", name=name, kind="event") == 1
             and otel.total("rlocks.waiting", name=name, kind="barrier") == 1,
             "one Event and one Barrier waiter counted")
    event.set()
    assert barrier.wait(30) in (0, 1)
    assert joined(*waiting[0]) is True and joined(*waiting[1]) in (0, 1)
    assert otel.total("rlocks.waiting", name=name) == 0
    event.clear()
