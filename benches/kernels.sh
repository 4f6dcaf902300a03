#!/usr/bin/env bash
# Runs `nx bench kernels`: the host kernels against the copy bandwidth, against numpy's matmul and
# against PyTorch on CPU for the indexing rows, all measured in the same run (the nx binary calls
# benches/numpy_matmul.py and benches/torch_indexing.py between its own runs). Installs numpy and
# threadpoolctl where missing, and torch (CPU use; PyPI's wheel) into a virtual environment this
# script keeps in ${NX_BENCH_CACHE:-~/.cache/nx}/torch.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import numpy, threadpoolctl" 2>/dev/null || python3 -m pip install -q numpy threadpoolctl
venv="${NX_BENCH_CACHE:-$HOME/.cache/nx}/torch"
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q torch numpy
fi
"$venv/bin/python" -c "import threadpoolctl" 2>/dev/null || "$venv/bin/pip" install -q threadpoolctl
cargo build --release -q -p nx-launcher
exec target/release/nx bench kernels --torch "$venv/bin/python" "$@"
