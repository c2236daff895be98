# mm2py: slim Python with a JRE (for Spark backfills and the local Kafka tools).
# bookworm pinned: it still ships OpenJDK 17 (newer Debian has 21 only). BASE is the
# official image; tests/integration/test_docker.py builds on a stand-in of it
# (docker/standin-base.sh) where no registry is reachable.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 mm2py
# The REST API and /metrics; inside a container it must listen beyond loopback.
EXPOSE 8083
# Asks /health where the daemon listens: its --listen, read from its command line.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s \
  CMD ["python", "/app/docker/healthcheck.py"]
ENTRYPOINT ["mm2py"]
# Mount your mm2.properties (or .yaml) at /etc/mm2py/mm2.properties, or pass other arguments.
CMD ["run", "/etc/mm2py/mm2.properties", "--listen", "0.0.0.0:8083"]
# The code last, in one layer (.dockerignore: pyproject.toml, README.md, mm2py/,
# configs/, docker/): everything above stays cached while it changes.
WORKDIR /app
COPY . ./
RUN pip install . \
 && rm -rf /app/build
USER mm2py
