"""The torch peer for `nx bench kernels`' matmul rows: PyTorch on CPU, as JSON on one line.

Usage: python benches/torch_matmul.py EDGE REPEATS THREADS
Times, with torch.set_num_threads(THREADS), an EDGE³ matmul in f32 and in bf16 (torch's CPU bf16
matmul: oneDNN's AVX-512 BF16 or AMX kernels where the CPU has them), each the median of REPEATS
runs after one warm-up, and prints their GFLOP/s.
"""
import json
import statistics
import sys
import time

import torch

edge, repeats, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
torch.manual_seed(0)
out = {"torch": torch.__version__, "threads": torch.get_num_threads()}
for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
    a = torch.randn(edge, edge).to(dtype)
    b = torch.randn(edge, edge).to(dtype)
    c = torch.empty(edge, edge, dtype=dtype)
    torch.matmul(a, b, out=c)
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        torch.matmul(a, b, out=c)
        ts.append(time.perf_counter() - t)
    out[name] = 2 * edge**3 / statistics.median(ts) / 1e9
print(json.dumps(out))
