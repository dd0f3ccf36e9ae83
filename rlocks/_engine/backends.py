"""Where a primitive's calls go: one Redis server or cluster (:class:`Server`), or a
quorum of independent masters (``quorum.Quorum``). Both offer the same few operations,
which the steps of a dialogue name (:mod:`.steps`); the dialogues never ask which one
they talk to.

- ``run(call)`` / ``arun(call)``: one script call, its :class:`~.scripts.Reply`;
- ``run_many(calls)`` / ``arun_many(calls)``: several, in one round trip (renewals);
- ``read(args)`` / ``aread(args)``: one plain command;
- ``enlist(namespace, key, owner)`` / ``aenlist(...)``: a :class:`~.wakeups.Waiter`;
- ``gate(key)``: what bounds the calls a crowd of one primitive's waiters make at once;
- ``queues``: whether waiters queue on the server (False: they re-try);
- ``address``: what identifies the server(s), for the process's hold registry;
- ``aio``: whether the client is a ``redis.asyncio`` one.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import weakref
from typing import Any, Dict, List, Sequence, Tuple

from .clients import bounded, io_client, is_cluster
from .scripts import Call, Reply, arun_many, run_many
from .wakeups import AsyncHub, Hub, Waiter

__all__ = ["GATE", "Server", "address_of", "backend_for"]

#: Calls one primitive's waiters of a process may have on the way at once.
GATE = 2


def address_of(client: Any) -> Tuple[Any, ...]:
    """What identifies the server a client talks to (no I/O)."""
    if is_cluster(client) or hasattr(client, "get_nodes"):
        try:
            # (an asyncio cluster client knows no nodes before its first call: then the
            # nodes it was given to start from)
            nodes = client.get_nodes() or client.nodes_manager.startup_nodes.values()
            return ("cluster", tuple(sorted((n.host, n.port) for n in nodes)))
        except Exception:  # noqa: BLE001
            return ("cluster", id(client))
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if kwargs is None:
        return ("client", id(client))
    where = kwargs.get("path") or (kwargs.get("host", "localhost"), kwargs.get("port", 6379))
    return ("server", where, kwargs.get("db", 0))


def _is_async(client: Any) -> bool:
    return type(client).__module__.startswith("redis.asyncio")


class Server:
    """A redis-py client (``redis.Redis``, ``RedisCluster``, or their asyncio twins)."""

    queues = True

    def __init__(self, client: Any) -> None:
        self.client = client
        self.aio = _is_async(client)
        self.address = address_of(client)
        self._forget()
        _servers.add(self)

    def _forget(self) -> None:
        """No hubs, gates or renewers (at construction, and in a fork child: the parent's
        listen on the parent's channel, from threads the child does not have)."""
        #: The renewer thread of this backend, and its renewer task per event loop
        #: (``renewal.renewer_for``), kept here so they go with the backend.
        self.renewer: Any = None
        self.async_renewers: "weakref.WeakKeyDictionary[Any, Any]" = (
            weakref.WeakKeyDictionary())
        self._hubs: Dict[str, Any] = {}
        self._hub_lock = threading.Lock()
        self._async_hubs: "weakref.WeakKeyDictionary[Any, Dict[str, AsyncHub]]" = (
            weakref.WeakKeyDictionary())
        self._gates: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()

    def __repr__(self) -> str:
        return f"<Server {self.address}>"

    def run(self, call: Call) -> Reply:
        return call(self.client)

    async def arun(self, call: Call) -> Reply:
        return await call.arun(self.client)

    def run_many(self, calls: Sequence[Call]) -> List[Reply | BaseException]:
        return run_many(self.client, calls)

    async def arun_many(self, calls: Sequence[Call]) -> List[Reply | BaseException]:
        return await arun_many(self.client, calls)

    def gate(self, key: str) -> Any:
        """What bounds the calls one primitive's waiters of this process have on the way at
        once (:data:`GATE`), shared by every object of the name: an asyncio.Semaphore, or
        for threads a queue of GATE tokens (``queue.SimpleQueue``, all C: an interrupt
        cannot strike inside taking or giving one and strand it; ``steps.drive``)."""
        with self._hub_lock:
            found = self._gates.get(key)
            if found is None:
                if self.aio:
                    found = asyncio.Semaphore(GATE)
                else:
                    found = queue.SimpleQueue()
                    for _ in range(GATE):
                        found.put(None)
                self._gates[key] = found
            return found

    def read(self, args: Sequence[Any]) -> Any:
        client = io_client(self.client)
        if args[0] == "SCRIPT" and hasattr(client, "get_primaries"):  # keyless: every master
            return client.execute_command(*args, target_nodes=client.get_primaries())
        return client.execute_command(*args)

    async def aread(self, args: Sequence[Any]) -> Any:
        client = io_client(self.client)
        if args[0] == "SCRIPT" and hasattr(client, "get_primaries"):
            await client.initialize()
            return await bounded(
                client.execute_command(*args, target_nodes=client.get_primaries()))
        return await bounded(client.execute_command(*args))

    def enlist(self, channel: str, key: str, owner: str, seconds: float) -> Waiter:
        with self._hub_lock:
            hub = self._hubs.get(channel)
            if hub is None:
                hub = self._hubs[channel] = Hub(io_client(self.client), channel)
        return hub.enlist(key, owner, seconds)

    async def aenlist(self, channel: str, key: str, owner: str, seconds: float) -> Waiter:
        loop = asyncio.get_running_loop()
        hubs = self._async_hubs.setdefault(loop, {})
        hub = hubs.get(channel)
        if hub is None:
            hub = hubs[channel] = AsyncHub(io_client(self.client), channel)
        return await hub.enlist(key, owner, seconds)


_servers: "weakref.WeakSet[Server]" = weakref.WeakSet()
_mutex = threading.Lock()


def _reset_after_fork() -> None:
    global _mutex
    _mutex = threading.Lock()
    for server in list(_servers):
        server._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


#: The attribute of a redis-py client that holds its backend: the two refer to each other,
#: so they go together when the program drops the client (a registry keyed by the client
#: would keep it alive through the backend's hubs and renewers).
_ATTRIBUTE = "_rlocks_backend"


def backend_for(client: Any) -> Any:
    """The backend of ``client``: a Quorum is its own; a redis-py client's is shared by
    every primitive that uses that client object."""
    if hasattr(client, "run") and hasattr(client, "queues"):
        return client  # a Quorum
    with _mutex:
        try:
            attributes = vars(client)
        except TypeError:  # pragma: no cover - a client class without __dict__
            return Server(client)  # not shared: each primitive has its own
        found = attributes.get(_ATTRIBUTE)
        if found is None:
            found = attributes[_ATTRIBUTE] = Server(client)
        return found
