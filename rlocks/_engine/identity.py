"""Owner identity: the string that names *who* holds a hold.

An owner id is ``host:pid:nonce:serial``:

- ``host`` and ``pid`` make ids readable in ``redis-cli`` and unique across hosts;
- ``nonce`` is 64 random bits drawn when the process starts and drawn again in every
  ``fork()`` child (``os.register_at_fork``), so a reused pid, or a child that inherited
  its parent's memory, never presents an id that already holds something;
- ``serial`` numbers threads in the order they first ask for an id. It lives in a
  ``threading.local`` (which works for threads started with ``_thread.start_new_thread``
  too, and does not create ``threading._DummyThread`` objects), so a new thread that
  reuses a dead thread's ident still gets a fresh serial.

Every hold belongs to a thread (semaphore permits too: the taking thread's, see
``semaphore.py``). ``process_token()`` (``host:pid:nonce``) names the process: its wake-up
channel and the prefix of its owners' ids. ``task_owner()`` is the id of the running
asyncio task (``host:pid:nonce:a<serial>``), for the ``rlocks.asyncio`` primitives: in
asyncio the task, not the thread, is who holds.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import threading
import weakref
from typing import Any, Tuple

__all__ = ["thread_owner", "task_owner", "process_token"]

_HOST = socket.gethostname() or "localhost"

# Bumped at every (re)initialisation; a thread's cached id is valid only for the epoch it was
# built in, which is how a fork child's threads notice that their cached id is stale.
_epoch = 0
_prefix = ""
_serials = itertools.count(1)
_local = threading.local()
# Task -> (epoch, owner id). Weak: a finished task's id goes with it; a new task is a new
# object and gets a new serial even if it lands at the same address.
_tasks: "weakref.WeakKeyDictionary[asyncio.Task[Any], Tuple[int, str]]" = (
    weakref.WeakKeyDictionary()
)


def _new_process_identity() -> None:
    global _epoch, _prefix, _serials
    _prefix = f"{_HOST}:{os.getpid()}:{os.urandom(8).hex()}"
    _serials = itertools.count(1)
    _epoch += 1


_new_process_identity()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_process_identity)


def thread_owner() -> str:
    """The calling thread's owner id (cached per thread; no I/O)."""
    local = _local
    try:
        if local.epoch == _epoch:
            owner: str = local.owner
            return owner
    except AttributeError:
        pass
    # next() on itertools.count is atomic under the GIL, so two new threads never share
    # a serial.
    owner = f"{_prefix}:{next(_serials)}"
    local.owner = owner
    local.epoch = _epoch
    return owner


def task_owner() -> str:
    """The running asyncio task's owner id (cached per task; no I/O).

    Raises RuntimeError outside a task, as ``asyncio.current_task`` does.
    """
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("rlocks.asyncio primitives must be used from an asyncio task")
    cached = _tasks.get(task)
    if cached is not None and cached[0] == _epoch:
        owner = cached[1]
    else:
        owner = f"{_prefix}:a{next(_serials)}"
        _tasks[task] = (_epoch, owner)
    return owner


def process_token() -> str:
    """``host:pid:nonce`` of this process: unique per process lifetime, renewed at fork."""
    return _prefix
