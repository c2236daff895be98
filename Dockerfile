# mm2py: slim Python with a JRE (for Spark backfills and the local Kafka tools).
# bookworm pinned: it still ships OpenJDK 17 (newer Debian has 21 only).
FROM python:3.11-slim-bookworm
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 10001 mm2py
WORKDIR /app
COPY pyproject.toml README.md ./
COPY mm2py ./mm2py
COPY configs ./configs
RUN pip install .
USER mm2py
# The REST API and /metrics; inside a container it must listen beyond loopback.
EXPOSE 8083
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8083/health', timeout=4)"]
ENTRYPOINT ["mm2py"]
# Mount your mm2.properties (or .yaml) at /etc/mm2py/mm2.properties, or pass other arguments.
CMD ["run", "/etc/mm2py/mm2.properties", "--listen", "0.0.0.0:8083"]
