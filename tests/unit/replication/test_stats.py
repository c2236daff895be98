"""The copy loop's histograms: a run of records counted at once."""

from __future__ import annotations

import pytest

from mm2py.replication.stats import LATENCY_BUCKETS, Histogram


def _bucket(seconds: float) -> int:
    return next((i for i, b in enumerate(LATENCY_BUCKETS) if seconds <= b), len(LATENCY_BUCKETS))


def test_a_span_within_one_bucket_counts_every_record_there() -> None:
    hist = Histogram()
    hist.observe_span(0.003, 0.004, 1000)
    assert hist.counts[_bucket(0.003)] == 1000 and sum(hist.counts) == 1000
    assert hist.total == pytest.approx(1000 * 0.0035)


def test_the_ends_are_exact_and_the_rest_spread_by_the_span_each_bucket_covers() -> None:
    hist = Histogram()
    # 0.0 .. 0.01 crosses the buckets up to 1 ms, 2.5 ms, 5 ms and 10 ms.
    hist.observe_span(0.01, 0.0, 102)  # the first record is the oldest: order is free
    assert sum(hist.counts) == 102
    assert hist.counts[_bucket(0.0)] == 1 + 10
    assert hist.counts[_bucket(0.002)] == 15
    assert hist.counts[_bucket(0.004)] == 25
    assert hist.counts[_bucket(0.01)] == 1 + 50
    assert hist.total == pytest.approx(102 * 0.005)


def test_one_and_two_records_are_plain_observations() -> None:
    one, two, plain = Histogram(), Histogram(), Histogram()
    one.observe_span(0.2, 0.2, 1)
    two.observe_span(0.2, 7.0, 2)
    plain.observe(0.2)
    assert one.counts == plain.counts and one.total == plain.total
    plain.observe(7.0)
    assert two.counts == plain.counts and two.total == pytest.approx(plain.total)
