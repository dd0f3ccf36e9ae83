"""Running a call in another thread (another owner) from a test.

An assert inside a thread only warns: these helpers hand the thread's result or exception
back to the test's thread, which re-raises it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Callable, Dict, Iterator, List, Tuple


def started(fn: Callable[[], Any]) -> Tuple[threading.Thread, Dict[str, Any]]:
    """Start ``fn()`` in a new daemon thread; its result or error lands in the dict
    (keys ``"result"``, ``"error"``). :func:`joined` waits for it."""
    out: Dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised by joined()
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def joined(thread: threading.Thread, out: Dict[str, Any], timeout: float = 30.0) -> Any:
    """Wait up to ``timeout`` s for a thread of :func:`started`; return its result or
    re-raise its exception here. AssertionError if it is still running."""
    thread.join(timeout)
    assert not thread.is_alive(), "the other thread did not finish"
    if "error" in out:
        raise out["error"]
    return out["result"]


def in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn()`` in another thread and return its result, or raise its exception."""
    return joined(*started(fn))


def parked(thread: threading.Thread) -> bool:
    """Whether ``thread`` sleeps in its wait for a wake-up hint (a ``Listen`` step: the
    engine's ``Waiter.wait``) after a refused acquire (no I/O)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "wait" and code.co_filename.endswith("wakeups.py"):
            return True
        frame = frame.f_back
    return False


def hub_waiters(prim: Any) -> List[str]:
    """The owners of this process waiting for wake-up hints on ``prim`` (no I/O)."""
    from rlocks._engine import wakeups

    with wakeups._mutex:
        return [owner for (key, owner) in wakeups._waiters if key == prim._keys.hash]


@contextlib.contextmanager
def held_by_another_thread(lock: Any) -> Iterator[None]:
    """``lock`` held by another thread of this process for the ``with`` block (so this
    thread's acquire of it waits), released at its end."""
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            done.wait(60)

    thread, out = started(hold)
    try:
        assert held.wait(10), out
        yield
    finally:
        done.set()
        joined(thread, out, 10)


def engine_threads() -> List[str]:
    """The names of rlocks' own threads alive in this process (renewer, wake-ups)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("rlocks-")]


__all__: List[str] = ["engine_threads", "held_by_another_thread", "hub_waiters", "in_thread",
                      "joined", "parked", "started"]
