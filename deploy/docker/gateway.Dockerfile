# syntax=docker/dockerfile:1
# voicering gateway: the public API (OpenAI-compatible speech, text-in websocket, voice cloning,
# tenants, web page) on 8000. No torch, no vLLM: it reaches workers over websockets.
#   docker build -f deploy/docker/gateway.Dockerfile -t voicering-gateway .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/voicering/venv
COPY pyproject.toml README.md /src/
COPY voicering /src/voicering
COPY gateway /src/gateway
COPY gpu_worker /src/gpu_worker
COPY hashring /src/hashring
COPY lora_training /src/lora_training
COPY silence_trim /src/silence_trim
COPY bench /src/bench
RUN /opt/voicering/venv/bin/pip install --upgrade pip \
 && /opt/voicering/venv/bin/pip install "/src[gateway]"

FROM ${PYTHON_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libsndfile1 tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 voicering \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/voicering voicering \
 && mkdir -p /srv/voicering/voices /srv/voicering/uploads \
 && chown -R voicering:voicering /srv/voicering /home/voicering
COPY --from=build /opt/voicering/venv /opt/voicering/venv
COPY deploy/docker/healthcheck.py /opt/voicering/healthcheck.py
ENV PATH=/opt/voicering/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    VOICERING_GATEWAY_HOST=0.0.0.0 \
    VOICERING_GATEWAY_PORT=8000 \
    VOICERING_GATEWAY_VOICES_DIR=/srv/voicering/voices \
    VOICERING_GATEWAY_UPLOADS_DIR=/srv/voicering/uploads
USER 10001:10001
WORKDIR /home/voicering
# 8000: the public API; 8001: the internal metrics server (bind it with VOICERING_GATEWAY_METRICS_HOST)
EXPOSE 8000 8001
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["python", "/opt/voicering/healthcheck.py", "gateway"]
ENTRYPOINT ["tini", "--"]
CMD ["voicering", "gateway", "--grace", "30"]
