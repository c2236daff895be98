"""librdkafka's connection-failure lines: one per cluster a minute at WARNING, the rest DEBUG."""

from __future__ import annotations

import logging

import pytest

from mm2py.kafka.clients import ClusterLog, ConnectionLogFolder, is_connection_failure

FMT = "%s [%s] %s"
REFUSED = (
    "[thrd:127.0.0.1:29092/bootstrap]: 127.0.0.1:29092/bootstrap: Connect to "
    "ipv4#127.0.0.1:29092 failed: Connection refused (after 0ms in state CONNECT)"
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "mm2py.librdkafka"]


def test_connection_failures_are_folded_per_cluster_per_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    folder = ConnectionLogFolder(window=60, clock=clock)
    b, c = ClusterLog("127.0.0.1:29092", folder), ClusterLog("127.0.0.1:39092", folder)
    with caplog.at_level(logging.DEBUG, logger="mm2py.librdkafka"):
        for _ in range(40):  # librdkafka's attempts in a second, from several clients
            b.log(logging.ERROR, FMT, "FAIL", "rdkafka#producer-1", REFUSED)
            clock.now += 0.025
        c.log(logging.ERROR, FMT, "ERROR", "rdkafka#consumer-2", "1/1 brokers are down")
        clock.now += 58  # 59 s after the first line: still folded
        b.log(logging.ERROR, FMT, "FAIL", "rdkafka#producer-3", REFUSED)
        clock.now += 1.5
        b.log(logging.ERROR, FMT, "FAIL", "rdkafka#producer-3", REFUSED)
    got = lines(caplog)
    loud = [text for level, text in got if level == logging.WARNING]
    assert len(got) == 43 and len(loud) == 3
    assert loud[0].startswith(f"FAIL [rdkafka#producer-1] {REFUSED}")
    assert loud[0].endswith(
        "(more connection failures to 127.0.0.1:29092 within 60 s are logged at DEBUG)"
    )
    assert loud[1].startswith("ERROR [rdkafka#consumer-2] 1/1 brokers are down")
    assert loud[2].startswith("FAIL [rdkafka#producer-3]")  # the next minute
    assert all(level in (logging.WARNING, logging.DEBUG) for level, _ in got)


def test_other_lines_keep_their_level(caplog: pytest.LogCaptureFixture) -> None:
    log = ClusterLog("127.0.0.1:29092", ConnectionLogFolder(clock=FakeClock()))
    with caplog.at_level(logging.DEBUG, logger="mm2py.librdkafka"):
        log.log(logging.WARNING, FMT, "OFFSET", "rdkafka#consumer-1", "offset reset")
        log.log(logging.ERROR, FMT, "ERROR", "rdkafka#producer-1", "some other error")
    assert lines(caplog) == [
        (logging.WARNING, "OFFSET [rdkafka#consumer-1] offset reset"),
        (logging.ERROR, "ERROR [rdkafka#producer-1] some other error"),
    ]


def test_what_counts_as_a_connection_failure() -> None:
    assert is_connection_failure("FAIL", REFUSED)
    assert is_connection_failure("ERROR", "3/3 brokers are down")
    assert not is_connection_failure("ERROR", "Topic t: unknown")
