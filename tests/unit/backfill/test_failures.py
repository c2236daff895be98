# ruff: noqa: E501 (Spark's error text has long lines)
"""The one line for a failed Spark task, from Spark's error text (as Spark 4.0 writes it)."""

from __future__ import annotations

from mm2py.backfill.failures import (
    IMPORT_HINT,
    OTHER_HINT,
    START_HINT,
    parse_task_failure,
    task_failure_line,
)

# The shape of Py4JJavaError's text for a task whose Python could not import mm2py
# (from a run on a standalone cluster, frames shortened).
IMPORT_FAILURE = """An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 1.0 failed 4 times, most recent failure: Lost task 0.3 in stage 1.0 (TID 4) (10.0.0.7 executor 3): org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/opt/spark/python/lib/pyspark.zip/pyspark/serializers.py", line 500, in loads
    return cloudpickle.loads(obj, encoding=encoding)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
ModuleNotFoundError: No module named 'mm2py'

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:581)
\tat java.base/java.lang.Thread.run(Thread.java:840)
Caused by: org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/opt/spark/python/lib/pyspark.zip/pyspark/serializers.py", line 500, in loads
ModuleNotFoundError: No module named 'mm2py'

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:581)
\tat java.base/java.util.concurrent.ThreadPoolExecutor$Worker.run(ThreadPoolExecutor.java:635)
\t... 1 more
"""

NO_PYTHON = """An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed 4 times, most recent failure: Lost task 0.3 in stage 0.0 (TID 3) (10.0.0.8 executor 1): java.io.IOException: Cannot run program "./environment/bin/python": error=2, No such file or directory
\tat java.base/java.lang.ProcessBuilder.start(ProcessBuilder.java:1143)
\t... 1 more
"""


def test_the_python_exception_where_and_what_to_do_never_a_stack_frame() -> None:
    line = task_failure_line(IMPORT_FAILURE, "orders-1 [0, 5000) (range 1/1)", "python3")
    assert line == (
        "copying orders-1 [0, 5000) (range 1/1) failed (on executor 3 at 10.0.0.7, after 4 "
        "attempts, executors' Python: python3): ModuleNotFoundError: No module named 'mm2py'; "
        + IMPORT_HINT
    )
    assert "more" not in line.split(";")[0]


def test_an_executor_that_could_not_start_its_python_gives_spark_s_cause() -> None:
    failure = parse_task_failure(NO_PYTHON)
    assert failure.python_type is None
    assert (failure.host, failure.executor, failure.attempts) == ("10.0.0.8", "1", 4)
    line = task_failure_line(NO_PYTHON, "t-0 [0, 10)", "./environment/bin/python")
    assert line.endswith(
        ': java.io.IOException: Cannot run program "./environment/bin/python": error=2, '
        "No such file or directory; " + START_HINT
    )


def test_the_copier_s_own_message_is_kept_as_it_is() -> None:
    text = IMPORT_FAILURE.replace(
        "ModuleNotFoundError: No module named 'mm2py'",
        "mm2py.backfill.copier.RangeCopyError: copying t-0 [0, 10) failed: Broker: Message size too large",
    )
    assert task_failure_line(text, "t-0 [0, 10)", "python3") == (
        "copying t-0 [0, 10) failed: Broker: Message size too large"
    )


def test_text_without_spark_s_shape_ends_with_its_last_meaningful_line() -> None:
    line = task_failure_line(
        "boom: the gateway went away\n\tat x.y(Z.java:1)\n\t... 1 more", "r", "p"
    )
    assert (
        line
        == f"copying r failed (executors' Python: p): boom: the gateway went away; {OTHER_HINT}"
    )
