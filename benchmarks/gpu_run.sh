#!/usr/bin/env bash
# The prepared GPU run (docs/profiles-and-harness.md, "The GPU run"): op tables, decode steps
# and speculative rounds of simctl's decoder and of transformers, a small profile, and their
# composition, into one folder within an 8-minute budget.
#
#   bash benchmarks/gpu_run.sh --out gpu-run            # options: --device, --quick, --budget-s
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
exec "$PYTHON" benchmarks/gpu_run.py "$@"
