# syntax=docker/dockerfile:1
# Three images from one file (docker-compose.yml picks the target):
#   dagster  webserver + daemon: Dagster only, never imports the project's code
#   code     the code location (`dagster code-server`): the project, torch, trainers; runs execute here
#   mlflow   the MLflow tracking server with the Postgres driver
# GPU build of `code`: --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 --build-arg EXTRAS=train,eval,gpu
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS python-base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# an unprivileged user owns the writable paths; containers run as it
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin dagster \
 && mkdir -p /opt/dagster/dagster_home /opt/dagster/storage /data \
 && chown -R dagster:dagster /opt/dagster/dagster_home /opt/dagster/storage /data

FROM python-base AS dagster
# The Dagster family moves in lock-step; these pins must equal pyproject.toml's.
RUN pip install "dagster==1.13.27" "dagster-webserver==1.13.27" "dagster-postgres==0.29.27"
ENV DAGSTER_HOME=/opt/dagster/dagster_home
COPY deploy/dagster.yaml deploy/workspace.yaml /opt/dagster/dagster_home/
USER dagster
WORKDIR /opt/dagster

FROM python-base AS code
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG EXTRAS=train,eval
# torch first from its own index: from PyPI an unpinned resolver pulls the multi-GB CUDA build
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==2.13.0"
WORKDIR /opt/dagster/app
COPY pyproject.toml README.md ./
COPY training_assets ./training_assets
COPY kernels ./kernels
# editable: definitions.py finds the project (pyproject [tool.dg]) next to the package
RUN pip install -e ".[${EXTRAS}]"
# site-packages were compiled by pip; the project's own modules too (PYTHONDONTWRITEBYTECODE above):
# otherwise every run worker recompiles them on import
RUN python -m compileall -q training_assets kernels
ENV DAGSTER_HOME=/opt/dagster/dagster_home TRAINING_ASSETS_DATA=/data \
    NUMBA_CACHE_DIR=/opt/dagster/storage/numba_cache HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
COPY deploy/dagster.yaml deploy/workspace.yaml /opt/dagster/dagster_home/
USER dagster
EXPOSE 4000
CMD ["dagster", "code-server", "start", "-m", "training_assets.definitions", "-h", "0.0.0.0", "-p", "4000", \
     "--location-name", "training_assets"]

FROM python-base AS mlflow
RUN pip install "mlflow>=3.5,<4" "psycopg2-binary>=2.9"
USER dagster
WORKDIR /opt/dagster
EXPOSE 5000
