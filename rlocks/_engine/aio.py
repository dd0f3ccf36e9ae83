"""asyncio drivers for the engine: the same primitives, with awaited I/O.

An ``rlocks.asyncio`` primitive *is* its synchronous twin (same scripts, keys, argument
building, reply handling and local bookkeeping, inherited) with three things swapped:

- the owner is the running **task** (``identity.task_owner``), not the thread;
- the round trips are awaited on a ``redis.asyncio`` client, between the same I/O-free
  ``_begin_*`` / ``_finish_*`` halves the synchronous methods use;
- waiting and renewal run on the event loop: one wake-up hub (one subscriber connection)
  per loop, pool and namespace, and one renewal task per loop, both subclasses of the
  thread versions that only replace how they block and send.

Nothing here blocks the event loop: the hub's and renewer's table mutexes are held only
for table updates, never across an ``await``.

Cancellation: a task cancelled while its acquire script is in flight cannot know whether
it was granted. The attempt is shielded; on cancellation the task waits for that script's
answer and, if it granted a hold, gives the hold back before re-raising, so a cancelled
acquire leaves nothing behind. A second cancellation during that clean-up leaves the
hold to end with its lease.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import weakref
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Set, Tuple, cast

from . import checks, identity, metrics, renewal
from .clients import CONNECT_TIMEOUT, DEFAULT_URL, SOCKET_TIMEOUT, io_client, pool_of
from .clock import monotonic
from .dialogue import adrive
from .primitive import Carry, Primitive, QuorumOp, QuorumStep
from .queued import CALL, LISTEN, READ, WAIT, Op, Steps, acquire_steps
from .quorum import Quorum
from .reentrant import OwnerViews
from .renewal import Item, Renewer
from .scripts import Call, Reply, Script, arun, new_op, op_stream, with_op
from .state import PrimitiveState, afind
from .waiting import LINK_ERRORS
from .wakehub import READ_TURN, HubOp, HubStep, Waiter, WakeHub, serial

__all__ = ["AsyncPrimitive", "agather", "async_hub_for", "default_async_client", "loop_renewer"]

log = logging.getLogger(__name__)


def _loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def cancel_requests() -> int:
    """How many cancellations of the running task are pending (0 outside a task)."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def raise_absorbed_cancel(before: int) -> None:
    """Raise CancelledError if the running task was cancelled since ``before`` (from
    :func:`cancel_requests`) without it being raised: redis.asyncio can absorb a cancel
    that arrives while it reads an answer, returning the answer normally, or turning it
    into its TimeoutError when the cancel races its read timeout (Python 3.11's
    ``asyncio.timeout``). Not raised, the cancelled task would go on waiting."""
    if cancel_requests() > before:
        raise asyncio.CancelledError()


async def _wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait for ``event`` at most ``timeout`` s; whether it is set. Never eats a cancel.

    Not ``asyncio.wait_for``: before Python 3.12 it returns normally, swallowing the
    cancellation, when the task is cancelled just as the event is set, and a cancelled
    waiter would then go on waiting.
    """
    waiting = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiting}, timeout=timeout)
    finally:
        waiting.cancel()
    return event.is_set()


# -- the default client -------------------------------------------------------------------

# A redis.asyncio client's connections belong to the loop that opened them, so the default
# client is one per URL *per loop*.
_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Dict[str, Any]]" = (
    weakref.WeakKeyDictionary()
)


def default_async_client() -> Any:
    """The shared ``redis.asyncio`` client for ``RLOCKS_URL`` on the running loop."""
    import os

    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    url = os.environ.get("RLOCKS_URL") or DEFAULT_URL
    per_loop = _clients.setdefault(_loop(), {})
    client = per_loop.get(url)
    if client is None:
        client = per_loop[url] = redis.asyncio.Redis.from_url(
            url,
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=CONNECT_TIMEOUT,
            retry=Retry(NoBackoff(), 0),
        )
    return client


# -- waiting ------------------------------------------------------------------------------


class AsyncWakeHub(WakeHub):
    """The wake-up hub of one event loop: an asyncio task instead of a thread.

    Its table, wake policy and message handling are :class:`WakeHub`'s; only the reader
    loop, the nudge and the events (``asyncio.Event``) differ.
    """

    _event_type = asyncio.Event
    _lock_type = asyncio.Lock

    def _start_locked(self) -> None:
        self._runner = _loop().create_task(self._arun(), name="rlocks-wakeup-hub")

    def _nudge(self) -> None:
        _background(self._anudge())

    async def _anudge(self) -> None:
        try:
            await self._io.publish(self._control, b"")
        except Exception:  # noqa: BLE001 - the waiter's own next attempt will report it
            log.debug("could not nudge the asyncio wake-up hub", exc_info=True)

    async def await_subscribed(self, waiter: Waiter, timeout: float) -> bool:
        return await _wait_event(waiter.channel.confirmed, timeout)

    async def _arun(self) -> None:
        await adrive(self._reader_steps(), self._aperform)

    async def _aperform(self, step: HubStep) -> Any:
        """Do one step of :meth:`WakeHub._reader_steps`, awaited (the hub's task)."""
        what, pubsub, arg = step
        if what == HubOp.OPEN:
            return self._io.pubsub()
        if what == HubOp.SUBSCRIBE:
            return await pubsub.subscribe(*arg)
        if what == HubOp.UNSUBSCRIBE:
            return await pubsub.unsubscribe(*arg)
        if what == HubOp.READ:
            return await pubsub.get_message(timeout=arg)
        if what == HubOp.PAUSE:
            return await asyncio.sleep(arg)
        return await pubsub.aclose()


# Weak values, as for the threading hubs (see "Lifetime" in waiting.py): an idle hub's task
# ends and the hub, with its client, is forgotten.
_hubs: """weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, weakref.WeakValueDictionary[Tuple[int, str], AsyncWakeHub]
]""" = (
    weakref.WeakKeyDictionary()
)


def async_hub_for(client: Any, namespace: str) -> AsyncWakeHub:
    """The running loop's hub for ``client``'s pool and ``namespace``."""
    per_loop = _hubs.get(_loop())
    if per_loop is None:
        per_loop = _hubs[_loop()] = weakref.WeakValueDictionary()
    key = (id(pool_of(client)), namespace)
    hub = per_loop.get(key)
    if hub is None:
        hub = per_loop[key] = AsyncWakeHub(client, namespace)
    return hub


# -- renewal ------------------------------------------------------------------------------


class AsyncRenewer(Renewer):
    """The lease renewer of one event loop: an asyncio task instead of a thread.

    Batching, scheduling and reply handling are :class:`Renewer`'s; the loop awaits.
    """

    def __init__(self) -> None:
        super().__init__()
        self._event: Optional[asyncio.Event] = None

    def _start_locked(self) -> None:
        self._event = asyncio.Event()
        self._runner = _loop().create_task(self._arun(), name="rlocks-renewer")

    def _notify_locked(self) -> None:
        if self._event is not None:
            self._event.set()

    async def _arun(self) -> None:
        try:
            await self._aloop()
        except asyncio.CancelledError:
            # Cancelled by code that cancels every task of a loop that goes on (a
            # shutdown handler): the next lease added starts a new task (``stopped``),
            # which renews these too; until then nothing does. Said, not silent.
            with self._mutex:
                owners = [lease.ref() for lease in self._leases.values() if lease.kind == "h"]
            holds = sum(1 for owner in owners if isinstance(owner, Primitive))
            entries = sum(1 for owner in owners if owner is not None) - holds
            if holds:
                log.warning(
                    "the rlocks lease renewer of this event loop was cancelled with %d "
                    "hold(s) to renew: none is renewed until the loop's next acquire, "
                    "and a hold not released by then ends with its lease", holds,
                )
            if entries:
                # (a Condition's notified entries, kept or being ended: see condition.py)
                log.warning(
                    "the rlocks lease renewer of this event loop was cancelled with %d "
                    "notified Condition entr%s to renew or end: one that ends with its "
                    "lease gives its notification to another waiter as well",
                    entries, "y" if entries == 1 else "ies",
                )
            raise

    async def _aloop(self) -> None:
        idle_since: Optional[float] = None
        while True:
            with self._mutex:
                batch, pause, idle_since = self._schedule_locked(monotonic(), idle_since)
                if pause is None:
                    return
                assert self._event is not None
                self._event.clear()
            if batch:
                groups = self._groups(batch)
                # Concurrently: one slow or unreachable Redis must not delay the others,
                # nor one group's unexpected error end the others' renewals.
                results = await asyncio.gather(
                    *(self._arenew_on(client, items) for client, items in groups),
                    return_exceptions=True,
                )
                for (_client, items), result in zip(groups, results):
                    if isinstance(result, BaseException):
                        # A cancel of this task raises from the gather itself; a group
                        # cancelled on its own, unasked, fails like an unexpected error.
                        error = result if isinstance(result, Exception) else RuntimeError(
                            f"renewal interrupted: {result!r}")
                        self._unexpected([(lease, prim) for lease, prim, _ in items], error)
                continue
            await _wait_event(self._event, max(0.0, pause))

    async def _arenew_on(self, client: Any, items: List[Item]) -> None:
        if isinstance(client, Quorum):
            sent = monotonic()
            per_master = await agather(client, lambda m: self._asend(m, items))
            self._apply_quorum(client, items, per_master, sent)
            return
        await self._adrive(client, items, self._renew_steps(items))

    async def _asend(self, client: Any, items: List[Item]) -> List[Any]:
        """One renewal pipeline on one master of a quorum (script cache reloaded)."""
        return await self._adrive(client, items, renewal.send_steps(items))

    async def _adrive(self, client: Any, items: List[Item], steps: renewal.Steps) -> List[Any]:
        """The asyncio driver of a renewal dialogue (see ``Renewer._drive``)."""
        client = io_client(client)  # bounded, never re-sent (see clients.io_client)

        async def perform(script: Optional[Script]) -> Any:
            if script is None:
                return await self._queue(client, items).execute(raise_on_error=False)
            return await client.script_load(script.source)

        return await adrive(steps, perform)


async def agather(
    quorum: Quorum, fn: Callable[[Any], Awaitable[Any]], masters: Optional[Sequence[Any]] = None
) -> List[Any]:
    """``await fn(master)`` on every master (or on ``masters``) at once: each result or
    the Exception it raised, in order (the asyncio twin of ``Quorum.map``). A
    cancellation propagates."""
    chosen = quorum.masters if masters is None else tuple(masters)
    results = await asyncio.gather(*(fn(m) for m in chosen), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result
    return list(results)


_renewers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncRenewer]" = (
    weakref.WeakKeyDictionary()
)


def loop_renewer() -> AsyncRenewer:
    """The running loop's renewer."""
    loop = _loop()
    renewer = _renewers.get(loop)
    if renewer is None:
        renewer = _renewers[loop] = AsyncRenewer()
    return renewer


# -- background work that must not be garbage-collected mid-flight -------------------------

_pending: Set["asyncio.Task[Any]"] = set()


def _background(coro: Awaitable[Any]) -> None:
    task = asyncio.ensure_future(coro)
    _pending.add(task)
    task.add_done_callback(_pending.discard)


def _log_failure(what: str, task: "asyncio.Task[Any]") -> None:
    """Done-callback of a callback task: forget it; log how it failed, if it did."""
    _pending.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("%s raised", what, exc_info=task.exception())


# -- the driver mixin ---------------------------------------------------------------------


class AsyncPrimitive(Primitive):
    """Engine base of an asyncio primitive.

    Combined with a primitive's I/O-free definition (its kind, scripts and arguments), it
    swaps the client check and the renewer and provides awaited versions of the engine's
    operations (``_aacquire``, ``_arelease``, ``_arun_call``); the asyncio twins' public
    methods are thin ``async def`` wrappers around them. It is *not* a subclass of the
    synchronous primitives: an asyncio lock is never mistaken for a threading one.
    """

    __slots__ = ()

    _awaits_on_lost = True

    @staticmethod
    def _owner() -> str:
        return identity.task_owner()  # see Primitive._owner

    def __enter__(self) -> None:
        raise TypeError(f"{self._label} is for asyncio: use 'async with', not 'with'")

    def __exit__(self, *exc_info: Any) -> None:  # pragma: no cover - __enter__ refuses
        raise TypeError(f"{self._label} is for asyncio: use 'async with', not 'with'")

    def _resolve_client(self, client: Any) -> Any:
        import redis.asyncio

        label = f"{self._label}({self._name!r})"
        if client is None:
            # Built lazily, on first use inside the loop: construction does no I/O and may
            # happen outside any loop.
            return None
        if isinstance(client, Quorum):
            if self._quorum_refusal is not None:
                raise ValueError(f"{label}: client is a Quorum, but {self._quorum_refusal}")
            if not client.is_async:
                raise TypeError(
                    f"{label}: the Quorum's clients are redis.Redis clients; this primitive "
                    f"needs redis.asyncio ones (use rlocks.{self._label.split('.')[-1]} for "
                    "synchronous clients)"
                )
            return client
        if not isinstance(client, (redis.asyncio.Redis, redis.asyncio.RedisCluster)):
            raise TypeError(
                f"{label}: client must be a redis.asyncio.Redis or RedisCluster, not "
                f"{type(client).__name__} (use rlocks.{self._label.split('.')[-1]} for "
                "synchronous clients)"
            )
        return client

    def _aclient(self) -> Any:
        client = self._client
        if client is None:
            client = default_async_client()
        return client

    def _renewer(self) -> Renewer:
        return loop_renewer()

    def _renewal_client(self) -> Any:
        # Asked by the loop's renewer task, on that loop: a primitive built with
        # client=None renews through that loop's default client, as it acquired.
        return self._aclient()

    def _ahub(self) -> AsyncWakeHub:
        """:meth:`Primitive._hub` for the running event loop: its hub, kept by this object
        while it is used from that loop (no I/O)."""
        loop = _loop()
        kept = self._kept_hub
        if kept is not None and kept[0]() is loop:
            return cast(AsyncWakeHub, kept[1])
        hub = async_hub_for(self._aclient(), self._namespace)
        # The loop by weak reference: a closed loop is not kept alive by its primitives.
        self._kept_hub = (weakref.ref(loop), hub)
        return hub

    def _hub_here(self) -> Optional[WakeHub]:
        """:meth:`Primitive._hub_here` for the running event loop (None outside one):
        its hub is touched only from the loop's thread."""
        kept = self._kept_hub
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        if kept is not None and kept[0]() is loop:
            return cast(AsyncWakeHub, kept[1])
        return cast(Optional[WakeHub], self._local_hub())

    def _channel(self, hub: Optional[WakeHub] = None) -> str:
        """:meth:`Primitive._channel`; by default, the running event loop's hub's."""
        return super()._channel(hub or self._ahub())

    async def _astatistics(self) -> PrimitiveState:
        """``_statistics`` awaited (its asyncio twin): the same read-only round trips,
        on a Quorum one to each master at once and what a majority agrees on."""
        client = self._aclient()
        if isinstance(client, Quorum):

            async def found(master: Any) -> List[PrimitiveState]:
                return await afind(master, self._namespace, self._name, kind=self._kind)

            return self._agreed_state(client, await agather(client, found))
        return self._state_from(await afind(client, self._namespace, self._name, kind=self._kind))

    def _call_on_lost(self, on_lost: Callable[[Any], object]) -> None:
        """``async def`` callbacks become a task on the loop that found the loss (where the
        owner's renewer and release run); plain functions run on the callback thread, as
        for the threading primitives, so a slow one blocks neither this loop nor renewal.
        """
        if not inspect.iscoroutinefunction(on_lost):
            super()._call_on_lost(on_lost)
            return
        what = f"on_lost callback of {self._describe()}"
        try:
            loop = _loop()
        except RuntimeError:  # pragma: no cover - losses are found on the owner's loop
            log.error("%s not run: no running event loop", what)
            return
        task = loop.create_task(on_lost(self))
        _pending.add(task)
        task.add_done_callback(functools.partial(_log_failure, what))

    async def _arun_call(self, call: Call, op: Optional[str] = None) -> Reply:
        """``call`` awaited (``op``: its op id; ``None``: a fresh one of the task)."""
        # Through clients.io_client: bounded, never re-sent by redis-py.
        client = io_client(self._aclient())
        args = call.args if op is None else with_op(call.args, op)
        return await arun(client, call.script, call.keys, args, call.replication)

    def _local_hub(self) -> Any:
        per_loop = _hubs.get(_loop())
        if per_loop is None:
            return None
        return per_loop.get((id(pool_of(self._aclient())), self._namespace))

    async def _adrive(self, steps: Steps) -> bool:
        """The asyncio driver of a :mod:`.queued` dialogue (see ``Primitive._drive``).

        Script calls are shielded: cancelled while one is in flight, the task still reads
        its answer (``Op.late``) so the dialogue can give back a grant nobody records, and
        the clean-up calls the dialogue then asks for run to their end.
        """
        return bool(await adrive(steps, self._aperform))

    async def _aperform(self, op: Op) -> Any:
        """Do one step of a :mod:`.queued` dialogue, awaited (see :meth:`_adrive`)."""
        if op.kind == CALL:
            assert op.call is not None
            inner = asyncio.ensure_future(self._arun_call(op.call, op.opid))
            try:
                return await asyncio.shield(inner)
            except asyncio.CancelledError:
                try:
                    op.late = await inner
                except BaseException:  # noqa: BLE001 - the cancel is what goes on
                    pass
                raise
        if op.kind == WAIT:
            assert op.waiter is not None
            return await _wait_event(op.waiter.event, op.timeout)
        if op.kind == LISTEN:
            # (A cancel during the BLPOP closes its connection: an element popped then is
            # lost, and the dialogue's clean-up leaves, passing on a grant it carried.)
            assert op.waiter is not None and op.hub is not None
            io = io_client(self._aclient())
            pop = op.hub.to_pop(op.waiter, op.timeout, io)
            if pop is None:
                return True
            before = cancel_requests()
            try:
                result: Any = op.hub.popped(op.waiter, await io.blpop(*pop))
            except LINK_ERRORS as exc:
                result = exc  # for the dialogue: its next call meets the broken link
            # (After the popped line went to the hub: a grant it carried is then given
            # back by the dialogue's clean-up.)
            raise_absorbed_cancel(before)
            return result
        if op.kind == READ:
            # Shielded as a script call is: an edge's deletion runs to its end. One read
            # at a time per hub, as in Primitive._perform.
            client = io_client(self._aclient())  # bounded, never re-sent
            # (an ended wait's edge deletion takes no turn: see Op)
            reads = self._ahub().reads if op.turn else None
            try:
                if reads is not None:
                    await asyncio.wait_for(reads.acquire(), READ_TURN)
            except asyncio.TimeoutError:
                # a failed check: the wait goes on, the next check comes later
                raise TimeoutError("another waiter's deadlock check is reading") from None
            try:
                read = asyncio.ensure_future(client.execute_command(*op.command))
                try:
                    return await asyncio.shield(read)
                except asyncio.CancelledError:
                    try:
                        await read
                    except BaseException:  # noqa: BLE001 - the cancel is what goes on
                        pass
                    raise
            finally:
                if reads is not None:
                    reads.release()
        assert op.waiter is not None
        return await _wait_event(op.waiter.channel.confirmed, op.timeout)

    @metrics.measure_async_acquire
    async def _aacquire(self, owner: str, count: int, wait: Optional[float]) -> bool:
        """:meth:`Primitive._acquire`, awaited; cancellation-safe (see the module doc)."""
        if isinstance(self._client, Quorum):
            return await self._aquorum_acquire(self._client, owner, count, wait)
        hub = self._ahub() if wait != 0.0 else None
        return await self._adrive(acquire_steps(self, owner, count, wait, hub))

    async def _aquorum_acquire(
        self, quorum: Quorum, owner: str, count: int, wait: Optional[float]
    ) -> bool:
        """:meth:`Primitive._quorum_acquire`, awaited (the same dialogue). A try cancelled
        in flight still reads every master's answer and gives back what they granted."""
        loop = _loop()
        woken = asyncio.Event()

        def released() -> None:
            loop.call_soon_threadsafe(woken.set)

        async def perform(step: QuorumStep) -> Any:
            what, call, arg = step
            if what is QuorumOp.PAUSE:
                await _wait_event(woken, arg)
                return None
            assert call is not None
            if what is QuorumOp.TRY:
                woken.clear()  # a release from now on cuts the pause
                inner = asyncio.ensure_future(agather(quorum, self._on(call)))
                try:
                    return await asyncio.shield(inner)
                except asyncio.CancelledError:
                    try:
                        late = await inner
                        granted = [m for m, r in zip(quorum.masters, late)
                                   if isinstance(r, Reply) and r.granted]
                        undo = self._release_call(owner, count)
                        await agather(quorum, self._on(undo), granted)
                    except BaseException:  # noqa: BLE001 - a second cancel: leases end them
                        log.debug("%s: cancelled grants left to their lease", self._label)
                    raise
            return await asyncio.shield(agather(quorum, self._on(call), arg))  # RELEASE

        quorum.listen(released)
        try:
            steps = self._quorum_acquire_steps(quorum, owner, count, wait)
            return bool(await adrive(steps, perform))
        finally:
            quorum.unlisten(released)

    def _on(self, call: Call) -> Callable[[Any], Awaitable[Reply]]:
        """``call`` as a function of one master's client (bounded, never re-sent)."""

        async def run_on(client: Any) -> Reply:
            return await arun(
                io_client(client), call.script, call.keys, call.args, call.replication
            )

        return run_on

    async def _aextend(self, owner: str, ttl: Optional[float]) -> None:
        """:meth:`Primitive._extend`, awaited."""
        call = self._begin_extend(owner, ttl)
        self._finish_extend(owner, await self._arun_quorum_or_one(call))

    async def _arun_quorum_or_one(self, call: Call, op: Optional[str] = None) -> Reply:
        """A release or renew ``call`` on the client, or on every master of a quorum
        (then the majority's answer, as ``Primitive._quorum_reply``)."""
        quorum = self._client
        if not isinstance(quorum, Quorum):
            return await self._arun_call(call, op)
        try:
            results = await agather(quorum, self._on(call))
            return self._quorum_verdict(quorum, results, call.script is self._release_script)
        finally:
            if call.script is self._release_script:
                quorum.released()

    async def _aend_release(
        self,
        owner: str,
        carry: Optional[Carry],
        running: "asyncio.Future[Reply]",
        pending: Optional[str],
    ) -> None:
        """End a release whose caller stopped awaiting it (cancelled, or it failed) once
        ``running`` is over. Its ``carry``: the waiter it queued may have stopped waiting
        too, and is then taken out in its name only after the script ran. Its answer,
        which nobody else reads (the books dropped the hold): a hold the release found
        gone is reported lost, as the caller would have been told; without an answer, so
        is a loss the renewer found meanwhile (``pending``, see ``_mark_releasing``)."""
        try:
            reply: Optional[Reply] = await running
        except BaseException:  # noqa: BLE001 - its failure was the caller's to report
            reply = None
        if carry is not None:
            leave = self._carry_end(owner, carry, reply)
            if leave is not None:
                await self._aleave_for(leave)
        if reply is not None and reply.not_owner:
            self._report_lost(owner, "its hold was gone at release")
        elif reply is None and pending is not None:
            self._report_lost(owner, pending)

    async def _aleave_for(self, call: Call) -> None:
        """:meth:`Primitive._leave_for`, awaited (shielded: it runs to its end)."""
        try:
            await asyncio.shield(self._arun_quorum_or_one(call, new_op(op_stream())))
        except Exception:  # noqa: BLE001 - the entry ends with its short lease
            log.debug("%s: leave for a waiter that stopped failed", self._describe(),
                      exc_info=True)

    async def _arelease(self, owner: str, count: int) -> int:
        """:meth:`Primitive._release`, awaited; returns the holds left in Redis."""
        call, carry = self._begin_release(owner, count)
        sent = serial()
        op = new_op(op_stream())
        running = asyncio.ensure_future(self._arun_quorum_or_one(call, op))
        try:
            # (marked before the release can run: it runs only once this task awaits it)
            self._mark_releasing(owner, count)
            # Shielded: a release cancelled half-way still reaches Redis instead of
            # leaving the hold there until its lease ends.
            reply = await asyncio.shield(running)
        except BaseException as exc:
            # The release runs on (or failed): its outcome ends the carry and tells a
            # loss (see _aend_release).
            _background(self._aend_release(owner, carry, running, self._take_pending(owner)))
            self._record_release(owner, count)
            if isinstance(exc, Exception) and not isinstance(self._client, Quorum):
                self._unsettle(owner, count, op)
            raise
        leave = self._carry_end(owner, carry, reply)
        if leave is not None:
            await self._aleave_for(leave)
        self._finish_release(owner, count, reply)
        self._deliver(reply, sent)
        return reply.holds


class AsyncReentrantLock(AsyncPrimitive, OwnerViews):
    """The ``asyncio.Lock``-style surface of a task-owned reentrant lock.

    Placed before a synchronous :class:`~rlocks._engine.reentrant.ReentrantLock` class
    (RLock, an RWLock side) to make its asyncio twin.
    """

    __slots__ = ()

    async def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Acquire the lock for the running task, or re-enter it if the task holds it.

        Waits (without blocking the event loop) while another owner holds it: forever
        with ``timeout=None`` (the default: ``asyncio.Lock.acquire`` has no timeout, so
        its twin's "forever" is ``None``; threading's ``-1`` means the same here), at most
        ``timeout`` seconds otherwise, not at all with ``blocking=False``. Returns True
        once held, False if not in time. Cancelling the waiting task leaves nothing
        behind, not even a hold granted as it was cancelled.

        Raises TypeError / ValueError / OverflowError for bad arguments before any I/O,
        LockLostError if this task's hold was lost and not yet released, redis-py errors
        when Redis cannot be reached.
        """
        seconds = -1 if timeout is None else timeout
        wait = checks.lock_wait(blocking, seconds, self._label, self._name)
        return await self._aacquire(self._owner(), 1, wait)

    async def release(self) -> None:
        """Release one level of the running task's hold (awaited: it is a round trip).

        Raises RuntimeError (NotOwnedError) when the task does not hold the lock, without
        I/O; LockLostError when its hold had already ended in Redis.
        """
        await self._arelease(self._owner(), 1)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        if not self._exit_reported_loss(exc, self._owner()):
            await self.release()

    async def extend(self, ttl: Optional[float] = None) -> None:
        """Make the running task's hold last at least ``ttl`` seconds from now (one round
        trip; ``None``: the lock's ``ttl``). Never shortens a lease. Same errors as
        :meth:`rlocks.RLock.extend`, for the running task."""
        await self._aextend(self._owner(), ttl)

    async def statistics(self) -> PrimitiveState:
        """Holders, counts, leases and waiting processes, read from Redis now (awaited:
        a few read-only round trips; with a Quorum, what a majority of the masters
        agree on). Returns the frozen dataclass :meth:`rlocks.RLock.statistics` returns.
        Redis errors propagate."""
        return await self._astatistics()
