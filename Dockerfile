# One image for every process of a deployment; the command picks the role:
#
#   backfill serve                                    the control plane (the default)
#   backfill worker --control-plane URL               a backfill worker (a Spark driver)
#   spark-class org.apache.spark.deploy.master.Master --host HOST
#                                                     a Spark standalone master
#   spark-class org.apache.spark.deploy.worker.Worker spark://HOST:7077
#                                                     a Spark standalone worker
#
# Spark runs from the pyspark installed in /opt/venv. The Spark master and workers use this
# same image on purpose: executors run our Python Data Source (spark_workers/datasource.py),
# so they need the same Python, at the same path, with this package installed.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: a virtual environment with the package and its dependencies -------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies first, from pyproject.toml alone, so that a code change does not download
# and reinstall pyspark (hundreds of MB) again.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && /opt/venv/bin/pip install --no-cache-dir -r /tmp/requirements.txt
# then the package itself (.dockerignore keeps the venv, tests and caches out)
COPY . .
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps . \
    && /opt/venv/bin/pip check \
    && /opt/venv/bin/backfill --help > /dev/null

# ---- runtime --------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
# Java 17 runs Spark (each worker's driver, the Spark master and Spark workers); tini is
# PID 1 and reaps what Spark forks (executors, Python workers); curl runs the health checks.
# (/usr/share/man/man1 must exist for the JRE's postinst on slim images.)
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 backfill \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/backfill --shell /usr/sbin/nologin backfill

# The venv stays owned by root: the service user can run it, not change it.
COPY --from=build /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    SPARK_WORKER_DIR=/home/backfill/spark-work \
    BACKFILL_HOST=0.0.0.0 \
    BACKFILL_PORT=8000 \
    BACKFILL_DATA_DIR=/home/backfill/data

# fail the build here, not at run time, if SPARK_HOME is not where pyspark is
RUN test -x "${SPARK_HOME}/bin/spark-class" && java -version

USER 10001:10001
WORKDIR /home/backfill
RUN mkdir -p /home/backfill/data /home/backfill/spark-work

# 8000: control plane (API, /dashboard); 7077, 8080: Spark master; 8081: Spark worker UI
EXPOSE 8000 7077 8080 8081

# For the default command (the control plane). Compose overrides it for the other roles.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=5 \
    CMD ["/bin/sh", "-c", "curl -fsS \"http://127.0.0.1:${BACKFILL_PORT}/healthz\" > /dev/null || exit 1"]

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["backfill", "serve"]
