"""`mm2py run` ends once the daemon has stopped, even with a call to a cluster unanswered."""

from __future__ import annotations

import subprocess
import sys

# A thread pool's thread stuck in a call (here a sleep) would hold the interpreter's exit
# until the call returns: the interpreter joins such threads when it ends.
_STUCK_POOL = """
import concurrent.futures, logging, time
from mm2py.cli.run import _exit_past_unanswered_calls
logging.basicConfig(format="%(levelname)s %(message)s")
pool = concurrent.futures.ThreadPoolExecutor(1, "group-offsets")
pool.submit(time.sleep, 120)
time.sleep(0.2)
_exit_past_unanswered_calls()
print("returned")
"""

_NOTHING_LEFT = """
from mm2py.cli.run import _exit_past_unanswered_calls
_exit_past_unanswered_calls()
print("returned")
"""


def test_a_call_left_unanswered_does_not_hold_the_exit_and_is_named() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _STUCK_POOL], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    assert "returned" not in done.stdout
    assert (
        "WARNING exiting without waiting for calls not answered yet (group-offsets_0)"
        in done.stderr
    )


def test_without_such_calls_the_command_returns_as_usual() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _NOTHING_LEFT], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "returned", "")
