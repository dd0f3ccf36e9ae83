"""Where user callbacks (``on_lost``) run: one dispatch thread per process, never the renewer.

A loss is found by the renewer (or by a release). Running the user's callback right there
would let a slow callback (a clean-up that takes seconds) delay the renewal of every other
hold of the process past its lease, so that a healthy lock is lost too. The renewer only
queues the call here; a daemon thread runs queued calls one at a time, in the order the
losses were found.

The thread starts with the first call and exits after :data:`IDLE_EXIT` seconds with
nothing to do. A ``fork()`` child starts with an empty queue and no thread: the parent's
losses are the parent's to report (the child never held anything).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from typing import Any, Callable, Deque, Optional, Tuple

__all__ = ["IDLE_EXIT", "dispatch"]

log = logging.getLogger(__name__)

IDLE_EXIT = 10.0  # s without calls after which the dispatch thread exits

_Job = Tuple[Callable[[Any], object], Any, str]

_mutex = threading.Lock()
_ready = threading.Condition(_mutex)
_queue: Deque[_Job] = collections.deque()
_thread: Optional[threading.Thread] = None


def dispatch(callback: Callable[[Any], object], argument: Any, what: str) -> None:
    """Call ``callback(argument)`` soon on the dispatch thread; returns at once, no I/O.

    ``what`` names the call in the log if it raises (any exception, SystemExit too, is
    logged, never raised: a callback cannot break the machinery that reported the loss).
    """
    global _thread
    with _mutex:
        _queue.append((callback, argument, what))
        if _thread is None:
            _thread = threading.Thread(target=_run, name="rlocks-callbacks", daemon=True)
            _thread.start()
        else:
            _ready.notify()


def _run() -> None:
    global _thread
    while True:
        with _mutex:
            if not _queue:
                _ready.wait(IDLE_EXIT)
                if not _queue:
                    _thread = None
                    return
            callback, argument, what = _queue.popleft()
        try:
            callback(argument)
        except BaseException:  # noqa: BLE001 - one callback must not stop the others
            # Not only Exception: a SystemExit (sys.exit() in a clean-up) would end this
            # thread while _thread still names it, and every later loss would go unreported.
            log.exception("%s raised", what)
        del callback, argument  # let the primitive go while the thread idles


def _reset_after_fork() -> None:
    global _mutex, _ready, _thread
    _mutex = threading.Lock()
    _ready = threading.Condition(_mutex)
    _queue.clear()
    _thread = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
