"""Which Python Spark's executors run the backfill with (the choice, not the packing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mm2py.backfill import environment
from mm2py.backfill.environment import (
    EXECUTOR_PYTHON,
    PythonEnvironmentError,
    executor_python,
    runtime_distributions,
)


class Conf:
    """The part of SparkConf `executor_python` reads."""

    def __init__(self, **settings: str) -> None:
        self.settings = {k.replace("_", "."): v for k, v in settings.items()}

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.settings.get(key, default)


@pytest.fixture(autouse=True)
def _no_pyspark_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)


def test_a_local_master_runs_the_driver_s_own_python() -> None:
    chosen = executor_python(Conf(spark_master="local[2]"), None)
    assert (chosen.python, chosen.archive) == (sys.executable, None)


def test_python_env_ships_the_user_s_archive(tmp_path: Path) -> None:
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"")
    chosen = executor_python(Conf(spark_master="yarn"), str(archive))
    assert (chosen.python, chosen.archive) == (EXECUTOR_PYTHON, f"{archive}#environment")
    uri = "hdfs:///envs/mm2py.tar.gz"
    assert executor_python(Conf(spark_master="yarn"), uri).archive == f"{uri}#environment"


def test_a_python_env_that_is_not_there_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PythonEnvironmentError, match=r"--python-env .*missing.tar.gz: no such"):
        executor_python(Conf(spark_master="yarn"), str(tmp_path / "missing.tar.gz"))


def test_a_python_the_user_chose_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_packing() -> Path:
        raise AssertionError("packed although the user chose a Python")

    monkeypatch.setattr(environment, "packed_environment", no_packing)
    chosen = executor_python(
        Conf(spark_master="yarn", spark_pyspark_python="/opt/py/bin/python"), None
    )
    assert (chosen.python, chosen.archive) == ("/opt/py/bin/python", None)
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3.11")
    assert executor_python(Conf(spark_master="yarn"), None).python == "/usr/bin/python3.11"
    monkeypatch.delenv("PYSPARK_PYTHON")
    assert (
        executor_python(Conf(spark_master="yarn", spark_archives="e.tar.gz#e"), None).archive
        is None
    )


def test_a_cluster_master_ships_mm2py_s_packed_python(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    packed = tmp_path / "mm2py-python-0123.tar.gz"
    monkeypatch.setattr(environment, "packed_environment", lambda: packed)
    chosen = executor_python(Conf(spark_master="spark://10.0.0.1:7077"), None)
    assert (chosen.python, chosen.archive) == (EXECUTOR_PYTHON, f"{packed}#environment")


def test_the_packed_distributions_are_mm2py_s_runtime_needs_without_spark_s() -> None:
    names = {d.metadata["Name"].lower().replace("_", "-") for d in runtime_distributions()}
    assert {"confluent-kafka", "pydantic", "pydantic-core", "pyyaml"} <= names
    assert not names & {"pyspark", "py4j", "pytest", "mm2py"}
