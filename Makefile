# Two entry points: `make demo` and `make test`. Everything they need is
# installed here: a local virtualenv with the Python packages, and the Kafka
# jars and Apicurio Registry (the tests' schema registries) from Maven Central
# (java and mvn come from the machine: OpenJDK 17, Maven).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: install jars prometheus docker-engine demo test lint unit integration bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,spark]'
	touch $(STAMP)

jars: install
	$(BIN)/mm2py local fetch

demo: jars
	$(BIN)/mm2py demo

# mkdocs without --quiet: with it, --strict counts no warnings and passes a broken link
# (mkdocs 1.6.1; mkdocs/mkdocs issue 4126). The docs site is built into site/.
lint: install
	$(BIN)/ruff check mm2py tests $(wildcard bench)
	$(BIN)/ruff format --check mm2py tests $(wildcard bench)
	$(BIN)/mypy --strict mm2py
	$(BIN)/lint-imports --no-cache
	$(BIN)/mkdocs build --strict --site-dir site

unit: install prometheus
	$(BIN)/pytest -q tests/unit

# The Grafana dashboard test runs a real Prometheus (Debian's package, as a plain
# process, not a service); the alert rules' unit test runs its promtool.
prometheus:
	command -v prometheus >/dev/null && command -v promtool >/dev/null || ($(SUDO) apt-get update \
		&& $(SUDO) apt-get install -y --no-install-recommends prometheus)

# The Docker image test starts Debian's Docker engine (as root; it skips without one)
# and builds a stand-in base image with debootstrap.
docker-engine:
	command -v dockerd >/dev/null && command -v debootstrap >/dev/null || ($(SUDO) apt-get update \
		&& $(SUDO) apt-get install -y --no-install-recommends docker.io debootstrap)

# Three pytest workers (pytest-xdist; each starts clusters of its own on ports of its own:
# docs/tests.md), then alone the tests that measure time against a bound or another
# observer (marker `serial`). mm2py's own modules are compiled first: the suite starts
# about a thousand Python processes, and where PYTHONDONTWRITEBYTECODE is set (as on this
# project's machines) each would compile every mm2py module it imports from source again.
# pytest runs without that variable: it keeps the test modules it rewrote (for its assert
# messages) beside their bytecode only when it may write bytecode, and rewriting all of
# them took 4.5 s of each collection's 7.5 s (the serial step's included).
test: jars prometheus docker-engine lint
	$(BIN)/python -m compileall -q mm2py tests
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -q -ra -n 3 --dist loadfile --no-loadscope-reorder -m "not serial" --durations=25
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -q -ra -m serial --durations=5

bench: jars
	$(BIN)/python bench/replication.py

clean:
	-$(BIN)/mm2py local down
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
