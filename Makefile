# Set-up and the two commands of the README. Each target builds .venv by itself when needed.
#
#   make test                     the whole test suite; prints its elapsed time last
#   make demo                     the plugin on examples/
#   make docs                     the documentation site (mkdocs, strict) into site/
#   make test USE_SYSTEM_TORCH=1  reuse the torch of the Python that builds the venv
#                                 (the venv is created with --system-site-packages)
#   make test PYTEST_ARGS="-k renderer -x"
#   make test TEST_WORKERS=2       xdist workers (default 3)
#   make vllm-check               the helpers on vLLM's own classes (examples/vllm) in a side
#                                 venv, .venv-vllm, with the vllm 0.33.0 wheel; not part of test
#   make vllm-suite               a CPU subset of vLLM 0.33.0's own tests (its sdist, in
#                                 .venv-vllm-suite) plain, warn and fail; outcomes, findings
#   make ray-check                the engine's DP ranks as Ray actors on a local two-node cluster
#                                 (tests/on_ray, examples/on_ray) in a side venv, .venv-ray; not in
#                                 test; in .ci/run after make test-pythons
#   make test-pythons             the guard's and the helpers' tests (tests/plugin, resources,
#                                 checks, interrupts, ownership) on Python 3.10, 3.12 and 3.13
#                                 (pyenv or PATH; one absent is skipped), each in a side venv,
#                                 .venv-py310 ...; pytest -n 2; in .ci/run after make test
#   make sglang-check             the checks on SGLang's own shutdown code (examples/sglang) in
#                                 a side venv, .venv-sglang, with the sglang 0.5.23 wheel; not
#                                 part of test
PYTHON ?= python3
VENV ?= .venv
USE_SYSTEM_TORCH ?= 0
CPU_TORCH ?= torch==2.13.0
PYTEST_ARGS ?=
# Three workers on two cores: much of the suite waits (deadlines, child processes), not computes.
TEST_WORKERS ?= 3

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test demo docs lint clean vllm-check vllm-suite ray-check sglang-check test-pythons

venv: $(STAMP)

$(STAMP): pyproject.toml scripts/setup-venv
	PYTHON="$(PYTHON)" VENV="$(VENV)" USE_SYSTEM_TORCH="$(USE_SYSTEM_TORCH)" CPU_TORCH="$(CPU_TORCH)" \
		bash scripts/setup-venv
	touch $(STAMP)

# Bytecode caching on for the suite even where the environment turns it off
# (PYTHONDONTWRITEBYTECODE): hundreds of the tests' pytest subprocesses would each compile the
# plugin's modules (and pytest its assertion rewrites) afresh.
# The elapsed time is printed last (the docs state none: it depends on the machine); the status
# is pytest's.
test: $(STAMP)
	@start=$$(date +%s); \
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -n $(TEST_WORKERS) -o console_output_style=count $(PYTEST_ARGS); \
	status=$$?; elapsed=$$(( $$(date +%s) - start )); \
	echo "make test: $$(( elapsed / 60 )) min $$(( elapsed % 60 )) s elapsed (pytest -n $(TEST_WORKERS), exit $$status)"; \
	exit $$status

demo: $(STAMP)
	$(BIN)/python -m pytest -p shutdown examples/ -v $(PYTEST_ARGS)

# NO_MKDOCS_2_WARNING: mkdocs-material's banner about its end of life, at every build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir site

test-pythons:
	CPU_TORCH="$(CPU_TORCH)" PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/test-pythons

vllm-check:
	PYTHON="$(PYTHON)" CPU_TORCH="$(CPU_TORCH)" PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/vllm-check

vllm-suite:
	PYTHON="$(PYTHON)" CPU_TORCH="$(CPU_TORCH)" PYTEST_ARGS="$(PYTEST_ARGS)" $(PYTHON) scripts/vllm-suite

ray-check:
	PYTHON="$(PYTHON)" CPU_TORCH="$(CPU_TORCH)" PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/ray-check

sglang-check:
	PYTHON="$(PYTHON)" CPU_TORCH="$(CPU_TORCH)" PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/sglang-check

# The size check (radon: no function over complexity 25, no class over 400 lines) is a test.
lint: $(STAMP)
	$(BIN)/ruff check pytest_shutdown tests examples
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:randomly tests/test_complexity.py

clean:
	rm -rf $(VENV) .venv-py310 .venv-py312 .venv-py313 .venv-vllm .venv-ray .venv-sglang .venv-third-party site .pytest_cache .mypy_cache .ruff_cache
