"""Log lines: one per event; JSON with flow/part from the thread, topic/partition as extras."""

from __future__ import annotations

import io
import json
import logging
import threading

from mm2py import logs


def _capture(fmt: logs.LogFormat) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter() if fmt == "json" else logs.TextFormatter())
    handler.addFilter(logs.ContextFilter())
    logger = logging.getLogger(f"mm2py.test.{fmt}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, stream


def test_json_lines_carry_flow_part_topic_and_partition() -> None:
    logger, stream = _capture("json")

    def part_thread() -> None:
        logs.set_context(flow="A->B", part="source")
        logger.error("copy failed", extra=logs.partition_fields("orders", 3))
        try:
            raise ValueError("bad\nrecord")
        except ValueError:
            logger.exception("part failed")

    t = threading.Thread(target=part_thread)
    t.start()
    t.join()
    logger.info("no flow here")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    first, second, third = (json.loads(line) for line in lines)
    assert first["message"] == "copy failed" and first["level"] == "ERROR"
    assert first["logger"] == "mm2py.test.json" and first["time"].endswith("Z")
    assert (first["flow"], first["part"], first["topic"], first["partition"]) == (
        "A->B",
        "source",
        "orders",
        3,
    )
    assert second["flow"] == "A->B" and "ValueError: bad" in second["exception"]
    assert "flow" not in third and "topic" not in third


def test_text_lines_are_one_line_per_event_even_with_an_exception() -> None:
    logger, stream = _capture("text")
    try:
        raise RuntimeError("broker\ngone")
    except RuntimeError:
        logger.exception("flow %s: source part failed", "A->B")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].endswith("flow A->B: source part failed [RuntimeError: broker gone]")
