#!/usr/bin/env bash
# Runs examples/bench_gpt.rs: train_gpt's training step on one device, on the 2×2 simulated mesh,
# and in PyTorch eager on CPU (2 threads), interleaved. Makes the torch virtual environment in
# ${NX_BENCH_CACHE:-~/.cache/nx}/torch where missing (as benches/kernels.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${NX_BENCH_CACHE:-$HOME/.cache/nx}/torch"
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q torch numpy safetensors
fi
exec cargo run --release -q --example bench_gpt -- --torch "$venv/bin/python" "$@"
