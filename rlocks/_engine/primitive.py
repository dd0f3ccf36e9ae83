"""The base every rlocks primitive is built from.

A primitive is one Redis hash (owner id -> hold count), the scripts that change it, the
owner scope (thread or process) and a wake policy. This base class keeps the *local*
bookkeeping (which owners of this process hold how much, their leases, whether a hold was
lost) and runs the shared machinery: the acquire through the server-side queue
(:mod:`.queued`, woken by :mod:`.waiting`), lease renewal (:mod:`.renewal`) and lost-hold
reporting.

Redis holds the truth; local state is a cache of what this process was granted. It is
changed under one module-wide mutex that is never held across a network call, so no
thread ever waits on another thread's round trip. The mutex is re-created in a fork child,
whose owner ids are new anyway (see :mod:`.identity`).
"""

from __future__ import annotations

import collections
import contextlib
import enum
import inspect
import logging
import os
import threading
from dataclasses import dataclass, fields, replace
from types import TracebackType
from typing import (
    Any,
    Callable,
    ClassVar,
    Deque,
    Dict,
    Generator,
    Hashable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Type,
    cast,
)

from ..errors import LockLostError, NotOwnedError, ReplicationError, RLocksError
from . import callbacks, checks, identity, metrics
from .clients import default_client, encoding_of, io_client, is_cluster, pool_of
from .clock import monotonic
from .constructors import public_init
from .deadlock import Detector
from .dialogue import drive
from .keys import PrimitiveKeys, keys_for
from .queued import CALL, LISTEN, READ, WAIT, Op, Steps, acquire_steps
from .quorum import Quorum, drift_allowance
from .renewal import Lease, Renewable, Renewer, renewer_for
from .scripts import (
    BUSY,
    NOT_OWNER,
    OP,
    QUEUED_STATUS,
    UPGRADE,
    Arg,
    Call,
    Replication,
    Reply,
    Script,
    direct_command,
    foreign,
    new_op,
    stamped,
)
from .state import PrimitiveState, find
from .waiting import LINK_ERRORS, existing_hub, hub_for
from .wakehub import READ_TURN, Waiter, WakeHub, serial

__all__ = [
    "ENTRY_LEASE", "Hold", "Options", "Primitive", "QuorumOp", "QuorumStep", "SyncPrimitive"
]

#: A release's queueing of its process's next waiter (see Primitive._carry_begin): the
#: hub, the waiter, and when the release was sent (monotonic).
Carry = Tuple[WakeHub, Waiter, float]

log = logging.getLogger(__name__)

_bookkeeping = threading.Lock()
# Levels each owner of this process holds per primitive, whichever object it went through
# (two objects with one name are one lock): (pool id, hash key, owner) -> levels. Changed
# with every object's own table, under _bookkeeping.
_process_holds: Dict[Tuple[int, str, str], int] = {}
# Holds of objects collected while holding ((key, levels) pairs), still counted in
# _process_holds. __del__ may run inside a `with _bookkeeping:` block of the same thread
# (a collection triggered by an allocation there), so it must not take that lock: it
# appends here (deque.append needs no lock) and the next user of the table subtracts them.
_orphans: Deque[Tuple[Tuple[int, str, str], int]] = collections.deque()
# The fencing token of each hold of this process, whichever object took it: ((pool id,
# hash key, owner), renew item kind: 'h', or an RWLock side) -> token. A second object of
# the same name is granted re-entry, for which Redis issues no token: it takes it from
# here. Entries go when the owner's last level of that hash goes; under _bookkeeping.
# The value is the hold's tokens: ``(token,)`` on one server, one per master on a Quorum.
_process_tokens: Dict[Tuple[Tuple[int, str, str], str], Tuple[Optional[int], ...]] = {}
# Calls that failed on a Redis error with their effect unknown: (pool id, hash key, owner)
# -> [(levels, op id, grant)]. A release (grant False): the books dropped its levels but
# Redis may still have them (the script may not have run). An acquire, its re-check or an
# adoption (grant True): Redis may have granted levels the books never got. The owner's
# next acquire settles them first (queued._settle): the op record tells whether the call
# ran; without that, its fresh acquire would be a re-entry on the server and every later
# release would leave levels behind, renewed with its holds. Oldest owners are forgotten
# beyond _MAX_UNSETTLED (threads that ended with one): their levels end with their lease,
# as before. Under _bookkeeping.
_unsettled: "collections.OrderedDict[Tuple[int, str, str], List[Tuple[int, str, bool]]]" = (
    collections.OrderedDict()
)
_MAX_UNSETTLED = 1024
# Hand-over grants this process recorded without adopting them on the server (the fast
# path of queued._handed): (hash key, owner) -> when (monotonic) the grant's short lease
# ends at the earliest; the renewer adopts it before. Another object of the name that
# acquires for that owner meanwhile adopts first (queued._acquire): its plain acquire would
# otherwise be answered as a waiter's re-check, ADOPTED with nothing added. Not keyed by
# pool: that object may be on another client (an adoption where there is no grant is
# harmless, so a same-named key on another server costs one call at most). Past
# _MAX_UNADOPTED entries, those whose short lease has ended are swept (their renewer
# adopted them, or they were lost). Under _bookkeeping.
_unadopted: Dict[Tuple[str, str], float] = {}
_MAX_UNADOPTED = 1024
_MAX_CALLS = 64  # prepared script calls cached per primitive


#: Default ``entry_lease`` (s): the bound on the stall a dead waiter causes (issue 12).
ENTRY_LEASE = 2.0


class QuorumOp(enum.Enum):
    """The steps of a quorum acquire (``Primitive._quorum_acquire_steps``)."""

    TRY = "try the acquire on every master at once"
    RELEASE = "give the grant back on the masters listed"
    PAUSE = "pause before the next try"


#: ``(step, call or None, masters or seconds)``, as yielded by the quorum acquire.
QuorumStep = Tuple[QuorumOp, Optional[Call], Any]


def _reset_after_fork() -> None:
    global _bookkeeping
    _bookkeeping = threading.Lock()
    _process_holds.clear()  # a child holds nothing: its owner ids are new
    _process_tokens.clear()
    _orphans.clear()
    _unsettled.clear()
    _unadopted.clear()


def _forget_orphans_locked() -> None:
    """Take the holds of collected objects off ``_process_holds``; under _bookkeeping."""
    while _orphans:
        key, count = _orphans.popleft()
        left = _process_holds.get(key, 0) - count
        if left > 0:
            _process_holds[key] = left
        else:
            _process_holds.pop(key, None)
            _forget_tokens_locked(key)


def _forget_tokens_locked(key: Tuple[int, str, str]) -> None:
    """The owner holds nothing of that hash any more: its tokens go; under _bookkeeping."""
    if _process_tokens:
        for side in ("h", "r", "w"):
            _process_tokens.pop((key, side), None)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class Hold:
    """What one owner of this process holds on one primitive (local view)."""

    __slots__ = ("count", "lease", "lost", "granted", "token", "tokens", "releasing", "pending")

    def __init__(self) -> None:
        self.count = 0
        self.lease: Optional[Lease] = None
        self.lost = False
        #: A release of its last level is on its way to Redis (see _end_releasing).
        self.releasing = False
        #: Why the renewer found it gone while that release was on its way, if it did.
        self.pending: Optional[str] = None
        self.granted = monotonic()  # when its first level was granted (hold duration)
        #: The fencing token of this hold (RLock, RWLock sides); None if none was issued.
        self.token: Optional[int] = None
        #: On a Quorum: each master's token (None: that master did not grant it).
        self.tokens: Optional[Tuple[Optional[int], ...]] = None


@dataclass(frozen=True)
class Options:
    """The constructor keywords every primitive shares, as one object (their meaning is
    in ``rlocks.RLock``'s docstring). A public ``__init__`` names them explicitly, for its
    signature and its docs, and hands them on as one of these (:meth:`of`); only
    :meth:`Primitive._configure` reads and checks them. No defaults here but one: the
    signatures own them."""

    client: Any
    ttl: float
    auto_renew: bool
    namespace: str
    on_lost: Optional[Callable[[Any], object]]
    replicas: int
    replica_wait: float
    fair: bool
    entry_lease: float
    #: (Semaphores take no deadlock_timeout: they never check for deadlocks.)
    deadlock_timeout: Optional[float] = 1.0

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> "Options":
        """The options among a constructor's ``locals()`` (its own parameters)."""
        return cls(**{f.name: arguments[f.name] for f in fields(cls) if f.name in arguments})


class Primitive(Renewable):
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
        "_replication",
        "_fair",
        "_deadlock_timeout",
        "_restoring",
        "_entry_ms",
        "_kept_hub",
        "__weakref__",
    )

    #: Public class name used in messages and reprs, e.g. ``"rlocks.RLock"``.
    _label: ClassVar[str] = "rlocks.Primitive"
    #: Key kind (see :mod:`.keys`); primitives sharing one hash share the kind.
    _kind: ClassVar[str] = ""
    #: Whether an ``async def`` on_lost is accepted (and awaited): the asyncio twins.
    _awaits_on_lost: ClassVar[bool] = False
    _acquire_script: ClassVar[Script]
    _release_script: ClassVar[Script]
    _renew_script: ClassVar[Script]
    #: ``fair=False``: ms a waiter woken by a release may be passed over by bargers before
    #: the next release hands the primitive to it (each queue position waits at most this
    #: plus one hold). Long enough for a releasing thread to run many sections in a row
    #: (a cross-process hand-over costs a wake-up), short enough that nobody waits long:
    #: in the contended benchmark 50 ms lost throughput to hand-overs and 10 s gained
    #: nothing over 100 ms (docs/design/handover.md, "fair=0 wake policy").
    _patience_ms: ClassVar[int] = 100
    _leave_script: ClassVar[Script]
    #: Whether a long wait records a wait-for edge and checks for deadlocks (see
    #: :mod:`.deadlock`): RLock and RWLock sides, whose holds only their owner releases.
    _detects_deadlocks: ClassVar[bool] = False
    #: Whether an owner's hold found when adopting a hand-over grant proves the grant (the
    #: grant's marker may already be gone, adopted by the waiter's own earlier call): an
    #: exclusive owner holds nothing while it waits; a semaphore owner may.
    _hold_proves_grant: ClassVar[bool] = True
    #: Whether a hold excludes every other owner (an RLock, a write side): while a
    #: thread of this process keeps one it was granted, the process's next waiter does
    #: not queue (see ``WakeHub.unregister``).
    _excludes: ClassVar[bool] = False
    #: Whether a :class:`~.quorum.Quorum` is accepted as ``client=`` (and why not, if not).
    _quorum_refusal: ClassVar[Optional[str]] = "it does not support a quorum of masters"

    @public_init
    def __init__(
        self,
        name: str,
        *,
        client: Any = None,
        ttl: float = 30.0,
        auto_renew: bool = True,
        namespace: str = "rlocks",
        on_lost: Optional[Callable[[Any], object]] = None,
        replicas: int = 0,
        replica_wait: float = 1.0,
        fair: bool = True,
        deadlock_timeout: Optional[float] = 1.0,
        entry_lease: float = ENTRY_LEASE,
    ) -> None:
        self._configure(name, Options.of(locals()))

    def _configure(self, name: str, options: Options) -> None:
        """Check ``name`` and ``options`` and set this object up (no I/O): where every
        constructor ends. Raises TypeError/ValueError naming the public class."""
        label = self._label
        ttl, namespace, on_lost = options.ttl, options.namespace, options.on_lost
        self._name = checks.check_name(name, label)
        self._namespace = checks.check_namespace(namespace, label, name)
        self._ttl_ms = checks.check_ttl(ttl, label, name)
        self._ttl = self._ttl_ms / 1000.0
        if on_lost is not None and not callable(on_lost):
            raise TypeError(
                f"{label}({name!r}): on_lost must be callable, not {type(on_lost).__name__}"
            )
        if inspect.iscoroutinefunction(on_lost) and not self._awaits_on_lost:
            # Nothing here could await it: it would be called and its coroutine dropped.
            raise TypeError(
                f"{label}({name!r}): on_lost is a coroutine function, which a threading "
                "primitive cannot await; pass a plain function, or use rlocks.asyncio"
            )
        client = self._resolve_client(options.client)
        masters = client.masters if isinstance(client, Quorum) else (client,)
        checks.check_wire_names(
            {"name": self._name, "namespace": self._namespace},
            [encoding_of(c) for c in masters],
            f"{label}({name!r})",
        )
        self._client = client
        self._replication = checks.replication(
            options.replicas, options.replica_wait, label, name
        )
        if self._replication is not None and isinstance(client, Quorum):
            raise ValueError(
                f"{label}({name!r}): replicas= is not supported with a Quorum: the masters "
                "are meant to be independent (no replicas to wait for)"
            )
        if self._replication is not None and is_cluster(client):
            raise ValueError(
                f"{label}({name!r}): replicas= is not supported on Redis Cluster clients "
                "(WAIT has no key to be routed by); see docs/operations.md"
            )
        self._auto_renew = bool(options.auto_renew)
        fair = options.fair
        if not isinstance(fair, bool):
            raise TypeError(f"{label}({name!r}): fair must be a bool, not {type(fair).__name__}")
        self._fair = fair
        self._deadlock_timeout = checks.deadlock_timeout(options.deadlock_timeout, label, name)
        #: Owners whose acquire in progress takes back what a Condition wait gave up
        #: (see _taking_back): deadlock detection never makes such a wait the victim.
        self._restoring: Set[str] = set()
        #: ms a queue entry, and a hand-over grant not adopted yet, lives without
        #: renewal: the most a dead waiter (or a process dead just after being handed
        #: the primitive) delays the next hand-over.
        self._entry_ms = checks.entry_lease(options.entry_lease, label, name)
        self._on_lost = on_lost
        self._keys: PrimitiveKeys = keys_for(namespace, self._kind, name)
        self._holds: Dict[str, Hold] = {}
        # Cluster servers deliver sharded messages only to the shard's subscribers.
        self._publish = "SPUBLISH" if is_cluster(client) else "PUBLISH"
        self._calls: Dict[Hashable, Call] = {}
        # (scope, hub): the wake-up hub of that process or event loop; see _hub
        self._kept_hub: Optional[Tuple[Any, Any]] = None

    @staticmethod
    def _owner() -> str:
        """The owner scope: the id of whoever owns what this object acquires now (no
        I/O): the calling thread; the running task in the asyncio twins. Acquire, release,
        ``__exit__`` and the owner's views of its own hold (owned, token) all ask it."""
        return identity.thread_owner()

    def _resolve_client(self, client: Any) -> Any:
        """The client to use: the default one for ``None``; a TypeError for a wrong kind."""
        label = f"{self._label}({self._name!r})"
        if client is None:
            return default_client()
        if isinstance(client, Quorum):
            if self._quorum_refusal is not None:
                raise ValueError(f"{label}: client is a Quorum, but {self._quorum_refusal}")
            if client.is_async:
                raise TypeError(
                    f"{label}: the Quorum's clients are redis.asyncio clients; this "
                    "primitive needs redis.Redis ones (use rlocks.asyncio for asyncio)"
                )
            return client
        if not callable(getattr(client, "evalsha", None)):
            raise TypeError(
                f"{label}: client must be a redis.Redis or "
                f"redis.cluster.RedisCluster, not {type(client).__name__}"
            )
        if _is_async_client(client):
            raise TypeError(
                f"{label}: client is a redis.asyncio client; this primitive needs a "
                "synchronous redis.Redis (use rlocks.asyncio for asyncio)"
            )
        return client

    def _renewer(self) -> Renewer:
        """Where this primitive's leases are renewed: its connection pool's renewer."""
        return renewer_for(self._client)

    def _renewal_client(self) -> Any:
        return self._client

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

    def _statistics(self) -> PrimitiveState:
        """Ask Redis about this primitive now: holders, counts, leases, waiting processes.

        Synchronous I/O: the threading surfaces expose it as ``statistics()``.

        Read-only (a few round trips: one snapshot at one server time, then the wake-up
        channels' subscriber counts). A primitive nobody holds has no key, and reports no
        holders. Redis errors propagate. The result is a frozen dataclass
        (:class:`rlocks._engine.state.PrimitiveState`), the same the ``rlocks`` command
        line prints.

        On a Quorum: the state a majority of the masters agree on (one snapshot per
        master, read at once): a holder is listed when a majority have its hold, with the
        count and lease that a majority have at least (its lease is how long a majority
        will still have it: when the hold is lost unless renewed); ``lease_ms`` and the
        waiting counts likewise. Raises the first master's error when fewer than a
        majority answered.
        """
        if isinstance(self._client, Quorum):
            return self._agreed_state(
                self._client,
                self._client.map(
                    lambda master: find(master, self._namespace, self._name, kind=self._kind)
                ),
            )
        return self._state_from(find(self._client, self._namespace, self._name, kind=self._kind))

    def _state_from(self, found: List[PrimitiveState]) -> PrimitiveState:
        """The state :func:`~.state.find` read for this primitive (none: nobody holds it)."""
        return found[0] if found else self._no_state()

    def _agreed_state(
        self, quorum: Quorum, results: List[List[PrimitiveState] | Exception]
    ) -> PrimitiveState:
        """``_statistics`` on a quorum, from each master's :func:`~.state.find` result (or
        its error): what a majority of the masters agree on. No I/O."""
        answered = [r for r in results if not isinstance(r, Exception)]
        if len(answered) < quorum.majority:
            raise next(r for r in results if isinstance(r, Exception))
        states = [self._state_from(found) for found in answered]
        need = quorum.majority

        def agreed(values: List[Optional[int]]) -> Optional[int]:
            # The need-th largest: at least a majority have this much (None: no expiry,
            # the largest of all; a master without it counts as nothing).
            if len(values) < need:
                return None
            ranked = sorted(values, key=lambda v: float("inf") if v is None else v)
            return ranked[len(values) - need]

        holds: Dict[Tuple[str, str], List[Any]] = {}
        for state in states:
            for holder in state.holders:
                holds.setdefault((holder.owner, holder.side), []).append(holder)
        holders = tuple(
            replace(
                found[0],
                count=min(sorted((h.count for h in found), reverse=True)[:need]),
                lease_ms=agreed([h.lease_ms for h in found]),
            )
            for found in holds.values()
            if len(found) >= need
        )
        first = states[0]
        waiting = None
        if all(state.waiting is not None for state in states):
            roles: Dict[str, List[Optional[int]]] = {}
            for state in states:
                for role, count in state.waiting or ():
                    roles.setdefault(role, []).append(count)
            waiting = tuple((role, agreed(counts) or 0) for role, counts in roles.items())
        return replace(
            first,
            holders=holders,
            lease_ms=agreed([s.lease_ms for s in states if s.holders]) if holders else None,
            waiting=waiting,
            stale=0,
            queue=None,
        )

    def _no_state(self) -> PrimitiveState:
        """The state of this primitive where nobody holds or waits (no key)."""
        return PrimitiveState(
            namespace=self._namespace,
            kind=self._kind,
            name=self._name,
            key=self._keys.hash,
            type=self._label.rsplit(".", 1)[-1],
            holders=(),
            lease_ms=None,
            waiting=(),
        )

    # -- what a subclass provides --------------------------------------------------------

    def _acquire_arguments(
        self, owner: str, count: int, reentry: bool, entry: Optional[str], listen: bool = False
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        """KEYS and ARGV of the acquire script.

        ``reentry``: this object already has holds of ``owner`` (a script that knows the
        owner's field should answer not-owner when it is gone). ``entry``: the hub entry
        id to queue under if refused (``None``: a single try, see :meth:`_entry_id`).
        ``listen``: the waiter reads its wake-up lines from the entry's list (see
        :meth:`_queue_flag`).
        """
        raise NotImplementedError

    def _release_arguments(
        self, owner: str, count: int
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        """KEYS and ARGV of the release script giving back ``count`` of ``owner``'s own
        holds, never more (the engine gives back exact counts, see
        ``ReentrantLock._release_save``): the locks' release, and what every primitive
        gives back of a grant it does not keep (:meth:`_release_call`)."""
        raise NotImplementedError

    def _renew_arguments(
        self, owner: str, lease_ms: Optional[int] = None
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        """KEYS and ARGV of the renew script, for a lease of ``lease_ms`` (default ``ttl``)."""
        raise NotImplementedError

    def _check_acquire(self, owner: str) -> None:
        """Refuse an acquire before any I/O (raise); by default, re-entering a lost hold."""
        hold = self._holds.get(owner)
        if hold is not None and hold.lost:
            # The same error as a loss the acquire script finds (_refused): one situation,
            # one message, and nested ``with`` blocks unwind it quietly (``err.lock``).
            raise self._lost_error(reentering=True)

    def _refused(self, owner: str, reentry: bool) -> BaseException:
        """The error for an acquire script's not-owner answer.

        By default that answer means a re-entry whose hold ended unnoticed: the loss is
        reported now, not at the release.
        """
        self._hold_lost(owner, "its hold was gone at re-entry")
        return self._lost_error(reentering=True)

    def _queues_locally(self, owner: str) -> bool:
        """Whether a blocking acquire by ``owner`` should queue behind this process's
        waiters instead of trying at once.

        Never for an owner that already holds anything of this primitive, through this
        object or another one of the same name (``@synchronized`` functions sharing a
        name make one object each): its re-entry is granted at once by the script, and
        queueing it behind threads that wait for *it* would deadlock. Never with
        ``fair=False`` either: a thread of this process may barge like any other (the one
        that just released re-acquires at once, which is what that mode is for); the
        process's queued waiters are served by the server's hand-over.
        """
        return self._fair and self._held_by_all_objects(owner) == 0

    def _defers_next(self) -> bool:
        """Whether a hold granted to a waiter keeps this process's next waiter from
        queueing until its release (fair mode, an exclusive hold; see
        ``WakeHub.unregister``). No I/O."""
        return self._excludes and self._fair

    def _hub_here(self) -> Optional[WakeHub]:
        """The calling process's hub for this primitive's pool and namespace (the one
        this object keeps, else the one another object of the pool made), or None;
        never makes one (no I/O). A hold taken through one object may be released
        through another of the same name, which never waited."""
        kept = self._kept_hub
        if kept is not None and kept[0] == identity.process_token():
            return cast(WakeHub, kept[1])
        return cast(Optional[WakeHub], self._local_hub())

    def _unhold(self, owner: str) -> None:
        """``owner``'s exclusive hold in this process ends: the next waiter it kept from
        queueing queues now (``WakeHub.unhold``). No I/O, never raises."""
        if self._defers_next():
            hub = self._hub_here()
            if hub is not None:
                hub.unhold(self._channel(hub), owner)

    def _carry_begin(self, owner: str) -> Optional[Tuple[WakeHub, Waiter]]:
        """(hub, waiter): the waiter ``owner``'s hold kept from queueing, which the
        release of that hold is to queue (``WakeHub.carry_begin``); or None (it was
        woken to queue itself, or there is none). Not on a Quorum, whose release goes
        to every master. No I/O."""
        hub = self._hub_here()
        if hub is None:
            return None
        channel = self._channel(hub)
        if isinstance(self._client, Quorum):
            hub.unhold(channel, owner)
            return None
        waiter = hub.carry_begin(channel, owner)
        if waiter is not None and waiter.lease_ms != self._entry_ms:
            # (another object of the name, with another entry_lease: the grant would
            # live this object's, not the one the waiter counts on)
            hub.carry_end(waiter, owner, None)
            return None
        return None if waiter is None else (hub, waiter)

    def _carry_end(
        self, owner: str, carry: Optional[Carry], reply: Optional[Reply]
    ) -> Optional[Call]:
        """End ``carry`` with the release's ``reply`` (None: it failed, or was cut short).
        Returns the leave call the caller must run once the release's script surely ran
        or never will (errors ignored: the entry then ends with its lease) when the
        carried waiter stopped waiting meanwhile, so the script may have queued a waiter
        that is gone; else None. No I/O."""
        if carry is None:
            return None
        hub, waiter, since = carry
        result = None
        if reply is not None and len(reply.items) == 4 and reply.items[0] == QUEUED_STATUS:
            _, position, hint, token = reply.items
            result = (since, Reply(QUEUED_STATUS, position, aux=hint, token=token))
        if hub.carry_end(waiter, owner, result):
            return None
        return self._leave_call(waiter.id, hub.entry)

    def _hold_key(self, owner: str) -> Tuple[int, str, str]:
        return (id(pool_of(self._client)), self._keys.hash, owner)

    def _adopt_first(self, owner: str) -> bool:
        """Whether ``owner``, acquiring through this object while it holds nothing here,
        must first adopt a hand-over grant another object of the name recorded without
        adopting it (see ``_unadopted``). No I/O; forgets the grant (one adoption does)."""
        key = (self._keys.hash, owner)
        # (Looked up without the mutex first: only the owner's own thread adds its entry,
        # and other threads' holds keep theirs there while this owner waits.)
        if key not in _unadopted or self._held(owner):
            return False
        with _bookkeeping:
            end = _unadopted.pop(key, None)
        return end is not None and end > monotonic()

    def _lost_reply_check(self, owner: str) -> Optional[Call]:
        """A call that tells whether ``owner`` holds this primitive, for a waiter whose
        attempt's reply was lost (it may have been granted); ``None``: cannot tell.

        Its granted reply is adopted as the lost attempt's grant. That is exact when the
        owner held nothing here before it waited, which is true of exclusive owners (an
        owner that holds is granted re-entry at its first attempt and never waits): the
        renewal script, which answers the owner's count or not-owner (and renews a lease
        that was just granted, harmlessly).
        """
        return self._prepared(
            ("check", owner), self._renew_script, lambda: self._renew_arguments(owner)
        )

    # -- queue scripts (see :mod:`.queued`) ---------------------------------------------

    def _deadlock_side(self) -> str:
        """How a wait for this primitive is recorded in a wait-for edge: ``x`` (exclusive)."""
        return "x"

    def _detector(self, owner: str, since: float, entry: str) -> Optional[Detector]:
        """The deadlock detector of a wait by ``owner`` that began at ``since``, queued
        under the hub entry ``entry``, if any."""
        timeout = self._deadlock_timeout
        if timeout is None or not self._detects_deadlocks:
            return None
        return Detector(
            self._namespace, owner, self._deadlock_side(), self._keys.hash, timeout, since,
            self._describe(), self._name,
            # fair: the waiter is granted only after the entry ahead of its process's
            entry=entry if self._fair else "-",
            restoring=owner in self._restoring,
        )

    @contextlib.contextmanager
    def _taking_back(self, owner: str) -> Iterator[None]:
        """Mark ``owner``'s acquires inside the block as a Condition wait taking its lock
        back (``_acquire_restore``): such an acquire must end holding the lock, as
        ``threading.Condition.wait`` does, so a deadlock check never picks it as the
        victim. It still records its wait-for edge, so another member of a cycle through
        it is accused. Used by the threading and the asyncio restore alike (no I/O)."""
        try:
            # (inside the try: an interrupt right after the add cannot leave the mark)
            self._restoring.add(owner)
            yield
        finally:
            self._restoring.discard(owner)

    def _context(self) -> Tuple[Arg, ...]:
        """The context ARGV every queue script starts with: now ('' = server TIME), the
        publish command, fair (1, or minus the patience in ms), the entry lease (ms), the
        kind's own (``_kind_context``), then the op ARGV (:data:`~.scripts.OP`: each send
        puts a fresh op id there)."""
        return ("", self._publish, 1 if self._fair else -self._patience_ms, self._entry_ms,
                *self._kind_context(), OP)

    def _kind_context(self) -> Tuple[Arg, ...]:
        """The context ARGV of this kind of primitive after the common four (sem: value,
        bounded)."""
        return ()

    @staticmethod
    def _entry_id(entry: Optional[str]) -> str:
        """The queue entry id an acquire names: ``entry``, its wake-up hub's
        (``WakeHub.entry``), when it may queue; ``None``: a single try.

        A single try names an id no entry has: a hub's entry belongs to its head waiter,
        and another thread's try must neither take its place nor its turn.
        """
        return entry if entry is not None else f"{identity.process_token()}:try"

    @staticmethod
    def _queue_flag(entry: Optional[str], listen: bool) -> int:
        """The acquire scripts' ``queue`` ARGV: 0 = a single try (``entry`` None), 1 =
        queue, its wake-up lines published on the entry's channel (the hub reads them),
        2 = queue, its lines pushed to the entry's list (the waiting thread BLPOPs it)."""
        if entry is None:
            return 0
        return 2 if listen else 1

    def _acquire_call(
        self, owner: str, count: int, reentry: bool, entry: Optional[str], listen: bool = False
    ) -> Call:
        """The prepared acquire call: queue under ``entry`` if not granted (``None``: a
        single try, nothing queued); ``listen``: see :meth:`_queue_flag`."""
        return self._prepared(
            ("acquire", owner, count, reentry, entry, listen, *self._acquire_depends(owner)),
            self._acquire_script,
            lambda: self._acquire_arguments(owner, count, reentry, entry, listen),
            self._replication,
        )

    def _acquire_depends(self, owner: str) -> Tuple[Any, ...]:
        """What else ``owner``'s acquire ARGV depend on, beyond the call's parameters (an
        RWLock side: whether the owner holds the other side): part of the key the
        prepared call is kept under. No I/O."""
        return ()

    def _leave_arguments(
        self, owner: str, entry: str, ask: Optional[Tuple[str, str, int]] = None
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        """KEYS and ARGV of the leave script for waiter ``owner`` of the hub entry
        ``entry``; ``ask``: the next local waiter (owner, renew item kind, count) the entry
        is re-pointed to, or None."""
        raise NotImplementedError

    def _leave_call(
        self, owner: str, entry: str, ask: Optional[Tuple[str, str, int]] = None
    ) -> Call:
        return self._prepared(
            ("leave", owner, entry, ask),
            self._leave_script,
            lambda: self._leave_arguments(owner, entry, ask),
        )

    def _renew_items(self, owner: str) -> Tuple[str, ...]:
        """The renew items of ``owner``'s hold: ``('h', owner)`` (an RWLock side: its side)."""
        return ("h", owner)

    def _adopt_item(self, owner: str) -> Tuple[str, str]:
        """The renew item that adopts ``owner``'s hand-over grant: ``('a', owner)`` (an
        RWLock side: only a grant of its side, ``('ar' | 'aw', owner)``)."""
        return ("a", owner)

    def _hold_field(self, owner: str) -> str:
        """The field of ``owner``'s hold in the holds hash (queue_lib.lua's ``hfield``):
        the owner id, or ``<side>:<owner>`` on an RWLock side."""
        kind, _ = self._renew_items(owner)
        return owner if kind == "h" else f"{kind}:{owner}"

    def _items_call(self, items: Sequence[str], lease_ms: Optional[int] = None) -> Call:
        """A renew script call for ``items`` (pairs kind, id) with a lease of ``lease_ms``."""
        args = (*self._context(), lease_ms or self._ttl_ms, *items)
        return Call(self._renew_script, self._keys.queued(), args, self._replication)

    def _acquire_check(self, owner: str) -> Optional[Call]:
        """After a lost acquire reply: whether ``owner`` holds (item 1 = yes), adopting a
        hand-over grant too; ``None``: cannot tell (see ``_lost_reply_check``)."""
        if self._lost_reply_check(owner) is None:
            return None
        if self._kind == "sem":  # a semaphore issues no fencing tokens
            return self._items_call((*self._renew_items(owner), *self._adopt_item(owner)))
        # The lost reply carried the grant's fencing token: a fresh one, above every token
        # issued so far, is as good (nobody saw the lost one) and is what the reply decodes.
        return self._items_call(
            (*self._renew_items(owner), *self._adopt_item(owner), "t", self._hold_field(owner))
        )

    def _adopt_call(self, owner: str) -> Call:
        """Adopt ``owner``'s hand-over grant and extend it to ``ttl`` (no renewer here)."""
        return self._items_call((*self._renew_items(owner), *self._adopt_item(owner)))

    def _renewal_arguments(self, lease: Lease) -> Tuple[Sequence[str], Sequence[Arg]]:
        """KEYS and ARGV of one renewal by the renewer: a hold, or a queue entry."""
        items = ("e", lease.owner) if lease.kind == "e" else self._renew_items(lease.owner)
        args = (*self._context(), self._ttl_ms, *items)
        # Stamped here, as the renewer's pipeline is built: its own stream (one renewer
        # per thread, its passes one after another), apart from the owners' calls.
        return self._keys.queued(), stamped(args, f"{identity.thread_owner()}:r")

    def _renewed(self, lease: Lease, reply: Reply) -> bool:
        """Whether a renewal kept ``lease`` alive (False: the hold is lost / the entry
        left)."""
        return bool(reply.items) and reply.items[0] == 1

    def _channel(self, hub: Optional[WakeHub] = None) -> str:
        """The channel this primitive's waiters of ``hub`` (default: this object's) hear
        their wake-ups on: named after the hub's queue entry id, which a fork renews."""
        return self._keys.wake((hub or self._hub()).entry)

    def _hub(self) -> WakeHub:
        """This process's wake-up hub for the primitive's pool and namespace, made on first
        need (no I/O). This object keeps it while it lives: made and dropped again at every
        uncontended acquire, a hub cost 13 µs of each. A forked child gets its own."""
        scope = identity.process_token()  # renewed at fork
        kept = self._kept_hub
        if kept is not None and kept[0] == scope:
            return cast(WakeHub, kept[1])
        hub = hub_for(self._client, self._namespace)
        self._kept_hub = (scope, hub)
        return hub

    def _local_hub(self) -> Any:
        """This process's hub for the primitive's pool, if one exists (no creation)."""
        return existing_hub(self._client, self._namespace)

    def _deliver(self, reply: Reply, sent: int) -> None:
        """Signal waiters of this process that ``reply``'s wake lines name (fast path)."""
        if reply.wakes:
            hub = self._local_hub()
            if hub is not None:
                hub.deliver(self._channel(hub), reply.wakes, sent)

    def _drive(self, steps: Steps) -> bool:
        """The threading driver of a :mod:`.queued` dialogue: block as it asks."""
        return bool(drive(steps, self._perform))

    def _perform(self, op: Op) -> Any:
        """Do one step of a :mod:`.queued` dialogue, blocking."""
        client = self._client
        if op.kind == CALL:
            assert op.call is not None
            return op.call(client, op.set_late, op.opid)
        if op.kind == WAIT:
            assert op.waiter is not None
            return op.waiter.event.wait(op.timeout)
        if op.kind == LISTEN:
            assert op.waiter is not None and op.hub is not None
            io = io_client(client)
            pop = op.hub.to_pop(op.waiter, op.timeout, io)
            if pop is None:
                return True
            try:
                # (direct_command: a raw reply, which popped() reads as blpop's)
                keys, timeout = pop
                return op.hub.popped(op.waiter, direct_command(io, "BLPOP", *keys, timeout))
            except LINK_ERRORS as exc:
                return exc  # for the dialogue: its next call meets the broken link
        if op.kind == READ:
            # Bounded and never re-sent, as rlocks' own script calls. One read at a time
            # per hub (WakeHub.reads): every waiter past deadlock_timeout checks, and 64
            # of them took 56 connections of the pool at once.
            # An ended wait's edge deletion takes no turn (see Op): skipped, the edge
            # would say a thread that moved on still waits.
            reads = self._hub().reads if op.turn else None
            if reads is not None and not reads.acquire(timeout=READ_TURN):
                # a failed check: the wait goes on, the next check comes later
                raise TimeoutError("another waiter's deadlock check is reading")
            try:
                return io_client(client).execute_command(*op.command)
            finally:
                if reads is not None:
                    reads.release()
        assert op.waiter is not None
        return op.waiter.channel.confirmed.wait(op.timeout)

    # -- prepared script calls -----------------------------------------------------------

    def _prepared(
        self,
        key: Hashable,
        script: Script,
        build: Callable[[], Tuple[Sequence[str], Sequence[Arg]]],
        replication: Replication = None,
    ) -> Call:
        """The cached :class:`Call` for ``key`` (``build`` gives its KEYS and ARGV once)."""
        call = self._calls.get(key)
        if call is None:
            keys, args = build()
            if len(self._calls) >= _MAX_CALLS:
                # Owners are threads, and threads come and go: keep the cache bounded.
                self._calls.clear()
            call = self._calls[key] = Call(script, keys, args, replication)
        return call

    def _release_call(self, owner: str, count: int) -> Call:
        """Give back exactly ``count`` holds granted but not kept (cancelled, unreplicated):
        the release of those levels, never more (the owner may hold outer levels of a
        lock, or earlier permits of a semaphore)."""
        return Call(self._release_script, *self._release_arguments(owner, count))

    def _grant_refusal(self, owner: str, count: int, reply: Reply) -> Optional[BaseException]:
        """Why a grant must be given back instead of kept (the error to raise), or None.

        By default: fewer replicas acknowledged it than ``replicas=`` asks, so it is not
        durable enough to trust across a failover. No I/O; the drivers give it back.
        """
        if self._short_of_replicas(reply):
            return self._replication_error(reply)
        return None

    def _checks_hand_over(self, owner: str) -> bool:
        """Whether a hand-over grant to ``owner`` needs a round trip before it is kept, to
        run the checks of ``_grant_refusal`` (no I/O): with ``replicas=``, whose WAIT the
        releaser's script did not run."""
        return self._replication is not None

    def _short_of_replicas(self, reply: Reply) -> bool:
        """Whether a grant was acknowledged by fewer replicas than ``replicas=`` asks."""
        wanted = self._replication
        return reply.granted and wanted is not None and reply.replicas < wanted[0]

    def _replication_error(self, reply: Reply) -> ReplicationError:
        assert self._replication is not None
        return ReplicationError(
            f"{self._describe()} was granted, but only {reply.replicas} of {self._replication[0]} "
            f"replicas acknowledged it within {self._replication[1]} ms; it was given back",
            name=self._name,
            acknowledged=reply.replicas,
            required=self._replication[0],
        )

    # -- local bookkeeping (no I/O) ------------------------------------------------------

    def _token(self, owner: str) -> Optional[int]:
        """The fencing token of ``owner``'s hold here, or None when it holds nothing or
        no token was issued (no I/O). Raises RLocksError on a Quorum (see ``_tokens``)."""
        if isinstance(self._client, Quorum):
            # Each master counts on its own: no one number orders the grants.
            raise RLocksError(
                f"{self._describe()}: a Quorum's masters issue independent fencing tokens, "
                "not one sequence; use .tokens (one per master)",
                name=self._name,
            )
        hold = self._holds.get(owner)
        return hold.token if hold is not None and hold.count > 0 else None

    def _tokens(self, owner: str) -> Optional[Tuple[Optional[int], ...]]:
        """The fencing tokens of ``owner``'s hold, one per master in the Quorum's order
        (None for a master that did not grant it; one master without a Quorum), or None
        when it holds nothing or none was issued (no I/O)."""
        hold = self._holds.get(owner)
        if hold is None or hold.count <= 0:
            return None
        if isinstance(self._client, Quorum):
            return hold.tokens
        return None if hold.token is None else (hold.token,)

    def _held(self, owner: str) -> int:
        """How many holds ``owner`` has here, as far as this process knows."""
        hold = self._holds.get(owner)
        return hold.count if hold is not None else 0

    def _held_by_all_objects(self, owner: str) -> int:
        """Holds ``owner`` has on this primitive through every object of its name here."""
        return self._held_in_process(self._hold_key(owner))

    @staticmethod
    def _held_in_process(hold_key: Tuple[int, str, str]) -> int:
        """The process-wide count under ``hold_key`` (see ``_hold_key``)."""
        if _orphans:
            with _bookkeeping:
                _forget_orphans_locked()
        return _process_holds.get(hold_key, 0)

    def __del__(self) -> None:
        # An object dropped while it holds: its renewal stops (the lease only refers to it
        # weakly) and the hold ends with the lease, so it must not stay counted for the
        # other objects of its name (a semaphore would refuse every later grant to that
        # owner as "after a loss"). Runs at any point: no lock, no I/O (see _orphans).
        try:
            holds = self._holds
        except AttributeError:  # __init__ did not get that far
            return
        for owner, hold in list(holds.items()):
            if hold.count > 0:
                _orphans.append((self._hold_key(owner), hold.count))

    def _record_grant(
        self, owner: str, count: int, since: float, token: int = 0,
        tokens: Optional[Tuple[Optional[int], ...]] = None,
        unadopted: Optional[float] = None,
    ) -> None:
        """Record ``count`` holds granted to ``owner``; start renewing them.

        ``token``: the grant's fencing token (0: none issued, as on re-entry, which keeps
        the hold's token). ``tokens``: on a Quorum, each master's (all None on re-entry).
        ``unadopted``: a hand-over grant recorded without its adoption round trip, whose
        short lease ends no sooner than this (monotonic): the renewer renews it before.
        """
        key = self._hold_key(owner)
        with _bookkeeping:
            _forget_orphans_locked()
            if unadopted is not None:
                if len(_unadopted) >= _MAX_UNADOPTED:
                    now = monotonic()
                    for old in [k for k, end in _unadopted.items() if end <= now]:
                        del _unadopted[old]
                _unadopted[key[1:]] = unadopted
            hold = self._holds.get(owner)
            if hold is None:
                hold = self._holds[owner] = Hold()
            held_key = (key, self._renew_items(owner)[0])
            if token:
                hold.token = token
                _process_tokens[held_key] = (token,)
            if tokens is not None and any(t is not None for t in tokens):
                hold.tokens = _process_tokens[held_key] = tokens
            known = _process_tokens.get(held_key)
            if known is not None:
                # re-entry through this object of a hold another object of its name took
                if hold.token is None and not isinstance(self._client, Quorum):
                    hold.token = known[0]
                if hold.tokens is None:
                    hold.tokens = known
            hold.count += count
            _process_holds[key] = _process_holds.get(key, 0) + count
            start_lease = self._auto_renew and hold.lease is None
        if start_lease:
            lease = self._renewer().add(self, owner, self._ttl, since, unadopted)
            with _bookkeeping:
                if hold.count > 0 and hold.lease is None:
                    hold.lease = lease
                    lease = None  # type: ignore[assignment]
            if lease is not None:  # released meanwhile by another thread of this owner
                self._renewer().cancel(lease)

    def _record_release(self, owner: str, count: int) -> int:
        """Drop ``count`` local holds of ``owner``; returns how many are left."""
        self._release_locally(owner, count)
        return self._held(owner)

    def _release_locally(
        self, owner: str, most: int, ended: Optional[Dict[str, float]] = None
    ) -> Tuple[int, bool]:
        """Drop up to ``most`` local holds of ``owner``, before or after the Redis call.

        Returns (holds dropped, whether the hold was known lost). At zero the hold is
        forgotten and its renewal stops, and its duration is recorded as released; with
        ``ended`` given, its grant time is put there instead, for a caller whose release
        Redis may still refuse (then the hold is restored, and it did not end).
        """
        lease = None
        key = self._hold_key(owner)
        with _bookkeeping:
            _forget_orphans_locked()
            hold = self._holds.get(owner)
            if hold is None:
                return 0, False
            dropped = min(most, hold.count)
            hold.count -= dropped
            left = _process_holds.get(key, 0) - dropped
            if left > 0:
                _process_holds[key] = left
            else:
                _process_holds.pop(key, None)
                _forget_tokens_locked(key)
                # its release adopts an unadopted grant: the next acquire need not
                _unadopted.pop(key[1:], None)
            lost = hold.lost
            if hold.count <= 0:
                del self._holds[owner]
                lease, hold.lease = hold.lease, None
            ended_here = left <= 0
        if ended_here:
            self._unhold(owner)
        if lease is not None:
            self._renewer().cancel(lease)
        if hold.count <= 0 and not lost:  # a lost hold's duration ended at the loss
            if ended is None:
                metrics.hold_ended(self, hold.granted, "released")
            else:
                ended[owner] = hold.granted
        return dropped, lost

    def _hold_lost(self, owner: str, reason: str, lease: Optional[Lease] = None) -> None:
        """Mark ``owner``'s hold lost (called by the renewer or by a release).

        With ``lease`` given (the renewer's finding), only if that lease is still the
        hold's current one, and not while a release of the hold's last level is on its
        way: a renewal that reached Redis just after that release found the hold gone
        though nothing was lost. The release's answer decides then (:meth:`_end_releasing`).
        """
        with _bookkeeping:
            hold = self._holds.get(owner)
            if hold is None or hold.count <= 0 or hold.lost:
                return
            if lease is not None and hold.lease is not lease:
                return
            if lease is not None and hold.releasing:
                hold.pending = reason
                return
            hold.lost = True
            stale, hold.lease = hold.lease, None
        if stale is not None:
            self._renewer().cancel(stale)
        self._report_lost(owner, reason)

    def _report_lost(self, owner: str, reason: str) -> None:
        """Log a lost hold and have ``on_lost`` called (once per loss; the caller makes
        sure). Returns at once: the callback runs elsewhere (see ``_call_on_lost``).
        """
        log.warning("%s lost by %s: %s", self._describe(), owner, reason)
        metrics.lost(self, getattr(self._holds.get(owner), "granted", None))
        if self._on_lost is not None:
            self._call_on_lost(self._on_lost)

    def _call_on_lost(self, on_lost: Callable[[Any], object]) -> None:
        """Run ``on_lost(self)`` on the callback thread, never on the caller's (often the
        renewer's): a slow callback must not delay the renewal of other holds.
        """
        callbacks.dispatch(on_lost, self, f"on_lost callback of {self._describe()}")

    # -- the shared operations -----------------------------------------------------------

    @metrics.measure_acquire
    def _acquire(self, owner: str, count: int, wait: Optional[float]) -> bool:
        """Acquire ``count`` holds for ``owner``; wait ``wait`` s (``None``: forever, 0: no).

        Returns whether it was granted. Raises what ``_check_acquire`` raises before any I/O
        (LockLostError when the owner's earlier hold is known lost and not yet released),
        what ``_refused`` returns when the script answers not-owner (LockLostError for a
        re-entry whose hold ended unnoticed: re-entering a critical section that is no
        longer protected would hide the loss), and Redis errors.
        """
        if isinstance(self._client, Quorum):
            return self._quorum_acquire(self._client, owner, count, wait)
        hub = self._hub() if wait != 0.0 else None
        mark = self._books(owner)  # what the local books say before this acquire
        try:
            return self._drive(acquire_steps(self, owner, count, wait, hub))
        except RLocksError:
            raise  # a refusal: nothing granted is kept
        except BaseException as exc:
            if foreign(exc):
                # An exception from outside (a signal handler's) anywhere from the
                # send to the last bookkeeping step: Redis may hold a grant that the
                # books lack, or the books a part of one. Make both what they were.
                self._roll_back(owner, mark)
                self._reconcile(owner, count)
            raise

    # -- a quorum of masters (see :mod:`.quorum`) ----------------------------------------

    def _quorum_acquire(
        self, quorum: Quorum, owner: str, count: int, wait: Optional[float]
    ) -> bool:
        """``_acquire`` on a quorum: single tries on every master at once, until a majority
        grants within the validity window (or the wait ends); see :mod:`.quorum` and
        :meth:`_quorum_acquire_steps`, driven here by blocking on each step."""
        generation = 0  # read before each try

        def perform(step: QuorumStep) -> Any:
            nonlocal generation
            what, call, arg = step
            if what is QuorumOp.PAUSE:
                quorum.pause(generation, arg)
                return None
            assert call is not None
            if what is QuorumOp.TRY:
                generation = quorum.generation  # a release from now on cuts the pause
                return quorum.map(call, abandoned=lambda late: self._quorum_abandoned(
                    quorum, owner, count, late))
            return quorum.map(call, arg)  # RELEASE

        return bool(drive(self._quorum_acquire_steps(quorum, owner, count, wait), perform))

    def _quorum_acquire_steps(
        self, quorum: Quorum, owner: str, count: int, wait: Optional[float]
    ) -> Generator[QuorumStep, Any, bool]:
        """The quorum acquire, written once without I/O for both drivers: yields
        ``(QuorumOp.TRY, call, None)`` (answered with each master's result),
        ``(QuorumOp.RELEASE, call, masters)`` (the same) and ``(QuorumOp.PAUSE, None,
        seconds)`` (a pause that a release in this process may cut short).

        Each try's minority grants are given back at once, on those masters only (a
        failure there leaves them to their lease). Raises what ``_acquire`` raises: a
        re-entry that a majority refuses is a lost hold; when too few masters answered
        at the last try, the first of their errors.
        """
        self._check_acquire(owner)
        reentry = self._held(owner) > 0
        call = self._acquire_call(owner, count, reentry, None)
        first = monotonic()
        deadline = None if wait is None else first + wait
        base = 0.0
        while True:
            since = monotonic()
            results = yield QuorumOp.TRY, call, None
            give_back, refusal = self._quorum_outcome(quorum, owner, reentry, results, since)
            if give_back is None:
                if wait != 0.0:
                    self._log_wait(owner, first, True)
                self._record_grant(owner, count, since, tokens=self._quorum_tokens(results))
                return True
            if give_back:
                gave = yield QuorumOp.RELEASE, self._release_call(owner, count), give_back
                self._log_failed_releases(owner, gave)
            if refusal is not None:
                raise refusal
            pause = self._quorum_pause(quorum, results, wait, deadline, base)
            if pause is None:
                return False
            if not base:  # the first pause: from now on this acquire waits (metrics)
                metrics.wait_began(self, first)
            base = pause[1]
            yield QuorumOp.PAUSE, None, pause[0]

    def _quorum_outcome(
        self, quorum: Quorum, owner: str, reentry: bool, results: Sequence[Any], since: float
    ) -> Tuple[Optional[List[Any]], Optional[BaseException]]:
        """Judge one quorum try (no I/O): (None, None) when granted (a majority within
        the validity window), else (the masters whose grants must be given back, the
        error to raise after that or None).

        The error is the refusal when more than a minority refused for good: an upgrade,
        or a re-entry whose hold is gone (then reported lost).
        """
        masters = quorum.masters
        refusable = len(masters) - quorum.majority  # more refusals than this: no majority
        elapsed = monotonic() - since
        granted = [m for m, r in zip(masters, results) if isinstance(r, Reply) and r.granted]
        if len(granted) >= quorum.majority and self._ttl - elapsed - drift_allowance(self._ttl) > 0:
            return None, None
        replies = [r for r in results if isinstance(r, Reply)]
        if sum(1 for r in replies if r.status == UPGRADE) > refusable:
            return granted, self._refused(owner, False)
        if reentry and sum(1 for r in replies if r.not_owner) > refusable:
            return granted, self._refused(owner, True)
        return granted, None

    @staticmethod
    def _quorum_tokens(results: Sequence[Any]) -> Tuple[Optional[int], ...]:
        """Each master's fencing token in a granted quorum try (None: not granted there,
        or a re-entry, which issues none)."""
        return tuple(
            r.token or None if isinstance(r, Reply) and r.granted else None for r in results
        )

    def _quorum_abandoned(
        self, quorum: Quorum, owner: str, count: int, results: Sequence[Any]
    ) -> None:
        """The answers of a try whose caller was interrupted (a signal handler raised):
        give back, one master after another, what they granted; nobody records it."""
        undo = self._release_call(owner, count)
        for master, result in zip(quorum.masters, results):
            if isinstance(result, Reply) and result.granted:
                try:
                    undo(master)
                except Exception:  # noqa: BLE001 - left to its lease
                    log.warning("%s: interrupted grant of %s left to its lease",
                                self._describe(), owner)

    def _log_failed_releases(self, owner: str, results: Sequence[Any]) -> None:
        for result in results:
            if isinstance(result, Exception):
                log.warning("%s: a minority grant of %s left to its lease: %s",
                            self._describe(), owner, result)

    @staticmethod
    def _quorum_pause(
        quorum: Quorum, results: Sequence[Any], wait: Optional[float],
        deadline: Optional[float], base: float,
    ) -> Optional[Tuple[float, float]]:
        """After a failed try (no I/O): (pause, next base), or None to return False.

        Raises the first error when the wait is over and too few masters answered to
        tell that another owner holds the lock: a failure, not a refusal (as a single
        server's would be).
        """
        now = monotonic()
        if wait == 0.0 or (deadline is not None and now >= deadline):
            errors = [r for r in results if isinstance(r, Exception)]
            if len(errors) > len(quorum.masters) - quorum.majority:
                raise errors[0]
            return None
        pause, base = quorum.next_pause(base)
        if deadline is not None:
            pause = min(pause, deadline - now)
        return pause, base

    def _quorum_reply(self, quorum: Quorum, call: Call) -> Reply:
        """Run a release or extend ``call`` on every master; the majority's answer.

        Granted (the first granting master's reply) when a majority did it; not-owner
        when more than a minority answered not-owner (the hold is no longer on a
        majority: lost). Otherwise some masters failed. A release is then done if the
        failed ones are a minority: see ``_quorum_verdict``. Else the first error is
        raised.
        """
        return self._quorum_verdict(quorum, quorum.map(call), call.script is self._release_script)

    def _quorum_verdict(self, quorum: Quorum, results: Sequence[Any], release: bool) -> Reply:
        """The majority's answer among one release's or extend's ``results`` (no I/O):
        see ``_quorum_reply``.

        A release that found its hold on some masters, not-owner on at most a minority
        and the rest unreachable (at most a minority too) is done. The holds on the
        unreachable masters count as the Redlock rules count them: alive until their
        lease ends (a master that restarts stays down for the longest lease). A hold
        whose renewals failed to reach a majority for a whole lease is marked lost and
        refused before any I/O. Nobody waits for those holds, since the reachable
        masters, a majority, are free of this owner now; they end with their lease.
        Raising the connection error there would report as a failure the one fault a
        quorum exists to mask. An extend never counts an unreachable master: its lease
        there is not extended.
        """
        done = [r for r in results if isinstance(r, Reply) and _did(r)]
        if len(done) >= quorum.majority:
            return done[0]
        minority = len(quorum.masters) - quorum.majority
        refused = [r for r in results if isinstance(r, Reply) and not _did(r)]
        if len(refused) > minority:
            return Reply(NOT_OWNER, 0, items=(-1,))
        errors = [r for r in results if isinstance(r, Exception)]
        # With at most a minority refusing, done + errors is a majority: one done at least.
        if release and len(errors) <= minority:
            log.warning("%s: released on %d of %d masters; %d unreachable, where the hold "
                        "ends with its lease: %s", self._describe(), len(done),
                        len(quorum.masters), len(errors), errors[0])
            return done[0]
        if errors:
            raise errors[0]
        return Reply(BUSY, 0)  # pragma: no cover - every master answered: one of the above

    def _log_wait(self, owner: str, since: float, granted: bool) -> None:
        metrics.wait_over(granted)  # where a waiter learns it was granted
        if log.isEnabledFor(logging.DEBUG):
            outcome = "granted" if granted else "gave up"
            log.debug(
                "%s: %s waited %.3f s, %s", self._describe(), owner, monotonic() - since, outcome
            )

    def _finish_acquire(self, owner: str, count: int, reply: Reply, since: float) -> bool:
        """The I/O-free end of an acquire: record a grant, or raise a refusal."""
        if reply.not_owner:
            raise self._refused(owner, self._held(owner) > 0)
        if reply.status == UPGRADE:
            raise self._refused(owner, False)
        if not reply.granted:
            return False
        self._record_grant(owner, count, since, token=reply.token)
        if log.isEnabledFor(logging.DEBUG):  # _describe() formats a string: not per call
            log.debug("%s acquired by %s (count %d)", self._describe(), owner, reply.holds)
        return True

    # -- after an exception from outside (signal handlers) -------------------------------
    #
    # Python runs a signal handler between any two lines, so its exception (Ctrl-C, an
    # alarm-based timeout) may hit an acquire or release anywhere: before the script is
    # sent, half-way through sending it (redis-py then closes the connection, and the
    # script may still run), while or after its answer is read, half-way through the local
    # bookkeeping. Rather than guard each of those points, the operation notes what the
    # local books said before it started (_books), and on such an exception sets them back
    # (_roll_back, or forward to "released" for a release) and then makes Redis agree with
    # them (_reconcile): one round trip reads the owner's count in Redis, and what exceeds
    # the books, up to what the operation could have added, is given back. Nothing of
    # this runs on the normal path; a second exception during it leaves the rest to the
    # lease, as before.

    def _check_condition_wait(self, owner: str, inner: Optional["Primitive"]) -> None:
        """Refuse, before any I/O, a Condition wait by ``owner`` who also holds this lock
        (or ``inner``, the read side a writer gives back with it) through another object
        of its name: the wait would have to give back and restore those levels too, and
        only the other object's books know them. RuntimeError."""
        for side in (self, inner):
            if side is not None and side._held_by_all_objects(owner) > side._held(owner):
                raise RuntimeError(
                    f"cannot wait on a Condition of {side._describe()}: this thread also "
                    "holds it through another object of the same name; wait on a Condition "
                    "of one object that holds every level"
                )

    def _tokens_held(self, owner: str) -> Tuple[Optional[int], Optional[Tuple[Optional[int], ...]]]:
        """``owner``'s hold's (token, tokens) here, to put back with :meth:`_put_tokens`
        after a hold given back and taken again as a re-entry (which issues none). No I/O."""
        hold = self._holds.get(owner)
        return (None, None) if hold is None else (hold.token, hold.tokens)

    def _put_tokens(
        self, owner: str, saved: Tuple[Optional[int], Optional[Tuple[Optional[int], ...]]]
    ) -> None:
        """Give ``owner``'s hold back the tokens :meth:`_tokens_held` saved. No I/O."""
        token, tokens = saved
        with _bookkeeping:
            hold = self._holds.get(owner)
            if hold is None:
                return
            hold.token, hold.tokens = token, tokens
            known = tokens if tokens is not None else (None if token is None else (token,))
            if known is not None:
                _process_tokens[(self._hold_key(owner), self._renew_items(owner)[0])] = known

    def _foreign_levels(self, owner: str, left: int) -> RuntimeError:
        """The error of a Condition wait whose release found ``left`` levels of ``owner``
        that no object of this process knows of: the caller takes back what it gave and
        raises this."""
        return RuntimeError(
            f"cannot wait on a Condition of {self._describe()}: Redis has {left} more "
            "level(s) of this thread than its objects here know (an object of the same "
            "name on another client, or a release whose reply was lost); wait on a "
            "Condition of one object that holds every level"
        )

    def _unsettle(self, owner: str, count: int, op: str, grant: bool = False) -> None:
        """The release ``op`` (its op id) of ``count`` levels of ``owner`` failed on a
        Redis error: they may still be in Redis. With ``grant``: the call that failed may
        have granted ``count`` levels the books lack. The owner's next acquire settles
        either (no I/O here)."""
        key = self._hold_key(owner)
        with _bookkeeping:
            _unsettled.setdefault(key, []).append((count, op, grant))
            _unsettled.move_to_end(key)
            while len(_unsettled) > _MAX_UNSETTLED:
                _unsettled.popitem(last=False)

    def _pop_unsettled(self, owner: str) -> List[Tuple[int, str, bool]]:
        """The failed calls of ``owner`` to settle before its acquire, as (levels, op id,
        grant) (forgotten here: a failed settlement puts them back). No I/O."""
        if not _unsettled:
            # (Read without the mutex: only the owner's own thread adds its entries.)
            return []
        with _bookkeeping:
            return _unsettled.pop(self._hold_key(owner), [])

    def _books(self, owner: str) -> Tuple[int, int]:
        """(holds of ``owner`` through this object, through every object of its name)."""
        return self._held(owner), self._held_by_all_objects(owner)

    def _roll_back(self, owner: str, mark: Tuple[int, int]) -> None:
        """Set the local books of ``owner`` back to ``mark`` (see :meth:`_books`) where an
        interrupted operation left them above it: a grant recorded in part or whole is
        taken off both counts, and a lease started for it stops. No I/O, never raises
        the counts (a release's target is a mark too)."""
        own, everywhere = mark
        key = self._hold_key(owner)
        lease: Optional[Lease] = None
        keep: Optional[Lease] = None
        with _bookkeeping:
            _forget_orphans_locked()
            hold = self._holds.get(owner)
            if hold is not None and hold.count > own:
                hold.count = own
            extra = _process_holds.get(key, 0) - everywhere
            if extra > 0:
                if everywhere > 0:
                    _process_holds[key] = everywhere
                else:
                    _process_holds.pop(key, None)
            if hold is not None:
                if hold.count <= 0:
                    del self._holds[owner]
                    lease, hold.lease = hold.lease, None
                keep = hold.lease
            ended_here = key not in _process_holds
        if ended_here:
            self._unhold(owner)
        renewer = self._renewer()
        if lease is not None:
            renewer.cancel(lease)
        # A lease started for the grant but not yet attached to the hold.
        renewer.cancel_others(self, owner, keep)

    def _reconcile(self, owner: str, most: int) -> None:
        """Give back what ``owner`` holds in Redis beyond the local books, at most
        ``most`` (what the interrupted operation could have left there): one round trip
        to read the count, one more only if there is something to give back. Never
        raises: on failure what is left ends with its lease."""
        try:
            # A plain read of the owner's field (see _hold_field): the renew script's
            # reply counts items renewed, not holds.
            held = self._client.hget(self._keys.hash, self._hold_field(owner))
            if held is None:
                return  # the owner holds nothing here: nothing to give back
            excess = min(most, int(held) - self._held_by_all_objects(owner))
            if excess > 0:
                self._release_call(owner, excess)(self._client)
                log.debug("%s: %d interrupted level(s) of %s given back",
                          self._describe(), excess, owner)
        except BaseException:  # noqa: BLE001 - the first exception is what propagates
            log.warning("%s: interrupted operation of %s left to its lease",
                        self._describe(), owner)

    def _release(self, owner: str, count: int) -> int:
        """Release ``count`` of ``owner``'s holds (the exclusive-owner release); returns
        the holds ``owner`` has left in Redis (through any object of this name).

        Raises NotOwnedError (no I/O) when the owner holds fewer here, and LockLostError
        when the hold turns out lost; in both cases nothing in Redis changes.

        Exact counts travel to Redis, whose count is the truth: two objects with one name
        in one thread are one lock, and each gives back only the levels it took.
        On a Redis error the local holds are dropped anyway and renewal stops, so the
        server-side hold ends with its lease at the latest; the error propagates.
        """
        own, everywhere = self._books(owner)
        call, carry = self._begin_release(owner, count)
        sent = serial()
        client = self._client
        op = new_op(identity.thread_owner())
        reply: Optional[Reply] = None
        try:
            self._mark_releasing(owner, count)
            if isinstance(client, Quorum):
                try:
                    reply = self._quorum_reply(client, call)
                finally:
                    client.released()
            else:
                # The no-op callback has an interrupted read fenced (see Call): the script
                # has then surely run when _reconcile looks.
                reply = call(client, _ignore, op)
            leave = self._carry_end(owner, carry, reply)
            carry = None
            if leave is not None:
                self._leave_for(leave)
            self._finish_release(owner, count, reply)
        except RLocksError:
            if carry is not None:
                self._carry_end(owner, carry, None)
            raise  # the hold was lost: reported, and dropped from the books
        except BaseException as exc:
            leave = None if carry is None else self._carry_end(owner, carry, None)
            self._end_releasing(owner, answered=False)
            if foreign(exc) and not isinstance(client, Quorum):
                # Interrupted anywhere: finish the release, in the books (a drop done in
                # part or not at all) and in Redis (a script that did not run).
                self._roll_back(owner, (own - count, everywhere - count))
                self._reconcile(owner, count)
            else:
                # (A quorum's release went to every master at once; what an interrupt
                # left on some of them ends with its lease.)
                self._record_release(owner, count)
                if not isinstance(client, Quorum):
                    self._unsettle(owner, count, op)
            if leave is not None:
                # The waiter it carried stopped waiting, and the script may have queued
                # it: take it out (after the reconcile, when an interrupted script has
                # surely run).
                self._leave_for(leave)
            raise
        # Outside the try: the release is complete; an interrupt while signalling local
        # waiters leaves them to their re-check, it does not undo the release.
        self._deliver(reply, sent)
        return reply.holds

    def _leave_for(self, call: Call) -> None:
        """Run the leave :meth:`_carry_end` asked for; a failure is left to the entry's
        lease (logged)."""
        try:
            call(self._client, _ignore, new_op(identity.thread_owner()))
        except Exception:  # noqa: BLE001 - the entry ends with its short lease
            log.debug("%s: leave for a waiter that stopped failed", self._describe(),
                      exc_info=True)

    def _begin_release(self, owner: str, count: int) -> Tuple[Call, Optional[Carry]]:
        """The I/O-free start of a release: refuse what is not held or known lost.

        Returns the call, and the carry (:meth:`_carry_begin`) it makes: the caller
        must end it with :meth:`_carry_end` whatever the call's outcome."""
        hold = self._holds.get(owner)
        if hold is None or hold.count < count:
            raise NotOwnedError(
                f"cannot release un-acquired lock {self._describe()}", name=self._name
            )
        if hold.lost:
            self._record_release(owner, count)
            raise self._lost_error()
        carry = None
        if self._defers_next() and count >= self._held_by_all_objects(owner):
            # The process's last level: the waiter this hold kept from queueing is
            # queued by this release itself (or, when it cannot be, queues now), so its
            # call does not reach Redis beside the next holder's critical section.
            carry = self._carry_begin(owner)
        if carry is not None:
            hub, waiter = carry
            kind, want = waiter.ask
            # (an RWLock's waiter may want either side: its renew item kind says which)
            then = (hub.entry, waiter.id, *((kind,) if kind in ("r", "w") else ()), want)

            def build() -> Tuple[Sequence[str], Sequence[Arg]]:
                keys, args = self._release_arguments(owner, count)
                return keys, (*args, *then)

            call = self._prepared(("release", owner, count, then), self._release_script, build)
            return call, (hub, waiter, monotonic())
        return self._prepared(
            ("release", owner, count),
            self._release_script,
            lambda: self._release_arguments(owner, count),
        ), None

    def _mark_releasing(self, owner: str, count: int) -> None:
        """A release of ``count`` levels is about to be sent (no I/O): if they are the
        hold's last, the renewer's finding that it is gone waits for the release's answer
        from now on (see :meth:`_hold_lost`). The caller calls it first thing inside the
        ``try`` whose every exit ends it (:meth:`_finish_release`, :meth:`_take_pending`):
        marked any earlier, an interrupt before that ``try`` left the mark for good, and
        every later loss of the hold unreported (bug hunt)."""
        with _bookkeeping:
            hold = self._holds.get(owner)
            if hold is not None and count >= hold.count:
                hold.releasing = True

    def _take_pending(self, owner: str) -> Optional[str]:
        """End the mark of :meth:`_mark_releasing` (no I/O); returns the renewer's finding
        that was put off meanwhile (why the hold was found gone), or None."""
        with _bookkeeping:
            hold = self._holds.get(owner)
            if hold is None or not hold.releasing:
                return None
            hold.releasing = False
            reason, hold.pending = hold.pending, None
        return reason

    def _end_releasing(self, owner: str, answered: bool) -> None:
        """The release of ``owner``'s last level is over (no I/O). With the release's
        answer (``answered``), that answer is the truth: not-owner reports the loss itself,
        a release that took the hold means the renewal came after it. Without one (the call
        failed, or was cut short), the renewer's finding is reported as it came."""
        reason = self._take_pending(owner)
        if reason is not None and not answered:
            self._hold_lost(owner, reason)

    def _finish_release(self, owner: str, count: int, reply: Reply) -> None:
        """The I/O-free end of a release: drop the local holds, report a loss."""
        self._end_releasing(owner, answered=True)
        if reply.not_owner:
            self._hold_lost(owner, "its hold was gone at release")
            self._record_release(owner, count)
            raise self._lost_error()
        self._record_release(owner, count)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s released by %s (count %d)", self._describe(), owner, reply.holds)

    def _begin_extend(self, owner: str, ttl: Optional[float]) -> Call:
        """The I/O-free start of ``extend``: check ``ttl``, refuse what is not held.

        Raises TypeError/ValueError for a bad ``ttl``, NotOwnedError when ``owner`` holds
        nothing here, LockLostError when its hold is known lost; all before any I/O.
        """
        lease_ms = self._ttl_ms if ttl is None else checks.check_ttl(ttl, self._label, self._name)
        hold = self._holds.get(owner)
        if hold is None or hold.count <= 0:
            raise NotOwnedError(
                f"cannot extend un-acquired lock {self._describe()}", name=self._name
            )
        if hold.lost:
            raise self._lost_error()
        # The renew script with an explicit lease: it never shortens a live lease, so a
        # short extend cannot cut a longer one another object of this owner relies on.
        return Call(self._renew_script, *self._renew_arguments(owner, lease_ms), self._replication)

    def _finish_extend(self, owner: str, reply: Reply) -> None:
        """The I/O-free end of ``extend``: a hold found gone is reported lost and raised."""
        if reply.not_owner or not reply.items or reply.items[0] != 1:
            self._hold_lost(owner, "its hold was gone at extend")
            raise self._lost_error()
        if self._replication is not None and reply.replicas < self._replication[0]:
            log.warning(
                "extend of %s acknowledged by %d of %d replicas",
                self._describe(), reply.replicas, self._replication[0],
            )

    def _extend(self, owner: str, ttl: Optional[float]) -> None:
        """Make ``owner``'s hold last at least ``ttl`` (default: the primitive's) from now."""
        call = self._begin_extend(owner, ttl)
        client = self._client
        reply = self._quorum_reply(client, call) if isinstance(client, Quorum) else call(client)
        self._finish_extend(owner, reply)

    def _owns(self, owner: str) -> bool:
        """Whether ``owner`` holds this primitive and its hold is not known lost (no I/O)."""
        hold = self._holds.get(owner)
        return hold is not None and hold.count > 0 and not hold.lost

    def _exit_reported_loss(self, exc: Optional[BaseException], owner: str) -> bool:
        """For ``__exit__``: if an inner block already reported this primitive lost, drop
        one local level without raising the same news a second time (True); else False.
        """
        if isinstance(exc, LockLostError) and getattr(exc, "lock", None) is self:
            self._record_release(owner, 1)
            return True
        return False

    def _lost_error(self, reentering: bool = False) -> LockLostError:
        # Re-entering names what to do: the lost levels must be released first.
        then = "; it cannot be re-entered until released" if reentering else ""
        err = LockLostError(
            f"{self._describe()} was lost before it was released: its lease ended or the "
            f"key was removed; another owner may hold it now (it was not touched){then}",
            name=self._name,
        )
        err.lock = self  # type: ignore[attr-defined]
        return err

    def _holds_here(self) -> List[Tuple[str, Hold]]:
        """The local holds of *this* process's owners on this object (no I/O).

        A fork child inherits its parent's table, but none of those owners is its own
        (owner ids are drawn anew in a child): they are not listed, so nothing the child
        does on this object can give back or count what its parent holds.
        """
        mine = identity.process_token() + ":"
        return [(owner, hold) for owner, hold in list(self._holds.items())
                if owner.startswith(mine)]

    def _local_owners(self) -> List[Tuple[str, int]]:
        """Owners of *this* process that hold something here, with their counts (no I/O;
        see :meth:`_holds_here`)."""
        return [(owner, hold.count) for owner, hold in self._holds_here()]

    # -- fork, copy, pickle --------------------------------------------------------------

    def _at_fork_reinit(self) -> None:
        """Forget every local hold, without any I/O: for a ``fork()`` child only.

        ``threading``'s locks have this hook, and ``logging`` calls it in the child on
        each handler's lock. Holds belong to the process that was granted them and the
        child's owner ids are new, so the child holds nothing: the parent's holds stay in
        Redis, the parent's to release. It takes no mutex (one may have been held by a
        parent thread at the fork) and touches neither Redis nor the renewer.
        """
        self._holds = {}
        self._calls = {}

    def __reduce_ex__(self, protocol: Any) -> Any:
        # A copy would share (or duplicate) the holds of this process's owners, and an
        # unpickled lock in another process could never release them: refuse, as
        # threading's locks do. Another object of the same name is the same lock.
        raise TypeError(
            f"cannot pickle or copy {self._label!r} object {self._name!r}: its holds belong "
            "to this process; build another object with the same name instead"
        )


def _ignore(reply: Reply) -> None:
    """An interrupted release's answer: nothing to do with it (see _release)."""


def _did(reply: Reply) -> bool:
    """Whether a release or renew reply says the master did it (the owner held there)."""
    return reply.granted and (not reply.items or reply.items[0] == 1)


def _is_async_client(client: Any) -> bool:
    try:
        import redis.asyncio
    except ImportError:  # pragma: no cover
        return False
    return isinstance(client, (redis.asyncio.Redis, redis.asyncio.RedisCluster))


class SyncPrimitive(Primitive):
    """A threading primitive: ``with`` gives back the level its block acquired, the way
    every rlocks primitive unwinds a hold an inner block already reported lost. (The
    asyncio twins refuse ``with``: ``aio.AsyncPrimitive``.)"""

    __slots__ = ()

    def release(self) -> None:
        """Give back one level (a permit) of the calling thread; see the primitive's own."""
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if not self._exit_reported_loss(exc, self._owner()):
            self.release()
