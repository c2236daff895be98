"""Reading records in batches: the one consume idiom of the copy loops."""

from __future__ import annotations

from typing import Any


def consume_batch(consumer: Any, size: int, timeout: float) -> list[Any]:
    """Up to `size` records: what is queued at once, or else the first record within
    `timeout` and what is queued behind it.

    `consume(size, timeout)` would wait for a full batch or the whole timeout, which
    holds back the first records of light traffic. Typed Any: the hot loops rely on
    records being complete, not Optional.
    """
    msgs: list[Any] = consumer.consume(size, 0)
    if not msgs:
        first = consumer.poll(timeout)
        if first is not None:
            msgs = [first, *consumer.consume(size - 1, 0)]
    return msgs
