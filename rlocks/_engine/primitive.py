"""The base every rlocks primitive is built from.

A primitive is one Redis hash (owner id -> hold count), the scripts that change it, the
owner scope (thread or process) and a wake policy. This base class keeps the *local*
bookkeeping (which owners of this process hold how much, their leases, whether a hold was
lost) and runs the shared machinery: the acquire attempt and wait loop
(:mod:`.waiting`), lease renewal (:mod:`.renewal`) and lost-hold reporting.

Redis holds the truth; local state is a cache of what this process was granted. It is
changed under one module-wide mutex that is never held across a network call, so no
thread ever waits on another thread's round trip. The mutex is re-created in a fork child,
whose owner ids are new anyway (see :mod:`.identity`).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, ClassVar, Dict, List, Optional, Sequence, Tuple

from ..errors import LockLostError, NotOwnedError
from . import checks
from .clients import default_client, is_cluster
from .clock import monotonic
from .keys import PrimitiveKeys, keys_for
from .renewal import Lease, renewer
from .scripts import Arg, Call, Reply, Script
from .waiting import hub_for, wait_until_granted

__all__ = ["Hold", "Primitive"]

log = logging.getLogger("rlocks")

_bookkeeping = threading.Lock()
_MAX_CALLS = 64  # prepared script calls cached per primitive


def _reset_after_fork() -> None:
    global _bookkeeping
    _bookkeeping = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class Hold:
    """What one owner of this process holds on one primitive (local view)."""

    __slots__ = ("count", "lease", "lost")

    def __init__(self) -> None:
        self.count = 0
        self.lease: Optional[Lease] = None
        self.lost = False


class Primitive:
    """Engine base class. Subclasses set the class attributes and the ``_*_arguments``.

    Not public: users see :class:`rlocks.RLock` and friends.
    """

    __slots__ = (
        "_name",
        "_client",
        "_namespace",
        "_ttl",
        "_ttl_ms",
        "_auto_renew",
        "_on_lost",
        "_keys",
        "_holds",
        "_publish",
        "_calls",
        "__weakref__",
    )

    #: Public class name used in messages and reprs, e.g. ``"rlocks.RLock"``.
    _label: ClassVar[str] = "rlocks.Primitive"
    #: Key kind (see :mod:`.keys`); primitives sharing one hash share the kind.
    _kind: ClassVar[str] = ""
    _acquire_script: ClassVar[Script]
    _release_script: ClassVar[Script]
    _renew_script: ClassVar[Script]

    def __init__(
        self,
        name: str,
        *,
        client: Any = None,
        ttl: float = 30.0,
        auto_renew: bool = True,
        namespace: str = "rlocks",
        on_lost: Optional[Callable[[Any], object]] = None,
    ) -> None:
        label = self._label
        self._name = checks.check_name(name, label)
        self._namespace = checks.check_namespace(namespace, label, name)
        self._ttl_ms = checks.check_ttl(ttl, label, name)
        self._ttl = self._ttl_ms / 1000.0
        if on_lost is not None and not callable(on_lost):
            raise TypeError(
                f"{label}({name!r}): on_lost must be callable, not {type(on_lost).__name__}"
            )
        if client is None:
            client = default_client()
        elif not callable(getattr(client, "evalsha", None)):
            raise TypeError(
                f"{label}({name!r}): client must be a redis.Redis or "
                f"redis.cluster.RedisCluster, not {type(client).__name__}"
            )
        elif _is_async_client(client):
            raise TypeError(
                f"{label}({name!r}): client is a redis.asyncio client; "
                "this primitive needs a synchronous redis.Redis"
            )
        self._client = client
        self._auto_renew = bool(auto_renew)
        self._on_lost = on_lost
        self._keys: PrimitiveKeys = keys_for(namespace, self._kind, name)
        self._holds: Dict[str, Hold] = {}
        # Cluster servers deliver sharded messages only to the shard's subscribers.
        self._publish = "SPUBLISH" if is_cluster(client) else "PUBLISH"
        self._calls: Dict[Tuple[str, str, int, bool], Call] = {}

    # -- read-only facts -----------------------------------------------------------------

    @property
    def name(self) -> str:
        """The primitive's name, as given."""
        return self._name

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def ttl(self) -> float:
        """The lease, in seconds, that each hold gets (and gets again at each renewal)."""
        return self._ttl

    @property
    def client(self) -> Any:
        return self._client

    def _describe(self) -> str:
        return f"{self._label}({self._name!r})"

    # -- what a subclass provides --------------------------------------------------------

    def _acquire_arguments(self, owner: str, count: int) -> Tuple[Sequence[str], Sequence[Arg]]:
        raise NotImplementedError

    def _release_arguments(
        self, owner: str, count: int, everything: bool
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        raise NotImplementedError

    def _renew_arguments(self, owner: str) -> Tuple[Sequence[str], Sequence[Arg]]:
        raise NotImplementedError

    def _call(self, op: str, owner: str, count: int, flag: bool = False) -> Call:
        """The prepared script call for ``op`` by ``owner``.

        ``flag`` is, for "acquire", whether the owner already holds here (an argument
        builder may read ``self._held(owner)``); for "release", "give back everything".
        """
        key = (op, owner, count, flag)
        call = self._calls.get(key)
        if call is None:
            if op == "acquire":
                keys, args = self._acquire_arguments(owner, count)
                script = self._acquire_script
            else:
                keys, args = self._release_arguments(owner, count, flag)
                script = self._release_script
            if len(self._calls) >= _MAX_CALLS:
                # Owners are threads, and threads come and go: keep the cache bounded.
                self._calls.clear()
            call = self._calls[key] = Call(script, keys, args)
        return call

    # -- local bookkeeping (no I/O) ------------------------------------------------------

    def _held(self, owner: str) -> int:
        """How many holds ``owner`` has here, as far as this process knows."""
        hold = self._holds.get(owner)
        return hold.count if hold is not None else 0

    def _record_grant(self, owner: str, count: int, since: float) -> None:
        with _bookkeeping:
            hold = self._holds.get(owner)
            if hold is None:
                hold = self._holds[owner] = Hold()
            hold.count += count
            start_lease = self._auto_renew and hold.lease is None
        if start_lease:
            lease = renewer().add(self, owner, self._ttl, since)
            with _bookkeeping:
                if hold.count > 0 and hold.lease is None:
                    hold.lease = lease
                    lease = None  # type: ignore[assignment]
            if lease is not None:  # released meanwhile by another thread of this owner
                renewer().cancel(lease)

    def _record_release(self, owner: str, count: int) -> int:
        """Drop ``count`` local holds of ``owner``; returns how many are left."""
        lease = None
        with _bookkeeping:
            hold = self._holds.get(owner)
            if hold is None:
                return 0
            hold.count -= count
            left = hold.count
            if left <= 0:
                del self._holds[owner]
                lease = hold.lease
                hold.lease = None
        if lease is not None:
            renewer().cancel(lease)
        return max(left, 0)

    def _hold_lost(self, owner: str, reason: str, lease: Optional[Lease] = None) -> None:
        """Mark ``owner``'s hold lost (called by the renewer or by a release).

        With ``lease`` given, only if that lease is still the hold's current one: a
        renewal racing with a normal release must not report the released hold lost.
        """
        with _bookkeeping:
            hold = self._holds.get(owner)
            if hold is None or hold.count <= 0 or hold.lost:
                return
            if lease is not None and hold.lease is not lease:
                return
            hold.lost = True
            stale, hold.lease = hold.lease, None
        if stale is not None:
            renewer().cancel(stale)
        log.warning("%s lost by %s: %s", self._describe(), owner, reason)
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:  # noqa: BLE001 - a callback must not break the renewer
                log.exception("on_lost callback of %s raised", self._describe())

    # -- the shared operations -----------------------------------------------------------

    def _take(self, owner: str, count: int, wait: Optional[float]) -> bool:
        """Acquire ``count`` holds for ``owner``; wait ``wait`` s (``None``: forever, 0: no).

        Returns whether it was granted. Raises LockLostError when the owner's earlier hold
        is lost and not yet released: without I/O when that is known already, else when
        the script finds the hold gone (re-entering a critical section that is no longer
        protected would hide the loss). Redis errors propagate.
        """
        hold = self._holds.get(owner)
        if hold is not None and hold.lost:
            raise LockLostError(
                f"{self._describe()}: cannot re-enter; this owner's hold was lost "
                "(release it first)",
                name=self._name,
            )
        client = self._client
        call = self._call("acquire", owner, count, self._held(owner) > 0)
        started = [0.0]

        def attempt() -> Reply:
            started[0] = monotonic()
            return call(client)

        reply = attempt()
        if reply.busy and wait != 0.0:
            deadline = None if wait is None else started[0] + wait
            hub = hub_for(client, self._namespace)
            reply = wait_until_granted(hub, self._keys.channel, attempt, deadline)
        if reply.not_owner:
            # A re-entry whose hold ended unnoticed: report the loss now, not at release.
            self._hold_lost(owner, "its hold was gone at re-entry")
            raise self._lost_error()
        if not reply.granted:
            return False
        self._record_grant(owner, count, started[0])
        log.debug("%s acquired by %s (count %d)", self._describe(), owner, reply.count)
        return True

    def _give_back(self, owner: str, count: int, everything: bool = False) -> None:
        """Release ``count`` of ``owner``'s holds (the exclusive-owner release).

        Raises NotOwnedError (no I/O) when the owner holds fewer here, and LockLostError
        when the hold turns out lost; in both cases nothing in Redis changes.

        Exact counts travel to Redis, whose count is the truth: two objects with one name
        in one thread are one lock, and each gives back only the levels it took.
        ``everything`` (``_release_save``) drops every level the owner has in Redis.
        On a Redis error the local holds are dropped anyway and renewal stops, so the
        server-side hold ends with its lease at the latest; the error propagates.
        """
        hold = self._holds.get(owner)
        if hold is None or hold.count < count:
            raise NotOwnedError(
                f"cannot release un-acquired lock {self._describe()}", name=self._name
            )
        if hold.lost:
            self._record_release(owner, count)
            raise self._lost_error()
        call = self._call("release", owner, count, everything)
        try:
            reply = call(self._client)
        except BaseException:
            self._record_release(owner, count)
            raise
        if reply.not_owner:
            self._hold_lost(owner, "its hold was gone at release")
            self._record_release(owner, count)
            raise self._lost_error()
        self._record_release(owner, count)

    def _lost_error(self) -> LockLostError:
        err = LockLostError(
            f"{self._describe()} was lost before it was released: its lease ended or the "
            "key was removed; another owner may hold it now (it was not touched)",
            name=self._name,
        )
        err.lock = self  # type: ignore[attr-defined]
        return err

    def _local_owners(self) -> List[Tuple[str, int]]:
        return [(owner, hold.count) for owner, hold in list(self._holds.items())]


def _is_async_client(client: Any) -> bool:
    try:
        import redis.asyncio
    except ImportError:  # pragma: no cover
        return False
    return isinstance(client, (redis.asyncio.Redis, redis.asyncio.RedisCluster))
