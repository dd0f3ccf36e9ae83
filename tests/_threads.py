"""Running a call in another thread (another owner) from a test.

An assert inside a thread only warns: these helpers hand the thread's result or exception
back to the test's thread, which re-raises it.
"""

from __future__ import annotations

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


__all__: List[str] = ["in_thread", "joined", "started"]
