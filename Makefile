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
