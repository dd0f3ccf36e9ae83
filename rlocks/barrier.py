"""``rlocks.Barrier``: ``threading.Barrier`` across processes and hosts."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ._engine import identity, metrics
from ._engine.barrier import BarrierCore
from ._engine.constructors import public_init
from ._engine.primitive import ENTRY_LEASE
from ._engine.steps import drive

__all__ = ["Barrier"]


class Barrier(BarrierCore):
    """A barrier for ``parties`` threads, in any process that uses the same name and Redis.

    ``Barrier(name, parties, action=None, timeout=None, *, client=None,
    namespace="rlocks", entry_lease=2.0)``: as ``threading.Barrier(parties, action,
    timeout)``, shared by every object of that name: a generation passes when
    ``parties`` waits, from any threads of any processes, have arrived. Every process
    must pass the same ``parties``: a wait, ``abort`` or ``reset`` that finds the barrier
    in Redis with another count raises ValueError naming both. Bad arguments raise
    TypeError / ValueError naming the barrier, before any I/O; construction does no I/O.

    ``action`` (a callable) runs once per generation, in the last party to arrive,
    before any party's wait returns; if it raises, the barrier breaks and the error
    reaches that party. It may run for the wait's time-out if one applies (at least
    ``entry_lease``), else 60 s (``rlocks._engine.barrier.ACTION_LEASE``): an action
    running longer is counted dead, and the waiting parties break the barrier.

    ``entry_lease`` (seconds): a waiting party's lease, renewed every third of it while
    it waits. A party whose process dies while waiting breaks the barrier for the others
    within about ``entry_lease`` (they raise BrokenBarrierError) instead of hanging them.
    A party whose process stalls (or cannot reach Redis) for longer is counted gone too.
    ``client``: a ``redis.Redis`` or ``RedisCluster`` (``None``: ``RLOCKS_URL``); a Quorum
    is refused (a barrier's parties live on one server).
    """

    __slots__ = ()

    _label = "rlocks.Barrier"

    @public_init
    def __init__(self, name: str, parties: int, action: Optional[Callable[[], object]] = None,
                 timeout: Optional[float] = None, *, client: Any = None,
                 namespace: str = "rlocks", entry_lease: float = ENTRY_LEASE) -> None:
        super().__init__(name, parties, action, timeout, client, namespace, entry_lease)

    # -- threading.Barrier ------------------------------------------------------------------

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait until ``parties`` parties have called ``wait`` (in any process), and return
        this party's arrival index, 0 to ``parties - 1``, unique in its generation.

        ``timeout`` (seconds, counted from the arrival; ``None``: the barrier's own
        ``timeout``, which may be ``None``: no limit): when it runs out the party breaks
        the barrier and raises BrokenBarrierError, as in threading (not while the action
        of its full generation runs: that one is as good as passed). Raises
        :class:`~rlocks.errors.BrokenBarrierError` (also a
        ``threading.BrokenBarrierError``) at once when the barrier is broken, and when it
        breaks or is reset while waiting. The last party runs ``action`` first (see the
        class). An interrupt (Ctrl-C) while waiting breaks the barrier, then propagates.
        Through a broken link the arrival is sent again for up to ``entry_lease`` and
        each look until the time-out; then Redis errors propagate (a wait whose time-out
        ran out while Redis was unreachable raises BrokenBarrierError).

        In Redis: one script to arrive (the last arriver's also passes the generation,
        or one more after the action), then one per wake-up hint and at least one per
        ``entry_lease / 3`` that renews this party's lease.
        """
        seconds = self._wait_seconds(timeout)
        with metrics.waits(self):
            turn = drive(self._wait(identity.thread_owner(), seconds))
        if not turn.act:
            return int(turn.arrival)
        action = self._action
        assert action is not None
        try:
            action()
        except BaseException:
            drive(self._finish(turn, False))
            raise
        return int(drive(self._finish(turn, True)))

    def reset(self) -> None:
        """Return the barrier to the empty, unbroken state (one round trip, sent again
        for up to 5 s after a broken link, as are abort's and the reads'). Parties
        waiting now raise BrokenBarrierError; the next waits start a new generation at
        once. Removes the barrier's keys when nobody has an outcome to collect."""
        drive(self._reset(identity.thread_owner()))

    def abort(self) -> None:
        """Put the barrier into the broken state (one round trip): parties waiting now,
        and every wait until :meth:`reset`, raise BrokenBarrierError. A broken barrier's
        keys stay a day (``KEEP``) after its last change, unless reset."""
        drive(self._abort(identity.thread_owner()))

    @property
    def n_waiting(self) -> int:
        """How many parties wait in the generation filling now, in every process (0 while
        broken). One round trip (a property that does I/O, for threading's sake); like
        threading's, a snapshot that may change at once."""
        waiting, _broken = drive(self._peek(identity.thread_owner()))
        return int(waiting)

    @property
    def broken(self) -> bool:
        """Whether the barrier is broken. One round trip; a party whose lease ended
        while waiting (its process died) breaks it here if nobody did yet."""
        _waiting, broken = drive(self._peek(identity.thread_owner()))
        return bool(broken)
