# syntax=docker/dockerfile:1
# healer: the controller, the fleet simulator and the stand-in provider receiver, one image.
#   make image IMAGE=registry.example.com/healer     (= docker build -t registry.example.com/healer:0.1.0 .)
#   docker run --rm -p 8080:8080 healer:0.1.0            # `healer run`, dry-run, SQLite in /var/lib/healer
#   docker run --rm healer:0.1.0 db upgrade              # any other sub-command
# No secrets in the image: database URLs and HMAC keys come from the environment or mounted files.

ARG PYTHON_IMAGE=python:3.11-slim

# --- build: install healer and its runtime dependencies (no dev extras) into a venv ---
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/healer
WORKDIR /src
# The dependencies first, in a layer of their own (pyproject.toml alone: no package is found, so
# the project installs empty and is removed): a change of healer's code reuses that layer.
COPY pyproject.toml README.md ./
RUN /opt/healer/bin/pip install ".[agent]" && /opt/healer/bin/pip uninstall --yes healer
COPY healer ./healer
COPY api ./api
# Dev tooling (fleet simulator, stand-in provider) for docker-compose.yml; healer never imports it.
COPY healer_dev ./healer_dev
RUN /opt/healer/bin/pip install --no-deps . && /opt/healer/bin/pip check
# healer.store.migrate finds migrations/ beside the installed `healer` package (site-packages).
COPY migrations ./migrations
RUN site="$(/opt/healer/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    && cp -r migrations "$site/migrations" \
    && /opt/healer/bin/python -c 'from healer.store.migrate import alembic_config; alembic_config("sqlite://")'

# --- runtime ---
FROM ${PYTHON_IMAGE}
ARG HEALER_UID=10001
# Fixed UID/GID: the Kubernetes manifests (runAsUser, fsGroup) and volume ownership rely on it.
RUN groupadd --system --gid "${HEALER_UID}" healer \
    && useradd --system --uid "${HEALER_UID}" --gid healer --home-dir /var/lib/healer \
       --no-create-home --shell /usr/sbin/nologin healer \
    && install -d -o healer -g healer -m 0750 /var/lib/healer
COPY --from=build /opt/healer /opt/healer
# The default rule pack; settings.rules_paths defaults to ./rules. Owned by root: read-only to healer.
COPY rules /var/lib/healer/rules
# /var/lib/healer is the working directory: the default SQLite file (sqlite:///healer.db) lands there.
WORKDIR /var/lib/healer
ENV PATH=/opt/healer/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HEALER_API__HOST=0.0.0.0
USER ${HEALER_UID}:${HEALER_UID}
EXPOSE 8080
# python, not curl: the slim image has no curl. Fails on connection errors and HTTP >= 400.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('HEALER_API__PORT', '8080'), timeout=4)"]
ENTRYPOINT ["healer"]
CMD ["run"]
