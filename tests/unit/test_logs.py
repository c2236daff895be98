"""Log lines: one per event; JSON with flow/part from the thread, topic/partition as extras."""

from __future__ import annotations

import io
import json
import logging
import signal
import subprocess
import sys
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


def test_a_crash_in_native_code_leaves_every_threads_stack_in_the_log() -> None:
    # A process that configured its logs and then dies of a segfault (as a librdkafka
    # bug would make it) writes what its threads were doing to stderr.
    code = (
        "import ctypes, threading, time\n"
        "from mm2py import logs\n"
        "logs.configure()\n"
        "def copying_in_another_thread():\n"
        "    time.sleep(30)\n"
        "threading.Thread(target=copying_in_another_thread, daemon=True).start()\n"
        "time.sleep(0.2)\n"
        "ctypes.string_at(0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == -signal.SIGSEGV
    assert "Segmentation fault" in done.stderr
    assert "copying_in_another_thread" in done.stderr, done.stderr
