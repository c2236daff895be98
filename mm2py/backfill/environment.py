"""The Python that Spark's executors run the backfill's ranges with.

`executor_python(conf, python_env)` decides, in this order: a local master's own
interpreter (or PYSPARK_PYTHON); `--python-env ARCHIVE`, shipped as
``ARCHIVE#environment`` through `spark.archives`; the user's PYSPARK_PYTHON,
spark.pyspark.python or spark.archives, left alone; else `packed_environment()`.

Invariants of `packed_environment()`:
- built once per digest (Python version and platform, the packed distributions and their
  versions, the content of mm2py's files) under ``~/.cache/mm2py/spark-env/``; archives
  of other digests are removed after a day unused;
- it holds the interpreter, its libpython and standard library, mm2py and its run-time
  distributions, never PySpark or py4j (each Spark installation ships its own);
- ``environment/bin/python`` runs the packed interpreter whatever Python the executor has.
Design: docs/design/backfill.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as metadata
import io
import logging
import os
import re
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mm2py
from mm2py.cache import cache_root
from mm2py.errors import Mm2pyError

log = logging.getLogger(__name__)

# The folder the archive unpacks to in each executor's working directory.
ENVIRONMENT_DIR = "environment"
EXECUTOR_PYTHON = f"./{ENVIRONMENT_DIR}/bin/python"
# Spark brings its own on every executor (SPARK_HOME/python/lib).
PROVIDED_BY_SPARK = {"pyspark", "py4j"}
# Parts of the standard library no range copy imports.
STDLIB_LEFT_OUT = {
    "test",
    "site-packages",
    "dist-packages",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "__pycache__",
}
KEEP_UNUSED_SECONDS = 24 * 3600
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class PythonEnvironmentError(Mm2pyError):
    """The executors' Python environment could not be packed or named."""


@dataclass(frozen=True)
class ExecutorPython:
    """What the executors run: a Python path and, when shipped, the archive it is in."""

    python: str  # PYSPARK_PYTHON, as the executors see it
    archive: str | None  # for spark.archives ("path#environment"); None: nothing shipped
    why: str  # for the log and for error messages

    def describe(self) -> str:
        return f"{self.python} ({self.why})"


def executor_python(conf: Any, python_env: str | None) -> ExecutorPython:
    """The executors' Python for a SparkConf `conf` (see the module's contract)."""
    if conf.get("spark.master", "").startswith("local"):
        own = os.environ.get("PYSPARK_PYTHON") or sys.executable
        return ExecutorPython(own, None, "the driver's Python, local master")
    if python_env is not None:
        path = Path(python_env).expanduser()
        if "://" not in python_env and not path.is_file():
            raise PythonEnvironmentError(
                f"--python-env {python_env}: no such file; give a packed environment "
                "(a .tar.gz made by venv-pack or conda-pack, with bin/python inside)"
            )
        where = python_env if "://" in python_env else str(path.resolve())
        return ExecutorPython(
            EXECUTOR_PYTHON, f"{where}#{ENVIRONMENT_DIR}", f"--python-env {python_env}"
        )
    chosen = os.environ.get("PYSPARK_PYTHON") or conf.get("spark.pyspark.python", None)
    if chosen:
        return ExecutorPython(chosen, None, "PYSPARK_PYTHON/spark.pyspark.python, as set")
    if conf.get("spark.archives", None):
        return ExecutorPython("python3", None, "spark.archives as set, python3")
    archive = packed_environment()
    return ExecutorPython(
        EXECUTOR_PYTHON, f"{archive}#{ENVIRONMENT_DIR}", f"mm2py's packed Python, {archive.name}"
    )


# -- what goes into the packed environment ----------------------------------------


def runtime_distributions() -> list[metadata.Distribution]:
    """The installed distributions mm2py needs at run time, without extras and Spark's."""
    found: dict[str, metadata.Distribution] = {}
    todo = _requirement_names(metadata.distribution("mm2py"))
    while todo:
        name = _normalized(todo.pop())
        if name in found or name in PROVIDED_BY_SPARK or name == "mm2py":
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement for another platform or Python
        found[name] = dist
        todo += _requirement_names(dist)
    return [found[name] for name in sorted(found)]


def _requirement_names(dist: metadata.Distribution) -> list[str]:
    names = []
    for requirement in dist.requires or []:
        name, _, marker = requirement.partition(";")
        if "extra" in marker:
            continue
        match = _REQUIREMENT_NAME.match(name)
        if match:
            names.append(match[1])
    return names


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _mm2py_files() -> list[tuple[Path, str]]:
    """mm2py's own files: (path here, path under site-packages)."""
    package = Path(mm2py.__file__).parent
    return [
        (path, str(Path("mm2py") / path.relative_to(package)))
        for path in sorted(package.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    ]


def _distribution_files(dist: metadata.Distribution, site: Path) -> Iterator[tuple[Path, str]]:
    for file in dist.files or []:
        path = Path(str(dist.locate_file(file))).resolve()
        if "__pycache__" in path.parts or not path.is_file():
            continue
        try:
            yield path, str(path.relative_to(site))
        except ValueError:
            continue  # a script in bin/ or a file outside site-packages


def _stdlib_files() -> Iterator[tuple[Path, str]]:
    """The base interpreter's standard library, lib-dynload included."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    seen: set[Path] = set()
    for key in ("stdlib", "platstdlib"):
        root = Path(sysconfig.get_path(key, vars=base))
        for path in sorted(root.rglob("*")):
            parts = path.relative_to(root).parts
            if path in seen or not path.is_file() or STDLIB_LEFT_OUT & set(parts):
                continue
            if parts[0].startswith("config-"):
                continue  # static libraries and Makefiles for building extensions
            seen.add(path)
            yield path, f"lib/{version}/{'/'.join(parts)}"
    # A Debian-style Python keeps lib-dynload beside, not inside, the stdlib folder.
    dynload = Path(sysconfig.get_config_var("DESTSHARED") or "")
    if dynload.is_dir():
        for path in sorted(dynload.iterdir()):
            if path.is_file() and path not in seen:
                yield path, f"lib/{version}/lib-dynload/{path.name}"


def _interpreter_files() -> list[tuple[Path, str]]:
    """The real interpreter binary and, for a shared build, its libpython."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    binary = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    files = [(binary, f"bin/python{version}")]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        library = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
        libdir = Path(sysconfig.get_config_var("LIBDIR") or "")
        if not library or not (libdir / library).is_file():
            raise PythonEnvironmentError(
                f"cannot find this Python's shared library ({library} in {libdir}) to pack "
                "for the executors; give --python-env with an environment of your own"
            )
        files.append(((libdir / library).resolve(), f"lib/{library}"))
    return files


def _launcher() -> bytes:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (
        "#!/bin/sh\n"
        "# mm2py's packed Python: its own interpreter, libpython and standard library.\n"
        'here=$(cd "$(dirname "$0")/.." && pwd)\n'
        'LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" '
        'PYTHONHOME="$here" PYTHONNOUSERSITE=1 '
        f'exec "$here/bin/python{version}" "$@"\n'
    ).encode()


def environment_key(dists: list[metadata.Distribution]) -> str:
    """The digest that names an archive: Python, platform, versions, mm2py's content."""
    digest = hashlib.sha256()
    digest.update(f"{sys.version}|{sysconfig.get_platform()}|{sys.base_prefix}\n".encode())
    for dist in dists:
        digest.update(f"{dist.metadata['Name']}=={dist.version}\n".encode())
    for path, name in _mm2py_files():
        digest.update(name.encode() + b"\0" + path.read_bytes())
    digest.update(_launcher())
    return digest.hexdigest()[:16]


def packed_environment(folder: Path | None = None) -> Path:
    """The archive of this Python and mm2py for executors, packed now if not cached."""
    dists = runtime_distributions()
    folder = folder or cache_root() / "spark-env"
    archive = folder / f"mm2py-python-{environment_key(dists)}.tar.gz"
    if archive.is_file():
        log.debug("executors' Python: %s (packed before)", archive)
        os.utime(archive)  # in use: not removed as unused by another version's packing
        return archive
    folder.mkdir(parents=True, exist_ok=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = f"lib/{version}/site-packages"
    log.info("packing Python and mm2py for the Spark executors into %s", archive)
    members: list[tuple[Path, str]] = [*_interpreter_files(), *_stdlib_files()]
    members += [(path, f"{site}/{name}") for path, name in _mm2py_files()]
    for dist in dists:
        dist_site = Path(str(dist.locate_file(""))).resolve()
        members += [(p, f"{site}/{n}") for p, n in _distribution_files(dist, dist_site)]
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".partial", delete=False) as tmp:
        try:
            with tarfile.open(fileobj=tmp, mode="w:gz", compresslevel=1) as tar:
                for path, name in members:
                    tar.add(path, arcname=name, recursive=False)
                launcher = _launcher()
                info = tarfile.TarInfo("bin/python")
                info.size, info.mode, info.mtime = len(launcher), 0o755, int(time.time())
                tar.addfile(info, io.BytesIO(launcher))
        except OSError as exc:
            Path(tmp.name).unlink(missing_ok=True)
            raise PythonEnvironmentError(
                f"packing Python for the Spark executors into {folder} failed: {exc}"
            ) from None
    os.chmod(tmp.name, 0o644)
    os.replace(tmp.name, archive)
    _remove_older(folder, keep=archive)
    return archive


def _remove_older(folder: Path, keep: Path) -> None:
    """Archives of other versions unused for a day go (each is tens of MB): not sooner,
    as another checkout's backfill may be shipping one right now."""
    stale = time.time() - KEEP_UNUSED_SECONDS
    for old in folder.glob("mm2py-python-*.tar.gz"):
        with contextlib.suppress(OSError):
            if old != keep and old.stat().st_atime < stale and old.stat().st_mtime < stale:
                old.unlink()
