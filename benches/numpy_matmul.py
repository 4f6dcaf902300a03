"""The peer for `nx bench kernels`: numpy's (OpenBLAS) f32 matmul GFLOP/s, as JSON on one line.

Usage: python3 benches/numpy_matmul.py N REPEATS
Run by `nx bench kernels` itself, interleaved with its own matmuls, with OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE unset so that a current OpenBLAS picks its own kernel.
"""
import json
import statistics
import sys
import time

import numpy as np

n, repeats = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
a = rng.standard_normal((n, n), dtype=np.float32)
b = rng.standard_normal((n, n), dtype=np.float32)
c = np.empty((n, n), dtype=np.float32)
np.matmul(a, b, out=c)  # warm-up
times = []
for _ in range(repeats):
    t = time.perf_counter()
    np.matmul(a, b, out=c)
    times.append(time.perf_counter() - t)
info = {}
try:
    import threadpoolctl

    blas = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    if blas:
        info = {k: blas[0].get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
except ImportError:
    pass
print(json.dumps({"gflops": 2 * n**3 / statistics.median(times) / 1e9, "seconds": times, "blas": info, "numpy": np.__version__}))
