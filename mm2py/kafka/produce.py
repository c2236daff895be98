"""Producing with backpressure: what every writer does when the producer's queue is full."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

ROOM_WAIT = 0.05


def produce_when_room(
    producer: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    give_up: Callable[[], bool] | None = None,
) -> bool:
    """Produce; while the queue is full, serve acknowledgements and try again.

    False (nothing produced) once `give_up()` is true, e.g. when stopping.
    """
    while True:
        try:
            producer.produce(*args, **kwargs)
            return True
        except BufferError:
            producer.poll(ROOM_WAIT)
            if give_up is not None and give_up():
                return False
