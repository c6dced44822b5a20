# One image for the control plane and the workers: `backfill serve` or `backfill worker`.
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
RUN python -m venv /opt/venv
COPY pyproject.toml README.md ./
COPY backfill_core backfill_core
COPY service service
COPY spark_workers spark_workers
COPY state_store state_store
COPY migrations migrations
RUN /opt/venv/bin/pip install --no-cache-dir .

FROM python:3.11-slim-bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 backfill
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 BACKFILL_HOST=0.0.0.0 BACKFILL_DATA_DIR=/home/backfill/data
USER backfill
WORKDIR /home/backfill
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --retries=5 CMD curl -fsS http://127.0.0.1:8000/healthz || exit 1
ENTRYPOINT ["backfill"]
CMD ["serve"]
