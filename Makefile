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
	# The fast engine compiled once, into simulator/model/_compiled/ (a wheel carries it too).
	$(BIN)/python -m simulator.model.precompile
	touch $(STAMP)

env: $(STAMP)

demo: $(STAMP)
	$(BIN)/simctl replay example -c design-notes

# -m "": every test, the slow, benchmark, examples and install ones too (plain `pytest` leaves
# them out: see addopts in pyproject.toml). The suite starts dozens of Python processes: with
# PYTHONDONTWRITEBYTECODE set (some CI images set it) each would compile simctl's sources and
# pytest would rewrite every test module again, so the run lets Python keep its bytecode.
test: lint
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -m ""

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
		--engine cuda-graph -o profiles/h100-sxm-qwen3-8b-qwen3-0.6b-cuda-graph.json --force \
		--describes 'Qwen3-8B with a Qwen3-0.6B draft (KV cache, lookahead 3, acceptance 0.7 assumed) on one H100-SXM under a vLLM / TensorRT-LLM-like engine, kernel times from NVIDIA'\''s TensorRT-LLM tables; a hypothetical upgrade of the users'\'' server, not measured' \
		--answers 'What a modern engine with a cached speculative decoder would give the users'\'' tasks on an H100; compare against another GPU only with a profile of the same model'
	$(BIN)/simctl profile --gpu h100-sxm --backend trtllm-1.3.0rc20 --model llama-3.1-8b \
		--engine cuda-graph -o profiles/h100-sxm-llama-3.1-8b-cuda-graph.json --force \
		--describes 'Llama-3.1-8B on one H100-SXM under a vLLM / TensorRT-LLM-like engine (CUDA graphs), kernel times from NVIDIA'\''s TensorRT-LLM tables: the model of the 42 measured TensorRT-LLM serving runs the composition is checked against' \
		--answers 'Capacity and cost of serving an 8B model on H100s (GPU counts, autoscaling, length buckets on production traces); not the users'\'' server'
	$(BIN)/python benchmarks/grounded_calibration.py --write-profiles --write-docs

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
