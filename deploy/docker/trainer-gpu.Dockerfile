# syntax=docker/dockerfile:1
# voicering training worker on a GPU: consumes the Redis training queue, trains a LoRA per job,
# validates it through a local `voicering worker` (vLLM, same image) and publishes it into the
# adapter store the workers serve.
#   docker build -f deploy/docker/trainer-gpu.Dockerfile -t voicering-trainer:gpu .
ARG CUDA_IMAGE=nvidia/cuda:12.9.1-base-ubuntu24.04

FROM ${CUDA_IMAGE} AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc g++ \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/voicering/venv
COPY pyproject.toml README.md /src/
COPY voicering /src/voicering
COPY gateway /src/gateway
COPY gpu_worker /src/gpu_worker
COPY hashring /src/hashring
COPY lora_training /src/lora_training
COPY silence_trim /src/silence_trim
COPY bench /src/bench
RUN /opt/voicering/venv/bin/pip install --upgrade pip \
 && /opt/voicering/venv/bin/pip install "/src[gpu,train]"

FROM ${CUDA_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-dev gcc libc6-dev libsndfile1 tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 voicering \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/voicering voicering \
 && mkdir -p /srv/voicering/voices /srv/voicering/uploads /var/lib/voicering/train /home/voicering/.cache/huggingface \
 && chown -R voicering:voicering /srv/voicering /var/lib/voicering /home/voicering
COPY --from=build /opt/voicering/venv /opt/voicering/venv
COPY deploy/docker/healthcheck.py /opt/voicering/healthcheck.py
ENV PATH=/opt/voicering/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/home/voicering/.cache/huggingface \
    VOICERING_TRAIN_ADAPTER_STORE=/srv/voicering/voices \
    VOICERING_TRAIN_WORK_DIR=/var/lib/voicering/train \
    VOICERING_TRAIN_DEVICE=cuda
USER 10001:10001
WORKDIR /home/voicering
# No health endpoint exists in the trainer: the check is that its queue's Redis answers (see healthcheck.py).
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 CMD ["python", "/opt/voicering/healthcheck.py", "trainer"]
ENTRYPOINT ["tini", "--"]
CMD ["voicering", "train-worker"]
