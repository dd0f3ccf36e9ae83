"""The clock every rlocks deadline is read from.

Deadlines (``acquire(timeout=...)``, renewal schedules, lease bookkeeping) use
``time.monotonic``: wall-clock jumps (NTP steps, a user changing the date) must not stretch
or cut a wait, and leases themselves are kept by the Redis server, never by this clock.

The reference to the real ``time.monotonic`` is kept in a closure on purpose: test helpers
such as freezegun replace ``time.monotonic`` (and module attributes bound to it) while they
freeze the wall clock. A user's frozen test clock must not make a lock wait forever, so
rlocks keeps measuring real elapsed time.
"""

from __future__ import annotations

import time
from typing import Callable


def _real_monotonic() -> Callable[[], float]:
    real = time.monotonic

    def monotonic() -> float:
        return real()

    return monotonic


monotonic: Callable[[], float] = _real_monotonic()
