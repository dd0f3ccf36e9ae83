"""The benchmark sections, in the order they run.  Each module exposes ``KEY``, ``TITLE``
and ``run(ctx) -> SectionResult``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class Target:
    """One rlocks goal from the issue, judged in this run."""

    what: str
    measured: str
    goal: str
    ok: Optional[bool]  # None: could not be measured (rlocks missing, error)

    def to_json(self) -> Dict[str, Any]:
        return {"what": self.what, "measured": self.measured, "goal": self.goal,
                "result": None if self.ok is None else ("PASS" if self.ok else "MISS")}


def ratio_target(what: str, value: float, limit: float, of: str,
                 at_least: bool = False, note: str = "") -> Target:
    """A target that is a ratio of two figures of this run (``value`` is already the ratio,
    ``nan`` when either side is missing, which gives ``n/a``, never a pass)."""
    from ..stats import fmt_x, within

    sign = ">=" if at_least else "<="
    measured = f"{fmt_x(value)} {of}" if value == value else "-"
    if note:
        measured += f" ({note})"
    return Target(what, measured, f"{sign} {limit:g}x {of}", within(value, limit, at_least))


@dataclass
class SectionResult:
    key: str
    title: str
    data: Dict[str, Any] = field(default_factory=dict)
    lines: List[str] = field(default_factory=list)
    targets: List[Target] = field(default_factory=list)


ORDER = ["floor", "uncontended", "handoff", "contended", "many", "scaling", "rwsem",
         "holders", "size"]
ALIASES = {"1": "floor", "2": "uncontended", "3": "handoff", "4": "contended", "5": "many",
           "6": "scaling", "7": "rwsem", "8": "holders", "9": "size", "rw": "rwsem",
           "semaphore": "rwsem", "code": "size"}


def load(key: str) -> Any:
    import importlib

    return importlib.import_module(f"{__name__}.{key}")
