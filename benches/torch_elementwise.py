"""The torch peer for `nx bench kernels`' map and sum rows: PyTorch eager on CPU, JSON on one line.

Usage: python benches/torch_elementwise.py N COLS REPEATS THREADS
With torch.set_num_threads(THREADS), over arrays of N elements made as nx's are, times
`add` (f32, into a preallocated output), `add_bf16` (the same in bf16), `fused` (y = a*x + b by
`torch.addcmul`, then z = relu(y) by `torch.clamp_min`: torch's eager form of the chain), `sum` (all elements) and
`sum_rows` (the last axis of N/COLS rows of COLS). Each figure is the median of REPEATS runs,
each after an untimed read of an unrelated 64 MiB buffer (as nx's rows), in bytes read plus
written per second, with the byte counts nx's rows use.
"""
import json
import statistics
import sys
import time

import torch

n, cols, repeats, threads = (int(a) for a in sys.argv[1:5])
torch.set_num_threads(threads)
i = torch.arange(n)
x = (i % 1000).float() * 1e-3
y = (i % 777).float() * 1e-3
b = (i % 333).float() * -1e-3
out, out2 = torch.empty(n), torch.empty(n)
hx, hy = x.bfloat16(), y.bfloat16()
ho = torch.empty(n, dtype=torch.bfloat16)
rows = x.view(n // cols, cols)
scrub = torch.ones(1 << 24)


def clean():
    scrub.sum()


cases = {
    "add": (3 * n * 4, lambda: torch.add(x, y, out=out)),
    "add_bf16": (3 * n * 2, lambda: torch.add(hx, hy, out=ho)),
    "fused": (5 * n * 4, lambda: (torch.addcmul(b, x, y, out=out), torch.clamp_min(out, 0.0, out=out2))),
    "sum": (n * 4, lambda: x.sum()),
    "sum_rows": (n * 4, lambda: rows.sum(dim=1)),
}
res = {"torch": torch.__version__, "threads": torch.get_num_threads()}
for name, (nbytes, f) in cases.items():
    f()
    ts = []
    for _ in range(repeats):
        clean()
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    res[name] = nbytes / statistics.median(ts) / 1e9
print(json.dumps(res))
