# Two images from one Dockerfile, one per role (docs/operations.md, "Images"):
#
#   --target control-plane   `backfill serve` (the default command) and `backfill db`: the base
#                            package only; no Java, no Spark, no embedded Postgres
#   --target worker          Java 17 and the [worker] extra (pyspark, pyarrow); the command
#                            picks the role:
#     backfill worker --control-plane URL             a backfill worker (a Spark driver)
#     spark-class org.apache.spark.deploy.master.Master --host HOST
#                                                     a Spark standalone master
#     spark-class org.apache.spark.deploy.worker.Worker spark://HOST:7077
#                                                     a Spark standalone worker
#
# Spark runs from the pyspark installed in /opt/venv. The Spark master and workers use the
# worker image: executors need Java and the worker's Python (same version, at the same path,
# PYSPARK_PYTHON) with pyspark, pyarrow and psycopg2; the worker ships our own code to them
# (spark_workers/shipped_code.py), so a cluster of other images works too.
# Both build for linux/amd64 and linux/arm64 (`docker buildx build --platform ...`): every
# locked dependency has an aarch64 wheel or is pure Python (tests/unit/test_packaging.py).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: virtual environments with the pinned dependencies, then the package ------------
FROM ${PYTHON_IMAGE} AS build-control-plane
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies first, from the lock files alone (`make lock`), so that a code change does
# not download and reinstall them again.
COPY requirements/ requirements/
RUN /opt/venv/bin/pip install --no-cache-dir -r requirements/control-plane.lock
# then the package itself (.dockerignore keeps the venv, tests and caches out)
COPY . .
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps . \
    && /opt/venv/bin/pip check \
    && /opt/venv/bin/backfill --help > /dev/null

FROM build-control-plane AS build-worker
# the worker lock pins the control plane's packages at the same versions, plus Spark's
RUN /opt/venv/bin/pip install --no-cache-dir -r requirements/worker.lock \
    && /opt/venv/bin/pip check

# ---- runtime: what both images share ----------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
# tini is PID 1 and reaps what the process forks (Spark's executors, Python workers); curl
# runs the health checks.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 backfill \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/backfill --shell /usr/sbin/nologin backfill
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    BACKFILL_HOST=0.0.0.0 \
    BACKFILL_PORT=8000
ENTRYPOINT ["/usr/bin/tini", "--"]

# ---- worker: Java 17, Spark, the worker's Python ---------------------------------------------
FROM runtime AS worker
# Java 17 runs Spark (each worker's driver, the Spark master and Spark workers).
# (/usr/share/man/man1 must exist for the JRE's postinst on slim images.)
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
# The venv stays owned by root: the service user can run it, not change it.
COPY --from=build-worker /opt/venv /opt/venv
ENV SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    SPARK_WORKER_DIR=/home/backfill/spark-work
# fail the build here, not at run time, if SPARK_HOME is not where pyspark is
RUN test -x "${SPARK_HOME}/bin/spark-class" && java -version
USER 10001:10001
WORKDIR /home/backfill
RUN mkdir -p /home/backfill/spark-work
# 7077, 8080: Spark master; 8081: Spark worker UI (a backfill worker serves no port)
EXPOSE 7077 8080 8081
CMD ["backfill", "worker", "--help"]

# ---- control plane (the default target): the base package only ------------------------------
FROM runtime AS control-plane
COPY --from=build-control-plane /opt/venv /opt/venv
USER 10001:10001
WORKDIR /home/backfill
# 8000: the API and /dashboard
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=5 \
    CMD ["/bin/sh", "-c", "curl -fsS \"http://127.0.0.1:${BACKFILL_PORT}/healthz\" > /dev/null || exit 1"]
# without DATABASE_URL it says to set one: this image has no embedded Postgres
CMD ["backfill", "serve"]
