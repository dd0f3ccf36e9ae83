"""Running a call in another thread (another owner) from a test.

An assert inside a thread only warns: these helpers hand the thread's result or exception
back to the test's thread, which re-raises it.
"""

from __future__ import annotations

import linecache
import sys
import threading
from typing import Any, Callable, Dict, List, Tuple


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
    """Whether ``thread`` sleeps on its wake-up event in the queue dialogue's threading
    step (``Primitive._perform``) with its channel subscribed, or (a head that reads its
    wake-up lines itself) in its BLPOP of the entry's list (a head gets there only after
    an attempt, and then sleeps until a wake-up or its re-check pause; so would any
    waiter that made one)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "_perform" and "op" in frame.f_locals:
            line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
            op = frame.f_locals["op"]
            sleeps = "waiter.event.wait(" in line or '"BLPOP"' in line
            return sleeps and bool(op.waiter.subscribed)
        frame = frame.f_back
    return False


def listening(thread: threading.Thread) -> bool:
    """Whether ``thread`` is in a LISTEN step of its queue dialogue (``Primitive._perform``:
    its BLPOP, sent or about to be); beside :func:`parked` it tells a listening waiter
    from one asleep on its wake-up event (no I/O)."""
    from rlocks._engine.queued import LISTEN

    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "_perform" and "op" in frame.f_locals:
            return bool(frame.f_locals["op"].kind == LISTEN)
        frame = frame.f_back
    return False


def hub_waiters(prim: Any) -> List[Any]:
    """The threads of this process that ``prim``'s wake-up hub has waiting on its channel,
    in their local order (no I/O)."""
    from rlocks._engine.waiting import hub_for

    ch = hub_for(prim.client, prim.namespace)._channels.get(prim._channel())
    return list(ch.waiters) if ch is not None else []


def pause_at_hand_over(monkeypatch: Any, prim: Any) -> Tuple[threading.Event, threading.Event]:
    """Hold the first waiter of ``prim`` that takes a hand-over grant at its first step
    (``_checks_hand_over``, before it adopts the grant) until ``go`` is set.

    Returns ``(woken, go)``: ``woken`` is set once a waiter is held there. The patch is
    on ``prim``'s class and ``monkeypatch`` undoes it; other objects are not held.
    """
    woken, go = threading.Event(), threading.Event()
    cls = type(prim)
    checks = cls._checks_hand_over

    def paused(self: Any, owner: str) -> bool:
        if self is prim and not woken.is_set():
            woken.set()
            assert go.wait(20)
        return bool(checks(self, owner))

    monkeypatch.setattr(cls, "_checks_hand_over", paused)
    return woken, go


__all__: List[str] = ["in_thread", "joined", "listening", "parked", "pause_at_hand_over", "started"]
