# Two commands do everything on a fresh machine:
#   make demo   build the environment and replay the bundled trace through the users' design
#   make test   build the environment, run ruff and mypy, then the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint env bench notebooks docs profiles clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test,cluster,live,serve]"
	# The harness extra, CPU build: a plain `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	touch $(STAMP)

env: $(STAMP)

demo: $(STAMP)
	$(BIN)/simctl replay example -c design-notes

# -m "": every test, the slow, benchmark, examples and install ones too (plain `pytest` leaves
# them out: see addopts in pyproject.toml).
test: lint
	$(BIN)/python -m pytest -q -m ""

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy simulator

bench: $(STAMP)
	$(BIN)/python benchmarks/engine_speed.py --spec-decode --write-docs
	$(BIN)/python benchmarks/sweep_throughput.py --write-docs
	$(BIN)/python benchmarks/continuous_speed.py --write-docs

# Execute the notebooks in place (the suite checks the committed outputs are current).
notebooks: $(STAMP)
	$(BIN)/python notebooks/execute.py

# Rewrite the outputs of the README's and docs/' console examples from a fresh run.
docs: $(STAMP)
	$(BIN)/python docs/build.py

# Rewrite the composed profiles shipped in profiles/ (the A100 ones calibrate their engine
# costs on a real run: needs ../shared).
profiles: $(STAMP)
	$(BIN)/simctl profile --gpu h100-sxm --backend trtllm-1.3.0rc20 --model qwen3-8b --draft qwen3-0.6b \
		--engine cuda-graph -o profiles/h100-sxm-qwen3-8b-qwen3-0.6b-cuda-graph.json --force
	$(BIN)/simctl profile --gpu h100-sxm --backend trtllm-1.3.0rc20 --model llama-3.1-8b \
		--engine cuda-graph -o profiles/h100-sxm-llama-3.1-8b-cuda-graph.json --force
	$(BIN)/python benchmarks/grounded_calibration.py --write-profiles --write-docs

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
