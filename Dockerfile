# mm2py: slim Python with a JRE (for Spark backfills and the local Kafka tools).
FROM python:3.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 10001 mm2py
WORKDIR /app
COPY pyproject.toml README.md ./
COPY mm2py ./mm2py
COPY configs ./configs
RUN pip install --no-cache-dir .
USER mm2py
EXPOSE 8083
ENTRYPOINT ["mm2py"]
CMD ["run", "/app/configs/mm2.properties", "--listen", "0.0.0.0:8083"]
