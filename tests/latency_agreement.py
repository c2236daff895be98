"""Whether a latency histogram agrees with exact latencies measured beside it (pure).

The metric mm2py_replication_latency_seconds is a Prometheus histogram: it knows how
many copies fell in each bucket of LATENCY_BUCKETS, not where inside a bucket. A
quantile read from it (status.quantile, as Prometheus's histogram_quantile) is
interpolated as if each bucket's observations were spread evenly over it. Latencies of
a few milliseconds are not spread evenly: they crowd near a bound, and then a shift of
one millisecond moves a large share of them across it, and the interpolated quantile by
up to the next bucket's width (15 ms from 10 to 25 ms). So two interpolated quantiles
disagree by more than the latencies they come from. Seen in a fresh clone's run of
tests/integration/test_latency.py at 5 records/s: the watcher on B saw each copy about
1 ms after mm2py counted it; the metric's p50 interpolated to 8.91 ms (in the 5-10 ms
bucket), the watcher's, binned the same way, to 14.43 ms (10-25 ms), while its exact p50
was 10.36 ms.

What the histogram does state is which bucket holds a quantile: the first whose
cumulative count reaches q times the total, the rank Prometheus uses. So the metric
agrees with the watcher at level q, within a tolerance, when that bucket widened by the
tolerance holds the watcher's exact q-quantile (`gap` is 0). That is exactly what "the
q-quantiles are within the tolerance" can mean for a histogram: if every record's two
latencies are within the tolerance, the gap is 0 at every level, wherever the bounds fall.

Inside one bucket a histogram cannot tell a 10.1 ms median from a 24.9 ms one: a metric
off by any amount within one bucket passes every check made of its counts (two
interpolations from the same counts are equal too). At a single level, a widened bucket
is looser than two interpolations where the quantile sits inside a wide bucket, so
`LEVELS` are five levels across the body of the distribution and the p99: a metric off
by more than the tolerance across a bound shows at one level or another (the unit
tests' shifts of 5.5-12 ms, in buckets 2.5-25 ms wide: tests/unit/test_latency_agreement.py).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence

from mm2py.replication.stats import LATENCY_BUCKETS

# The levels at which a histogram must agree with the exact latencies, each with its
# tolerance in seconds: 5 ms across the body, 20 ms at the tail, where the watcher, one
# process and one hop further than the metric, waits longer for a CPU in a stall.
LEVELS = ((0.1, 0.005), (0.25, 0.005), (0.5, 0.005), (0.75, 0.005), (0.9, 0.005), (0.99, 0.020))


def quantile_bucket(counts: Sequence[int], q: float) -> tuple[float, float]:
    """The (lower, upper] bounds in seconds of the bucket of LATENCY_BUCKETS that holds
    the q-quantile of the histogram `counts` (one count per bucket, the overflow last):
    the first bucket whose cumulative count reaches q x total. The overflow's upper
    bound is infinite. ValueError for an empty histogram."""
    total = sum(counts)
    if total <= 0:
        raise ValueError("an empty histogram has no quantiles")
    rank = max(q * total, 1)  # at least the first observation, as exact_quantile
    running = 0
    for i, count in enumerate(counts):
        running += count
        if running >= rank and count > 0:
            return _bounds(i)
    raise ValueError(f"a histogram of {len(counts)} buckets for {len(LATENCY_BUCKETS)} bounds")


def exact_quantile(samples: Sequence[float], q: float) -> float:
    """The q-quantile of `samples` by the same rank: the ceil(q x n)-th smallest (the
    smallest for q x n < 1). ValueError without samples."""
    if not samples:
        raise ValueError("no samples have no quantiles")
    ordered = sorted(samples)
    return ordered[max(math.ceil(q * len(ordered)), 1) - 1]


def gap(counts: Sequence[int], samples: Sequence[float], q: float, tolerance: float) -> float:
    """How far in seconds the exact q-quantile of `samples` lies outside the bucket that
    holds the histogram's q-quantile, widened by `tolerance` on both sides; 0 inside."""
    lower, upper = quantile_bucket(counts, q)
    exact = exact_quantile(samples, q)
    return max(lower - tolerance - exact, exact - upper - tolerance, 0.0)


def bucket_of(value: float) -> tuple[float, float]:
    """The (lower, upper] bounds of the bucket of LATENCY_BUCKETS that holds `value`
    seconds (the overflow's upper bound infinite): where a quantile interpolated in a
    histogram of these buckets was interpolated."""
    return _bounds(bisect_left(LATENCY_BUCKETS, value))


def _bounds(i: int) -> tuple[float, float]:
    """Bucket i's (lower, upper] bounds: 0 below the first, infinity above the last."""
    lower = LATENCY_BUCKETS[i - 1] if i > 0 else 0.0
    return lower, LATENCY_BUCKETS[i] if i < len(LATENCY_BUCKETS) else math.inf


def disagreements(counts: Sequence[int], samples: Sequence[float]) -> dict[str, float]:
    """The `gap` at each of LEVELS, by name ("p50"), in seconds: all 0 when they agree."""
    return {f"p{round(q * 100)}": gap(counts, samples, q, tol) for q, tol in LEVELS}
