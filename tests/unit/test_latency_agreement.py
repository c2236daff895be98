"""The latency test's comparison of a histogram with exact latencies
(tests/latency_agreement.py)."""

from __future__ import annotations

import math
import random

import pytest

from mm2py.replication.stats import LATENCY_BUCKETS, Histogram
from mm2py.runtime.status import quantile
from tests.latency_agreement import (
    bucket_of,
    disagreements,
    exact_quantile,
    gap,
    quantile_bucket,
)

MS = 0.001


def binned(samples: list[float]) -> list[int]:
    """Counts per bucket, by the metric's own histogram."""
    histogram = Histogram()
    for seconds in samples:
        histogram.observe(seconds)
    return histogram.counts


def test_the_bucket_of_a_quantile_is_where_prometheus_interpolates_it() -> None:
    rng = random.Random(7)
    for _ in range(200):
        samples = [rng.lognormvariate(math.log(0.01), 1.0) for _ in range(rng.randint(1, 300))]
        counts = binned(samples)
        for q in (0.01, 0.1, 0.5, 0.9, 0.99, 1.0):
            lower, upper = quantile_bucket(counts, q)
            interpolated = quantile(counts, q)
            assert interpolated is not None
            if upper != math.inf:
                assert lower < interpolated <= upper
                assert bucket_of(interpolated) == (lower, upper)
            # The exact quantile by the same rank lies in that bucket.
            assert lower < exact_quantile(samples, q) <= upper


def test_the_exact_quantile_is_the_sample_of_rank_q_times_n_rounded_up() -> None:
    samples = [0.004, 0.001, 0.003, 0.002]
    assert exact_quantile(samples, 0.5) == 0.002
    assert exact_quantile(samples, 0.51) == 0.003
    assert exact_quantile(samples, 0.0) == 0.001
    assert exact_quantile(samples, 1.0) == 0.004


def test_latencies_each_within_the_tolerance_agree_at_every_level() -> None:
    # The claim the latency test rests on: whatever the bounds, if each record's two
    # latencies are within the tolerance, the gap is 0, here for latencies crowded about
    # the 10 ms bound, where interpolated quantiles diverge.
    rng = random.Random(20261206)
    for _ in range(300):
        watched = [rng.gauss(10 * MS, 2 * MS) for _ in range(rng.randint(5, 400))]
        watched = [max(w, 0.1 * MS) for w in watched]
        tolerance = rng.choice((1 * MS, 5 * MS))
        metric = [max(w - rng.uniform(-tolerance, tolerance), 0.0) for w in watched]
        for q in (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99):
            assert gap(binned(metric), watched, q, tolerance) == 0


def test_the_failed_run_agrees_where_the_interpolations_did_not() -> None:
    # The shape of the run that failed the old check: the metric counted each copy
    # 1 ms before the watcher saw it, and many copies took just under 10 ms, so the
    # two medians sit either side of that bound.
    rng = random.Random(3)
    metric = (
        [rng.uniform(5.5 * MS, 8.5 * MS) for _ in range(40)]
        + [rng.uniform(9.0 * MS, 9.9 * MS) for _ in range(45)]
        + [rng.uniform(10.5 * MS, 20 * MS) for _ in range(65)]
    )
    watched = [m + 1 * MS for m in metric]
    counts = binned(metric)
    interpolated = quantile(counts, 0.5)
    binned_watched = quantile(binned(watched), 0.5)
    assert interpolated is not None and binned_watched is not None
    assert abs(interpolated - binned_watched) > 5 * MS  # what the old check compared
    assert gap(counts, watched, 0.5, 5 * MS) == 0


@pytest.mark.parametrize(
    ("low_ms", "high_ms", "shift_ms"),
    [
        (2, 4, 6.5),  # 2.5-5-10 ms buckets, the metric later
        (12, 14, -8),  # inside the 10-25 ms bucket, the metric earlier
        (30, 45, 12),  # the 25-50 ms bucket, later
        (4, 9, -5.5),  # across the 5 ms bound, earlier
    ],
)
def test_a_metric_off_by_more_than_the_tolerance_is_caught_at_some_level(
    low_ms: float, high_ms: float, shift_ms: float
) -> None:
    # One level alone may not catch it where a bucket is wide (the median of 12-14 ms
    # and of 4-6 ms both lie within 5 ms of the 5-10 ms bucket); the five across the
    # body do.
    rng = random.Random(11)
    watched = [rng.uniform(low_ms * MS, high_ms * MS) for _ in range(1000)]
    metric = binned([w + shift_ms * MS for w in watched])
    assert any(disagreements(metric, watched).values())
    # And the same latencies shifted by less than the tolerance agree.
    near = binned([w + math.copysign(4.5, shift_ms) * MS for w in watched])
    assert not any(disagreements(near, watched).values())


def test_a_metric_wrong_by_the_old_bug_is_caught() -> None:
    # Before the copy loop served delivery reports within 1 ms: p50 175 ms where the
    # watcher saw 4 ms.
    watched = [4 * MS] * 100
    metric = binned([175 * MS] * 100)
    assert gap(metric, watched, 0.5, 5 * MS) == pytest.approx(0.1 - 0.005 - 0.004)


def test_an_empty_histogram_has_no_quantile() -> None:
    with pytest.raises(ValueError, match="empty"):
        quantile_bucket([0] * (len(LATENCY_BUCKETS) + 1), 0.5)
    with pytest.raises(ValueError, match="no samples"):
        exact_quantile([], 0.5)


def test_a_value_past_the_last_bound_is_in_the_overflow() -> None:
    assert bucket_of(LATENCY_BUCKETS[-1] * 2) == (LATENCY_BUCKETS[-1], math.inf)
    assert bucket_of(LATENCY_BUCKETS[0]) == (0.0, LATENCY_BUCKETS[0])
