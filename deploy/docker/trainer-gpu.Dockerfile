# syntax=docker/dockerfile:1
# voicering training worker on a GPU: consumes the Redis training queue, trains a LoRA per job,
# validates it through a local `voicering worker` (vLLM, same image) and publishes it into the
# adapter store the workers serve.
#   docker build -f deploy/docker/trainer-gpu.Dockerfile -t voicering-trainer:gpu .
# CUDA 13 userland, as torch 2.13's wheels (cu130): the host driver must be R580 or newer.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-base-ubuntu24.04

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
 && mkdir -p /srv/voicering/voices /srv/voicering/uploads /var/lib/voicering/train /home/voicering/.cache/huggingface /home/voicering/.cache/compile \
 && chown -R voicering:voicering /srv/voicering /var/lib/voicering /home/voicering
COPY --from=build /opt/voicering/venv /opt/voicering/venv
COPY deploy/docker/healthcheck.py /opt/voicering/healthcheck.py
# VLLM_USE_FLASHINFER_SAMPLER=0: vLLM's FlashInfer top-p/top-k sampler JIT-compiles its kernels with
# nvcc, which this image does not have, during vLLM's start-up profile run. It costs nothing: the
# worker's fused slot sampler (the default constraint) picks each token itself and hands vLLM a
# greedy request (temperature 0, top-p 1) whose logits hold one finite value; the other constraints use
# vLLM's PyTorch top-p path. The compile caches (vLLM, FlashInfer, Inductor, Triton) live under
# ~/.cache/compile, which the deploy configs put on a volume, so a restart does not compile again.
ENV PATH=/opt/voicering/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/home/voicering/.cache/huggingface \
    VLLM_USE_FLASHINFER_SAMPLER=0 \
    VLLM_CACHE_ROOT=/home/voicering/.cache/compile/vllm \
    FLASHINFER_WORKSPACE_BASE=/home/voicering/.cache/compile \
    TORCHINDUCTOR_CACHE_DIR=/home/voicering/.cache/compile/inductor \
    TRITON_CACHE_DIR=/home/voicering/.cache/compile/triton \
    VOICERING_TRAIN_ADAPTER_STORE=/srv/voicering/voices \
    VOICERING_TRAIN_WORK_DIR=/var/lib/voicering/train \
    VOICERING_TRAIN_DEVICE=cuda
USER 10001:10001
WORKDIR /home/voicering
# No health endpoint exists in the trainer: the check is that its queue's Redis answers (see healthcheck.py).
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 CMD ["python", "/opt/voicering/healthcheck.py", "trainer"]
ENTRYPOINT ["tini", "--"]
CMD ["voicering", "train-worker"]
