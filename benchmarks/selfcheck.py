"""A tiny, pytest-free self-check of the suite's own arithmetic and plumbing (no Redis, no
timing): ``python -m benchmarks.selfcheck``.  Exit status 0 when everything holds."""

from __future__ import annotations

import math
import sys

from .__main__ import _clean, selected_sections
from .adapters import all_adapters
from .harness import ChainOutcome, Params, merge
from .redisinfo import breakdown_delta, is_loopback_url
from .sections import ORDER
from .stats import fmt_ns, fmt_ratio, jain, percentile, summary, table


def _checks() -> None:
    assert percentile([1, 2, 3, 4, 5], 50) == 3
    assert percentile([1, 2], 50) == 1.5
    assert percentile([10], 99) == 10
    assert math.isnan(percentile([], 50))
    assert percentile(list(range(101)), 99) == 99
    assert summary([])["n"] == 0
    assert abs(jain([5, 5, 5, 5]) - 1.0) < 1e-12
    assert abs(jain([1, 0, 0, 0]) - 0.25) < 1e-12
    assert fmt_ns(1500) == "1.5 µs" and fmt_ns(2_500_000) == "2.50 ms"
    assert fmt_ratio(150.0, 50.0) == "3.00x" and fmt_ratio(math.nan, 50.0) == "-"
    lines = table(["a", "bb"], [["x", 1], ["yy", 22]])
    assert len(lines) == 4 and lines[2].startswith("x ")
    assert selected_sections(None) == ORDER
    assert selected_sections("4,many") == ["floor", "contended", "many"]
    for bad in ("nope",):
        try:
            selected_sections(bad)
        except SystemExit:
            pass
        else:
            raise AssertionError("unknown section accepted")
    assert is_loopback_url("redis://127.0.0.1:6379/0") and is_loopback_url("redis://localhost")
    assert not is_loopback_url("redis://10.0.0.5:6379") and not is_loopback_url("redis://x.io")
    assert breakdown_delta({"get": 1}, {"get": 3, "set": 2}) == {"get": 2, "set": 2}
    assert _clean({"a": math.nan, "b": [1.0, math.inf]}) == {"a": None, "b": [1.0, None]}
    m = merge([ChainOutcome(ops=10, span_s=1.0, lost_updates=0, handoff_ns=[1, 2]),
               ChainOutcome(ops=30, span_s=1.0, lost_updates=0, handoff_ns=[3])])
    assert m.ops == 40 and m.throughput == 20.0 and m.handoff_ns == [1, 2, 3]
    q, f = Params.quick(), Params()
    assert q.many_count < f.many_count and q.scale_duration_s < f.scale_duration_s
    keys = [a.key for a in all_adapters()]
    assert keys[0] == "rlocks" and len(set(keys)) == len(keys) == 6
    for a in all_adapters():  # every library is either usable or says why not
        assert a.unavailable_reason() is None or a.unavailable_reason()
        assert a.defaults


def main() -> int:
    try:
        _checks()
    except AssertionError:
        import traceback

        traceback.print_exc()
        print("benchmarks self-check: 0 passed, 1 failed")
        return 1
    print("benchmarks self-check: 1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
