#!/usr/bin/env bash
# Runs `nx bench kernels`: the host kernels against the copy bandwidth and against numpy's matmul,
# both measured in the same run (the nx binary calls benches/numpy_matmul.py between its own
# matmuls). Installs numpy and threadpoolctl for the peer figure where missing.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import numpy, threadpoolctl" 2>/dev/null || python3 -m pip install -q numpy threadpoolctl
cargo build --release -q -p nx-launcher
exec target/release/nx bench kernels "$@"
