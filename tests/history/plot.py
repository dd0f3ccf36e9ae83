"""A picture of a history: who held what, when, with the faults and violations marked.

One panel per primitive, one row per thread (or task); a bar per hold, grey while
untold, red once told lost; shaded spans for the faults (labelled), a red line at each
violation. Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, List, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .check import INF, Report, _History  # noqa: E402

__all__ = ["draw"]

COLOURS = {"x": "#4c72b0", "w": "#4c72b0", "r": "#8fb0d8", "p": "#55a868"}


def draw(events: Sequence[Dict[str, Any]], report: Report, path: str,
         window: Any = None) -> None:
    hist = _History(events)
    kinds = sorted({h.kind for h in hist.holds.values()})
    if not kinds:
        return
    t0 = min(h.start for h in hist.holds.values())
    t1 = hist.last
    if window is not None:
        t0, t1 = window
    fig, axes = plt.subplots(len(kinds), 1, figsize=(16, 2.2 + 1.6 * len(kinds)),
                             sharex=True, squeeze=False)
    for ax, kind in zip(axes[:, 0], kinds):
        rows: Dict[str, List[Any]] = defaultdict(list)
        for hold in hist.holds.values():
            if hold.kind == kind:
                rows[hold.thread].append(hold)
        names = sorted(rows)
        for y, name in enumerate(names):
            for hold in rows[name]:
                end = min(hold.end if hold.end < INF else t1, t1)
                if end < t0 or hold.start > t1:
                    continue
                told = hold.told if hold.told is not None else end
                ax.broken_barh([(hold.start - t0, max(1e-3, min(told, end) - hold.start))],
                               (y - 0.4, 0.8), color=COLOURS.get(hold.side, "grey"))
                if hold.told is not None and hold.told < end:
                    ax.broken_barh([(hold.told - t0, end - hold.told)], (y - 0.4, 0.8),
                                   color="#c44e52")
        for fault in hist.faults:
            ax.axvspan(fault.inv - t0, fault.until - t0, color="#f0c040", alpha=0.25, lw=0)
        for v in report.violations:
            if v.kind in (kind, "-"):
                ax.axvline(v.t - t0, color="red", lw=1.2)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names, fontsize=6)
        ax.set_ylabel(kind)
    top = axes[0, 0]
    for fault in hist.faults:
        top.annotate(fault.kind + (f" {fault.target}" if fault.target else ""),
                     (fault.inv - t0, 1.0), xycoords=("data", "axes fraction"),
                     fontsize=6, rotation=45, va="bottom")
    axes[-1, 0].set_xlabel("seconds since the first hold")
    fig.suptitle(f"{len(report.violations)} violation(s); holds in blue/green, "
                 "red once told lost; faults shaded", y=0.995, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
