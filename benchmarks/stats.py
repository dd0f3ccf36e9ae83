"""Small, dependency-free statistics and formatting helpers used by every section."""

from __future__ import annotations

import math
from typing import Dict, Iterable, List, Optional, Sequence


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) by linear interpolation between closest ranks.

    Returns ``nan`` for an empty sample, so a missing figure shows as such instead of 0.
    """
    if not values:
        return math.nan
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    k = (len(xs) - 1) * p / 100.0
    lo = math.floor(k)
    hi = math.ceil(k)
    if lo == hi:
        return float(xs[lo])
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(ns: Sequence[float]) -> Dict[str, float]:
    """p50/p99/mean/min/max/n of a sample of nanosecond durations (kept in ns)."""
    if not ns:
        return {"n": 0, "p50": math.nan, "p99": math.nan, "mean": math.nan,
                "min": math.nan, "max": math.nan}
    return {
        "n": len(ns),
        "p50": percentile(ns, 50),
        "p99": percentile(ns, 99),
        "mean": sum(ns) / len(ns),
        "min": float(min(ns)),
        "max": float(max(ns)),
    }


def jain(xs: Iterable[float]) -> float:
    """Jain's fairness index, (sum x)^2 / (n * sum x^2): 1.0 is perfectly even, 1/n is one
    worker doing everything."""
    vals = list(xs)
    sq = sum(x * x for x in vals)
    if not vals or sq == 0:
        return math.nan
    return sum(vals) ** 2 / (len(vals) * sq)


def fmt_ns(ns: Optional[float]) -> str:
    """A duration in a unit that keeps 3 significant digits readable."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "-"
    if ns < 1_000:
        return f"{ns:.0f} ns"
    if ns < 1_000_000:
        return f"{ns / 1e3:.1f} µs"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def fmt_ratio(value: Optional[float], ping_ns: float) -> str:
    """``value`` (ns) as a multiple of the PING p50 of this run."""
    if value is None or math.isnan(value) or not ping_ns or math.isnan(ping_ns):
        return "-"
    return f"{value / ping_ns:.2f}x"


def fmt_num(x: Optional[float], digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{digits}f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]],
          left: int = 1) -> List[str]:
    """Render a plain-text table: the first ``left`` columns left-aligned (names), the
    others right-aligned (figures)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(r):
            out.append(c.ljust(widths[i]) if i < left else c.rjust(widths[i]))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return [line(cells[0]), sep] + [line(r) for r in cells[1:]]


def verdict(ok: Optional[bool]) -> str:
    """PASS/MISS marker; ``None`` means the figure could not be measured."""
    if ok is None:
        return "n/a"
    return "PASS" if ok else "MISS"


def longest_wait(waits: Iterable[float]) -> float:
    """The longest single wait in ``waits`` (ns), ``nan`` when there is none."""
    vals = [float(w) for w in waits]
    return max(vals) if vals else math.nan


def ratio(num: Optional[float], den: Optional[float]) -> float:
    """``num / den``, or ``nan`` when either is missing or the denominator is not positive
    (a target judged on a missing floor must read "n/a", never pass)."""
    if num is None or den is None or math.isnan(num) or math.isnan(den) or den <= 0:
        return math.nan
    return num / den


def within(value: float, limit: float, at_least: bool = False) -> Optional[bool]:
    """``value <= limit`` (or ``>=`` with ``at_least``); ``None`` for a missing value."""
    if value is None or math.isnan(value):
        return None
    return value >= limit if at_least else value <= limit


def fmt_x(r: Optional[float]) -> str:
    """A ratio as ``1.23x`` (``-`` when missing)."""
    if r is None or math.isnan(r):
        return "-"
    return f"{r:.2f}x"
