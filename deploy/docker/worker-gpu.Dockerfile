# syntax=docker/dockerfile:1
# voicering GPU worker: vLLM (CUDA) + SNAC, one process per GPU, websocket + /health + /metrics on 8765.
# Build from the repository root (the context is filtered by /.dockerignore):
#   docker build -f deploy/docker/worker-gpu.Dockerfile -t voicering-worker:gpu .
# Run with the NVIDIA container toolkit (`--gpus`, compose device reservations, or nvidia.com/gpu).
# The CUDA runtime libraries come with the torch/vLLM wheels; the base image brings the driver
# hooks and a matching userland. Ubuntu 24.04's Python is 3.12 (voicering needs >= 3.11).
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
 && /opt/voicering/venv/bin/pip install "/src[gpu]"

FROM ${CUDA_IMAGE}
# gcc, libc6-dev and python3-dev: Triton (under vLLM and torch.compile) builds its launchers at first use.
# tini runs as PID 1 and forwards SIGTERM to the worker only (not its process group): the worker
# drains and then stops its own vLLM engine processes. libespeak-ng1: the word aligner's reference
# reading (docs/alignment.md; without it a start asking for timings gets alignment_unavailable).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-dev gcc libc6-dev libsndfile1 libespeak-ng1 tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 voicering \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/voicering voicering \
 && mkdir -p /srv/voicering/voices /home/voicering/.cache/huggingface /home/voicering/.cache/compile \
 && chown -R voicering:voicering /srv/voicering /home/voicering
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
    VOICERING_WORKER_HOST=0.0.0.0 \
    VOICERING_WORKER_PORT=8765 \
    VOICERING_WORKER_VOICES_DIR=/srv/voicering/voices
USER 10001:10001
WORKDIR /home/voicering
EXPOSE 8765
# Real weights load (and compile) for minutes on first start: the start period covers a hub download.
HEALTHCHECK --interval=15s --timeout=5s --start-period=900s --retries=3 CMD ["python", "/opt/voicering/healthcheck.py", "worker"]
ENTRYPOINT ["tini", "--"]
CMD ["voicering", "worker"]
