"""What every primitive object is, without I/O: its settings, what it sends, what it took.

A primitive object (``rlocks.RLock``, an RWLock side, a semaphore, and their asyncio
twins) is a :class:`Primitive` with a :class:`Spec`: which scripts, which keys and which
arguments its kind sends (:class:`LockSpec` for an RLock and each RWLock side,
:class:`PermitSpec` for semaphores). The dialogues (:mod:`.dialogues`) run the calls; the
public classes (:mod:`.surface`, ``rlocks/*.py``) add the ``threading`` surface.

An object counts the levels (or permits) each owner took through it, and shares the
owner's :class:`~.holds.Hold` with every other object of the same primitive in this
process (two objects of one name are one primitive).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, Mapping, Optional, Set, Tuple

from .. import errors
from . import callbacks, checks, identity
from .backends import backend_for
from .clients import checked_client, default_client, encoding_of, is_cluster
from .holds import LOST, Hold, hold_for, peek
from .keys import PrimitiveKeys, keys_for
from .scripts import Call, load

__all__ = ["ENTRY_LEASE", "PATIENCE", "LockSpec", "Options", "PermitSpec", "Primitive"]

ENTRY_LEASE = 2.0  # s: a waiter's place in the queue lives this long between its looks
PATIENCE = 100  # ms: fair=False lets a woken head be passed over this long (lua/lib.lua)


@dataclass(frozen=True)
class Options:
    """The constructor keywords every primitive shares (their meaning is in
    ``rlocks.RLock``'s docstring), as the public ``__init__`` hands them on."""

    client: Any
    ttl: float
    auto_renew: bool
    namespace: str
    on_lost: Optional[Callable[[Any], object]]
    replicas: int
    replica_wait: float
    fair: bool
    entry_lease: float
    deadlock_timeout: Optional[float] = None

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> "Options":
        return cls(**{f.name: arguments[f.name] for f in fields(cls) if f.name in arguments})


class LockSpec:
    """What an RLock (``side`` ``x``) or an RWLock side (``r`` / ``w``) sends."""

    __slots__ = ("kind", "code", "side", "acquire_script", "release_script", "renew_script",
                 "leave_script", "keys")

    def __init__(self, kind: str, side: str, code: Optional[str] = None) -> None:
        # kind: the scripts ("rlock", "rw"); code: the key kind (a Lock's is "lock").
        self.kind, self.side, self.code = kind, side, code or kind
        lib = "rlock_lib" if kind == "rlock" else "rw_lib"
        self.acquire_script = load(f"{kind}_acquire", lib)
        self.release_script = load(f"{kind}_release", lib)
        self.renew_script = load(f"{kind}_renew", lib)
        self.leave_script = load("leave", lib)

    def field(self, owner: str) -> str:
        return owner if self.kind == "rlock" else f"{self.side}:{owner}"

    def acquire(self, p: "Primitive", owner: str, expect: int, entry_ms: int) -> Call:
        k = p._keys
        fair = "1" if p._fair else "0"
        if self.kind == "rlock":
            return Call(self.acquire_script, (k.hash, k.queue, k.fence),
                        (owner, p._ttl_ms, expect, fair, entry_ms, k.wake, PATIENCE),
                        p._replication)
        return Call(self.acquire_script, (k.hash, k.queue, k.leases, k.fence),
                    (owner, self.side, p._ttl_ms, expect, fair, entry_ms, k.wake, PATIENCE),
                    p._replication)

    def release(self, p: "Primitive", owner: str, expect: int) -> Call:
        k = p._keys
        fair = "1" if p._fair else "0"
        if self.kind == "rlock":
            return Call(self.release_script, (k.hash, k.queue),
                        (owner, expect, fair, k.wake, PATIENCE))
        return Call(self.release_script, (k.hash, k.queue, k.leases),
                    (owner, self.side, expect, fair, k.wake, PATIENCE))

    def renew(self, p: "Primitive", owner: str, ttl_ms: int) -> Call:
        k = p._keys
        if self.kind == "rlock":
            return Call(self.renew_script, (k.hash,), (owner, ttl_ms), p._replication)
        return Call(self.renew_script, (k.hash, k.queue, k.leases), (owner, self.side, ttl_ms),
                    p._replication)

    def leave(self, p: "Primitive", owner: str) -> Call:
        k = p._keys
        return Call(self.leave_script, (k.hash, k.queue, k.leases), (owner, k.wake, 0))


class PermitSpec:
    """What a (Bounded)Semaphore sends."""

    __slots__ = ("kind", "code", "side", "value", "bounded", "acquire_script", "release_script",
                 "renew_script", "leave_script")

    def __init__(self, value: int, bounded: bool) -> None:
        self.kind, self.code, self.side = "sem", "sem", "p"
        self.value, self.bounded = value, 1 if bounded else 0
        self.acquire_script = load("sem_acquire", "sem_lib")
        self.release_script = load("sem_release", "sem_lib")
        self.renew_script = load("sem_renew", "sem_lib")
        self.leave_script = load("leave", "sem_lib")

    def field(self, owner: str) -> str:
        return owner

    def _keys(self, p: "Primitive") -> Tuple[str, str, str]:
        k = p._keys
        return (k.hash, k.queue, k.leases)

    def acquire(self, p: "Primitive", owner: str, expect: int, entry_ms: int) -> Call:
        return Call(self.acquire_script, self._keys(p),
                    (owner, p._keys.wake, self.value, self.bounded, p._ttl_ms, expect,
                     "1" if p._fair else "0", entry_ms, PATIENCE), p._replication)

    def release_permits(self, p: "Primitive", owner: str, n: int,
                        triples: Tuple[Tuple[str, int, int], ...]) -> Call:
        flat = [part for triple in triples for part in triple]
        return Call(self.release_script, self._keys(p),
                    (owner, p._keys.wake, self.value, self.bounded, n,
                     "1" if p._fair else "0", PATIENCE, *flat))

    def renew(self, p: "Primitive", owner: str, ttl_ms: int) -> Call:
        return Call(self.renew_script, self._keys(p), (owner, ttl_ms), p._replication)

    def leave(self, p: "Primitive", owner: str) -> Call:
        return Call(self.leave_script, self._keys(p), (owner, p._keys.wake, self.value))


class Primitive:
    """A primitive object's settings and books (no I/O)."""

    __slots__ = ("_name", "_namespace", "_client", "_backend", "_ttl", "_ttl_ms",
                 "_auto_renew", "_on_lost", "_keys", "_replication", "_fair", "_entry_ms",
                 "_deadlock_timeout", "_spec", "_mine", "_restoring", "_spare", "_description",
                 "_gate_of", "__weakref__")

    #: Public class name used in messages and reprs, e.g. ``"rlocks.RLock"``.
    _label = "rlocks.Primitive"
    #: Whether an ``async def`` on_lost is accepted (and awaited): the asyncio twins.
    _aio = False
    #: Why a Quorum is refused (None: accepted).
    _quorum_refusal: Optional[str] = None

    def _configure(self, name: str, options: Options, kind: str, spec: Any) -> None:
        """Check ``name`` and ``options``, set this object up (no I/O). Raises
        TypeError/ValueError naming the public class."""
        label = self._label
        self._name = checks.check_name(name, label)
        where = f"{label}({checks.shown(name)})"
        self._namespace = checks.check_namespace(options.namespace, label, name)
        self._ttl_ms = checks.check_ttl(options.ttl, label, name)
        self._ttl = self._ttl_ms / 1000.0
        on_lost = options.on_lost
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"{where}: on_lost must be callable, "
                            f"not {type(on_lost).__name__}")
        if inspect.iscoroutinefunction(on_lost) and not self._aio:
            raise TypeError(
                f"{where}: on_lost is a coroutine function, which a threading "
                "primitive cannot await; pass a plain function, or use rlocks.asyncio")
        client = self._resolve_client(options.client)
        masters = getattr(client, "masters", (client,))
        checks.check_wire_names({"name": self._name, "namespace": self._namespace},
                                [encoding_of(c) for c in masters], where)
        self._client = client
        self._backend: Any = backend_for(client) if client is not None else None
        self._replication = checks.replication(options.replicas, options.replica_wait,
                                               label, name)
        if self._replication is not None and not getattr(self._backend, "queues", True):
            raise ValueError(f"{where}: replicas= is not supported with a Quorum: "
                             "the masters are meant to be independent (no replicas to wait for)")
        if self._replication is not None and is_cluster(client):
            raise ValueError(f"{where}: replicas= is not supported on Redis Cluster "
                             "clients (WAIT has no key to be routed by); see docs/operations.md")
        self._auto_renew = bool(options.auto_renew)
        if not isinstance(options.fair, bool):
            raise TypeError(f"{where}: fair must be a bool, "
                            f"not {type(options.fair).__name__}")
        self._fair = options.fair
        self._deadlock_timeout = checks.deadlock_timeout(options.deadlock_timeout, label, name)
        self._entry_ms = checks.entry_lease(options.entry_lease, label, name)
        self._on_lost = on_lost
        self._keys: PrimitiveKeys = keys_for(self._namespace, kind, self._name)
        self._spec = spec
        self._mine: Dict[str, Tuple[Hold, int]] = {}
        self._restoring: Set[str] = set()
        # The hold whose last level this object gave back: the owner's next acquire reuses
        # it (no new Hold and finalizer per acquire; see _hold).
        self._spare: Optional[Hold] = None
        self._description: Optional[str] = None
        self._gate_of: Any = None

    def _resolve_client(self, client: Any) -> Any:
        label = f"{self._label}({self._shown})"
        if client is None:
            return self._default_client()
        if hasattr(client, "masters") and hasattr(client, "queues"):
            if self._quorum_refusal is not None:
                raise ValueError(f"{label}: client is a Quorum, but {self._quorum_refusal}")
            if client.aio != self._aio:
                kind = "redis.asyncio" if client.aio else "redis.Redis"
                raise TypeError(f"{label}: the Quorum's clients are {kind} clients; use "
                                f"{'rlocks.asyncio' if client.aio else 'rlocks'} for them")
            return client
        return checked_client(client, label, self._aio)

    def _default_client(self) -> Any:
        return default_client()

    # -- read-only facts ------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The primitive's name, as given."""
        return self._name

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def ttl(self) -> float:
        """The lease, in seconds, each hold gets (and gets again at each renewal)."""
        return self._ttl

    @property
    def client(self) -> Any:
        """The client (or Quorum) this primitive talks to."""
        return self._client

    def _at_fork_reinit(self) -> None:
        """Forget every level this object took, without I/O or a mutex: for a fork child
        (``holds`` calls it; so does ``logging`` on a handler's lock). The holds are the
        parent's: they stay in Redis, the parent's to release."""
        self._mine = {}
        self._restoring = set()
        self._spare = None

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"cannot pickle or copy {self._label}({self._shown}): it stands for "
                        "this process's holds")

    @property
    def _shown(self) -> str:
        """The name as reprs and errors print it (a long one shortened)."""
        return checks.shown(self._name)

    def _gate(self) -> Any:
        """What bounds the calls this primitive's waiters of this process have on the way
        at once (``backends.Server.gate``), looked up once per object."""
        if self._aio:  # (asyncio: the loop's own, each time)
            return self._backend.gate(self._keys.hash)
        if self._gate_of is None:
            self._gate_of = self._backend.gate(self._keys.hash)
        return self._gate_of

    def _describe(self) -> str:
        if self._description is None:
            self._description = f"{self._label.rsplit('.', 1)[-1]} {self._shown}"
        return self._description

    # -- owners and books -------------------------------------------------------------------

    @staticmethod
    def _owner() -> str:
        """Who owns what this object acquires now: the calling thread (the task, in the
        asyncio twins). No I/O."""
        return identity.thread_owner()

    def _ident(self, owner: str) -> Tuple[Any, ...]:
        return (self._backend.address, self._keys.hash, self._spec.side, owner)

    def _hold(self, owner: str) -> Hold:
        """The owner's hold of this primitive (shared with other objects of its name)."""
        taken = self._mine.get(owner)
        if taken is not None:
            return taken[0]
        spare = self._spare
        if spare is not None and spare.owner == owner and (spare.state != LOST
                                                          or spare.count > 0):
            return spare  # the registry's hold of this ident (hold_for would return it)
        return hold_for(self._ident(owner), self._describe(), owner)

    def _levels(self, owner: str) -> int:
        taken = self._mine.get(owner)
        return 0 if taken is None else taken[1]

    def _took(self, owner: str, hold: Hold, n: int = 1) -> None:
        self._mine[owner] = (hold, self._levels(owner) + n)
        hold.objects.add(self)

    def _gave(self, owner: str, n: int = 1) -> None:
        hold, levels = self._mine[owner]
        if levels - n <= 0:
            del self._mine[owner]
            hold.objects.discard(self)
            self._spare = hold
        else:
            self._mine[owner] = (hold, levels - n)

    def _hold_lost(self, hold: Hold) -> None:
        """The hold ``hold`` this object took levels of was lost: its ``on_lost``."""
        if self._on_lost is not None:
            callbacks.dispatch(self._on_lost, self, f"on_lost of {self._describe()}")

    def _lost_error(self, hold: Hold, what: str = "released") -> errors.LockLostError:
        """The error a re-entry, release or extend of a lost hold raises (``exc.lock``
        is this object: an outer ``with`` block then reports it no second time)."""
        then = "; it cannot be re-entered until released" if what == "acquired again" else ""
        err = errors.LockLostError(
            f"{self._describe()} was lost before it was released: its lease ended or the "
            f"key was removed; another owner may hold it now (it was not touched){then}",
            name=self._name)
        err.lock = self  # type: ignore[attr-defined]
        return err

    def _not_owned(self, what: str = "release") -> errors.NotOwnedError:
        return errors.NotOwnedError(
            f"cannot {what} un-acquired lock {self._label}({self._shown})", name=self._name)

    def _owned(self, owner: str) -> bool:
        """Whether ``owner`` holds this primitive (through any object), as far as this
        process knows: False once the hold is known lost. No I/O."""
        hold = peek(self._ident(owner))
        return hold is not None and hold.count > 0 and hold.alive
