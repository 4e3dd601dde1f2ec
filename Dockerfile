# One image for agents and controllers: `docker run trimtab agent ...` / `... controller ...`.
# Multi-stage: build wheels with the compiler toolchain, run on a slim base as an unprivileged user.
FROM python:3.11-slim AS build
WORKDIR /src
# The whole context, so the image cannot miss a package the source tree has; .dockerignore keeps caches,
# tests and docs out. pyproject.toml and setup.py decide what is in the wheel (package-dir maps the
# top-level folders to trimtab.<name>; the dev kit is left out). scripts/check-wheel.sh builds the wheel
# from exactly this context (trimtab.devkit.docker_context) and runs every command from a fresh virtualenv.
COPY . .
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="trimtab" \
      org.opencontainers.image.description="Shard ownership and load balancing for stateless serving brokers"
RUN groupadd --system --gid 10001 trimtab \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/trimtab --create-home trimtab
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# Numeric, so that Kubernetes' runAsNonRoot can verify it (deploy/kubernetes).
USER 10001:10001
WORKDIR /var/lib/trimtab
ENV PYTHONUNBUFFERED=1 \
    TRIMTAB_HTTP__HOST=0.0.0.0 \
    TRIMTAB_HTTP__PORT=8080
EXPOSE 8080
# Liveness: the daemon's event loop is ticking (readiness is /readyz).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"]
# The daemons handle SIGTERM themselves (an agent drains first); run with `init: true` (compose) or
# `--init` so PID 1 reaps zombies.
ENTRYPOINT ["trimtab"]
CMD ["--help"]
