"""What makes a lock not reentrant and owned by its process: ``rlocks.Lock``'s owners.

``threading.Lock`` is not reentrant (the holder's second acquire waits like anyone's) and
any thread may release it. On the engine that is a choice of owner ids, nothing more: a
fresh acquire asks as the calling thread's (task's) id, or, when this process already
holds the lock under that id, as a new id for this one acquire (``<id>.<n>``), so Redis
sees a second owner and queues it like any other; a release gives back this process's
hold, whichever thread (task) took it. The scripts, queue, lease, renewal and fencing are
the RLock's.

Why not one id per process: two threads of one process waiting at once would be one
waiter in the queue, and the holder's own second acquire would re-enter.
"""

from __future__ import annotations

import itertools
from typing import Any, List

from .. import errors
from . import identity
from .holds import HELD, LOST, held_here, peek

__all__ = ["ProcessOwned"]

_serials = itertools.count(1)


class ProcessOwned:
    """Mixin (before the lock surface) for ``rlocks.Lock`` and its asyncio twin."""

    __slots__ = ()

    _mine: Any
    _backend: Any
    _keys: Any
    _spec: Any

    def _caller(self) -> str:
        raise NotImplementedError  # the thread's id, or the running task's

    def _asker(self) -> str:
        """The owner a fresh acquire by the caller asks as (no I/O). LockLostError if this
        object's hold was lost and is not released yet (as an RLock's re-entry)."""
        for hold, _ in self._mine.values():
            if hold.state == LOST:
                raise self._lost_error(hold, "acquired again")  # type: ignore[attr-defined]
        base = self._caller()
        hold = peek(self._ident(base))  # type: ignore[attr-defined]
        if hold is None or hold.count <= 0:
            return base
        return f"{base}.{next(_serials)}"  # this process holds it as the caller already

    def _owner(self) -> str:
        """The owner of this process's hold that the caller speaks of (no I/O): the one
        the caller took, if it took one (held, lost or on its way out), else a held one,
        else any; the caller's id when the process holds none. A lost hold stays on the
        books until released, while another thread may hold the lock again meanwhile."""
        found = self._holds_here()
        caller = self._caller()
        for hold in found:
            if hold.owner == caller or hold.owner.startswith(caller + "."):
                return str(hold.owner)
        for hold in found:
            if hold.state == HELD:
                return str(hold.owner)
        for hold in found:
            return str(hold.owner)
        return caller

    def _holds_here(self) -> List[Any]:
        mine = [hold for hold, _ in list(self._mine.values())]
        return mine or held_here((self._backend.address, self._keys.hash, self._spec.side),
                                 identity.process_token() + ":")

    def _releasing(self) -> str:
        """The owner whose hold a release by the caller gives back (no I/O): as
        :meth:`_owner`, so a thread whose own hold was lost hears of the loss, and never
        gives back the hold another thread took since. The release dialogue claims it:
        a second release of one hold finds the lock not held. NotOwnedError when there
        is none."""
        if not self._holds_here():
            raise self._not_owned()
        return self._owner()

    def _not_owned(self, what: str = "release") -> Any:
        return errors.NotOwnedError(
            f"cannot {what} un-acquired lock {self._label}({self._shown}): "  # type: ignore[attr-defined]
            "this process does not hold it (a thread or task of the holding process may)",
            name=self._name)  # type: ignore[attr-defined]

    def _hold_object(self, owner: str) -> Any:
        """The object whose books hold ``owner``'s levels: this one, or another of this
        name (a release through it gives them back)."""
        if owner in self._mine:
            return self
        hold = peek(self._ident(owner))  # type: ignore[attr-defined]
        found = None if hold is None else hold.any_object()
        return self if found is None else found
