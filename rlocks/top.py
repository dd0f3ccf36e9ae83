"""What ``rlocks top`` shows: a namespace's primitives, the contended ones first.

The command (:mod:`rlocks.cli`) reads the namespace with
:func:`rlocks._engine.state.list_primitives` every ``--interval`` seconds; this module
turns those states into rows, orders them, renders them (rich's ``Table`` inside a
``Live`` display) and builds the ``--json`` snapshot. Apart from :func:`run_live`, which
draws on the terminal, everything here is free of I/O, so the view is tested on
hand-built states.

What is known, and what is not
------------------------------
- **Holders and lease left** come from Redis (the lease as the server counts it).
- **Hold age**: the scripts record when a hold ends (its lease), not when it began. The
  live view therefore ages a hold from the refresh at which it first saw it
  (:class:`HoldClock`): a hold that appeared while top ran is aged to within one
  interval; one that was there at the first refresh is shown as a lower bound (``>=``).
  A hold released and taken again by the same owner between two refreshes looks like one
  hold. The one-shot ``--json`` snapshot has seen nothing before, so its
  ``hold_age_ms`` is null.
- **Waiters**: the state's ``queue`` (see :mod:`rlocks._engine.state`): the waiting
  threads and tasks in queue order, one entry each, with ``waiter``, ``side``,
  ``wanted``, ``lease_left_ms`` and ``age_ms``. QUEUE is its length, OLDEST the oldest
  waiter's age. A state built without its queue (``queue`` None: not read) has only the
  count ``waiting``: shown as ``N proc``, as for engines that kept no queue, and the
  oldest waiter's age is unknown (``?``).
  :func:`rlocks._engine.state.list_primitives` always reads the queue.

Order
-----
Primitives with waiters first (the oldest waiter first, then the longest queue), then
held ones by hold age, longest first, then the rest; ties by name. The screen crops at
the terminal's height, so what matters most is what stays visible.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import redis

from ._engine.state import Holder, PrimitiveState

if TYPE_CHECKING:  # rich is an optional dependency (the ``top`` extra)
    from rich.console import Console, RenderableType
    from rich.table import Table

__all__ = [
    "HoldClock",
    "RichMissing",
    "Row",
    "caption",
    "cells",
    "format_ms",
    "require_rich",
    "rows_for",
    "run_live",
    "screen",
    "short_owner",
    "snapshot",
    "table",
]

# The fields of one queue entry, in the order the JSON snapshot and docs give them.
QUEUE_FIELDS = ("waiter", "side", "wanted", "lease_left_ms", "age_ms")


class RichMissing(RuntimeError):
    """The live view needs rich, which is not installed."""


def require_rich() -> None:
    """Raise :class:`RichMissing` (with the install command) unless rich imports."""
    try:
        import rich.live  # noqa: F401
        import rich.table  # noqa: F401
    except ImportError as exc:
        raise RichMissing(
            f"rlocks top needs the 'rich' package ({exc}): pip install 'rich>=13.0' "
            "(rlocks' top extra: pip install '.[top]' in an rlocks checkout), or use "
            "--json, which does not"
        ) from None


# -- rows ------------------------------------------------------------------------------------


def _entry_field(entry: Any, name: str) -> Any:
    if isinstance(entry, Mapping):
        return entry.get(name)
    return getattr(entry, name, None)


def _entry_dict(entry: Any) -> Dict[str, Any]:
    to_dict = getattr(entry, "to_dict", None)
    if callable(to_dict):
        data: Dict[str, Any] = to_dict()
        return data
    return {name: _entry_field(entry, name) for name in QUEUE_FIELDS}


@dataclass(frozen=True)
class Row:
    """One primitive as top shows it."""

    state: PrimitiveState
    # ms since the longest current hold began, as far as known (see the module docstring);
    # None: not known. ``hold_age_floor``: the hold was older than top's first look.
    hold_age_ms: Optional[int]
    hold_age_floor: bool
    # The state's queue (entries in queue order, one per waiting thread or task) when it
    # has one; None: not read.
    queue: Optional[Tuple[Any, ...]]

    @property
    def lease_left_ms(self) -> Optional[int]:
        """The soonest end of a current hold's lease (None: nobody holds, or no expiry)."""
        leases = [h.lease_ms for h in self.state.holders if h.lease_ms is not None]
        if leases:
            return min(leases)
        return self.state.lease_ms if self.state.holders else None

    @property
    def waiters(self) -> Optional[int]:
        """Queue length, else the state's count of waiters; None when neither was read."""
        if self.queue is not None:
            return len(self.queue)
        return self.state.waiting_total

    @property
    def oldest_wait_ms(self) -> Optional[int]:
        """The oldest queued waiter's age; None without a queue (or an empty one)."""
        if not self.queue:
            return None
        ages = [_entry_field(entry, "age_ms") for entry in self.queue]
        known = [int(age) for age in ages if age is not None]
        return max(known) if known else None

    def sort_key(self) -> Tuple[Any, ...]:
        waiters = self.waiters or 0
        return (
            waiters == 0,
            -(self.oldest_wait_ms or 0),
            -waiters,
            not self.state.holders,
            -(self.hold_age_ms or 0),
            self.state.name,
            self.state.kind,
        )

    def to_dict(self) -> Dict[str, Any]:
        """The state's ``to_dict()`` plus what top adds (the ``--json`` schema)."""
        data = self.state.to_dict()
        data["hold_age_ms"] = self.hold_age_ms
        data["lease_left_ms"] = self.lease_left_ms
        data["queue"] = None if self.queue is None else [_entry_dict(e) for e in self.queue]
        data["queue_length"] = self.waiters
        data["queue_source"] = "queue" if self.queue is not None else "subscribers"
        data["oldest_wait_ms"] = self.oldest_wait_ms
        return data


_HoldKey = Tuple[str, str, str, str]  # kind, name, owner, side


def _hold_keys(state: PrimitiveState) -> List[Tuple[_HoldKey, Holder]]:
    return [((state.kind, state.name, h.owner, h.side), h) for h in state.holders]


class HoldClock:
    """When the live view first saw each hold: the only hold ages it can know.

    ``observe`` is called once per refresh with that refresh's states; a hold is known
    by (kind, name, owner, side) and forgotten as soon as a refresh does not show it.
    Not thread-safe: one refresh loop owns it.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: Dict[_HoldKey, Tuple[float, bool]] = {}  # -> (first seen, floor)
        self._first = True

    def observe(self, states: Sequence[PrimitiveState]) -> Dict[_HoldKey, Tuple[int, bool]]:
        """(age ms, whether it is a lower bound) of every hold in ``states``."""
        now = self._clock()
        seen: Dict[_HoldKey, Tuple[float, bool]] = {}
        for state in states:
            for key, _holder in _hold_keys(state):
                # Holds present at the first look began at some unknown earlier time.
                seen[key] = self._seen.get(key, (now, self._first))
        self._seen = seen
        self._first = False
        return {key: (int((now - since) * 1000), floor) for key, (since, floor) in seen.items()}


def rows_for(
    states: Sequence[PrimitiveState],
    ages: Optional[Mapping[_HoldKey, Tuple[int, bool]]] = None,
) -> List[Row]:
    """``states`` as rows in top's order; ``ages`` from :meth:`HoldClock.observe`."""
    rows = []
    for state in states:
        age: Optional[int] = None
        floor = False
        for key, _holder in _hold_keys(state):
            if ages is not None and key in ages:
                held, is_floor = ages[key]
                if age is None or held > age:
                    age, floor = held, is_floor
        queue = getattr(state, "queue", None)
        rows.append(Row(state, age, floor, None if queue is None else tuple(queue)))
    rows.sort(key=Row.sort_key)
    return rows


def snapshot(states: Sequence[PrimitiveState], namespace: str) -> Dict[str, Any]:
    """The ``--json`` document: one snapshot, primitives in top's order."""
    return {
        "time": time.time(),
        "namespace": namespace,
        "primitives": [row.to_dict() for row in rows_for(states)],
    }


# -- rendering -------------------------------------------------------------------------------


def format_ms(ms: Optional[int], none: str = "-", tenths_below: float = 10.0) -> str:
    """A duration for a cell: ``0.4s``, ``12s``, ``3m05s``, ``2h01m``; ``none`` for None.
    Tenths of a second are shown below ``tenths_below`` seconds (a negative duration, a
    lease already over, shows as 0)."""
    if ms is None:
        return none
    seconds = max(ms, 0) / 1000.0
    if seconds < tenths_below:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{int(seconds)}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _holders_cell(state: PrimitiveState) -> str:
    if not state.holders:
        count = "0"
    elif state.kind == "rw":
        writers = sum(1 for h in state.holders if h.side == "write")
        readers = len(state.holders) - writers
        count = " ".join(part for part in (f"{writers}w" if writers else "",
                                          f"{readers}r" if readers else "") if part)
    else:
        count = str(len(state.holders))
    if state.kind == "sem":
        count += f" ({state.free}/{state.value} free)"
    if state.detail is not None:
        count += f" ({state.detail})"
    return count


def short_owner(owner: str) -> str:
    """``host:pid:thread`` of an owner id (``host:pid:nonce:thread``), for a narrow cell.

    The nonce only tells a process from an earlier one with the same pid; ``--json``
    keeps the whole id.
    """
    host, sep, rest = owner.partition(":")
    pid, _, tail = rest.partition(":")
    _nonce, _, thread = tail.partition(":")
    return f"{host}:{pid}:{thread}" if sep and thread else owner


def _owner_cell(state: PrimitiveState) -> str:
    if not state.holders:
        return "-"
    more = len(state.holders) - 1
    return short_owner(state.holders[0].owner) + (f" +{more}" if more else "")


def _queue_cell(row: Row) -> str:
    waiters = row.waiters
    if waiters is None:
        return "?"
    if not waiters:
        return "-"
    return str(waiters) if row.queue is not None else f"{waiters} proc"


def _oldest_cell(row: Row) -> str:
    if not row.waiters:
        return "-"
    return format_ms(row.oldest_wait_ms) if row.queue is not None else "?"


def _hold_age_cell(row: Row) -> str:
    if not row.state.holders:
        return "-"
    if row.hold_age_ms is None:
        return "?"
    return (">=" if row.hold_age_floor else "") + format_ms(row.hold_age_ms)


COLUMNS = ("TYPE", "NAME", "HOLDERS", "OWNER", "HELD", "LEASE", "QUEUE", "OLDEST")
_NUMERIC = ("HELD", "LEASE", "QUEUE", "OLDEST")


def caption(rows: Sequence[Row]) -> str:
    """The legend under the table: what HELD and QUEUE mean for these rows."""
    text = "HELD: since top first saw the hold (>=: held before top started)"
    if any(row.queue is None and row.waiters for row in rows):
        text += "; N proc: processes subscribed to wake-ups (Redis has no queue); ?: unknown"
    return text


def cells(row: Row) -> Tuple[str, ...]:
    """The text of one row, in :data:`COLUMNS` order."""
    state = row.state
    return (
        state.type,
        state.name,
        _holders_cell(state),
        _owner_cell(state),
        _hold_age_cell(row),
        format_ms(row.lease_left_ms),
        _queue_cell(row),
        _oldest_cell(row),
    )


def screen(rows: Sequence[Row], title: str) -> "RenderableType":
    """One frame: ``title`` on a line of its own (cut at the width), then :func:`table`."""
    from rich.console import Group
    from rich.text import Text

    return Group(Text(title, no_wrap=True, overflow="ellipsis"), table(rows))


def table(rows: Sequence[Row]) -> "Table":
    """The rows as a rich ``Table`` (rich must be installed: :func:`require_rich`)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    # Every string goes in as Text: a str would be read as rich markup and emoji codes,
    # and names, namespaces and owner ids (host names) are anyone's text: "[b]" or ":100:".
    view = Table(caption=Text(caption(rows)),
                 caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    longest = max((len(row.state.name) for row in rows), default=4)
    for column in COLUMNS:
        # On a narrow terminal the owner and type give way first: names and numbers stay.
        width = len(column)
        if column == "NAME":
            width = min(max(longest, 4), 32)
        elif column in ("TYPE", "OWNER"):
            width = 5
        view.add_column(Text(column), justify="right" if column in _NUMERIC else "left",
                        no_wrap=True, overflow="ellipsis", min_width=width)
    for row in rows:
        # Contended rows stand out; the rest are plain. Colour only, never layout.
        style = "bold red" if row.waiters else None
        view.add_row(*map(Text, cells(row)), style=style)
    if not rows:
        view.add_row(Text("(no primitives)"), *[Text()] * (len(COLUMNS) - 1))
    return view


def run_live(
    read: Callable[[], Sequence[PrimitiveState]],
    title: Callable[[Sequence[Row]], str],
    interval: float,
    count: Optional[int] = None,
    console: Optional["Console"] = None,
) -> None:
    """Redraw the view every ``interval`` s until Ctrl-C (or ``count`` refreshes).

    ``read`` returns the states of one refresh; ``title`` makes the line above the table
    from the rows. On a terminal the view is redrawn in place (rich ``Live``, cropped to
    the screen's height, the last frame left on the screen); otherwise each refresh is
    printed after the last. Blocks; returns after ``count`` refreshes or on Ctrl-C.

    A view is watched through incidents, so once a refresh has succeeded, a refresh that
    cannot reach Redis (a redis-py ``ConnectionError`` or ``TimeoutError``: a restart, a
    failover, a dropped link) shows the last rows under a title saying so and the next
    refresh tries again. The first refresh's errors, and any other error, propagate and
    end the view: a wrong URL or password is reported at once, not retried forever.
    """
    require_rich()
    from rich.console import Console
    from rich.live import Live

    out = console or Console()
    clock = HoldClock()

    def refreshes(show: Callable[["RenderableType"], None]) -> None:
        frames = 0
        next_at = time.monotonic()
        rows: Sequence[Row] = ()
        while count is None or frames < count:
            if frames:
                time.sleep(max(0.0, next_at - time.monotonic()))
            try:
                states = read()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                if not frames:
                    raise
                detail = str(exc) or type(exc).__name__
                show(screen(rows, f"Redis unreachable, retrying every {interval:g}s "
                                  f"(showing the last refresh): {detail}"))
            else:
                rows = rows_for(states, clock.observe(states))
                show(screen(rows, title(rows)))
            frames += 1
            # A slow read delays the next refresh rather than bunching the ones after it.
            next_at = max(next_at + interval, time.monotonic())

    try:
        if not out.is_terminal:
            refreshes(out.print)
            return
        # auto_refresh off: the view changes only when Redis is read again, so one redraw
        # per refresh is all there is to draw.
        with Live(console=out, auto_refresh=False, vertical_overflow="ellipsis") as live:
            refreshes(lambda view: live.update(view, refresh=True))
    except KeyboardInterrupt:
        return  # Ctrl-C is how a live view ends: no traceback
