# syntax=docker/dockerfile:1
# voicering LiveKit agent server (`voicering agent`): joins rooms on dispatch and speaks with a
# voicering voice through the GPU fleet. Holds no model. Health on 8081 (livekit-agents' GET /).
#   docker build -f deploy/docker/agent.Dockerfile -t voicering-agent .
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
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/voicering voicering
COPY --from=build /opt/voicering/venv /opt/voicering/venv
COPY deploy/docker/healthcheck.py /opt/voicering/healthcheck.py
ENV PATH=/opt/voicering/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    VOICERING_AGENT_HTTP_HOST=0.0.0.0 \
    VOICERING_AGENT_HTTP_PORT=8081
USER 10001:10001
WORKDIR /home/voicering
EXPOSE 8081
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 CMD ["python", "/opt/voicering/healthcheck.py", "agent"]
# SIGTERM: the agent server stops taking rooms and lets running ones finish (livekit-agents drains).
ENTRYPOINT ["tini", "--"]
CMD ["voicering", "agent"]
