"""The peer for `nx bench kernels`' indexing rows: PyTorch on CPU, as JSON on one line.

Usage: python benches/torch_indexing.py SCALE REPEATS THREADS
Times, with torch.set_num_threads(THREADS), each case at the sizes nx times (scaled by SCALE, as
nx scales them): index_select, index_add_ (into zeros, the zeroing included), cumsum, a stable
sort with indices, topk, causal scaled_dot_product_attention, and its backward alone (the gradients
of q, k and v given the output's, the forward run once before). Prints the median seconds of
REPEATS runs after one warm-up, per case.
"""
import json
import statistics
import sys
import time

import torch

scale, repeats, threads = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
torch.manual_seed(0)


def n(x):
    return max(1, int(x * scale))


def timed(f):
    f()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


out = {"torch": torch.__version__, "threads": torch.get_num_threads()}
vocab, width, tokens = n(50_000), 1024, n(65_536)
table = torch.randn(vocab, width)
idx = (torch.arange(tokens) * 7919) % vocab
rows = torch.empty(tokens, width)
out["gather"] = timed(lambda: torch.index_select(table, 0, idx, out=rows))
grad = torch.zeros(vocab, width)
out["scatter_add"] = timed(lambda: grad.zero_().index_add_(0, idx, rows))
m = n(1 << 24)
x = torch.randn(m)
cs = torch.empty(m)
out["cumsum"] = timed(lambda: torch.cumsum(x, 0, out=cs))
out["sort"] = timed(lambda: torch.sort(x, stable=True))
y = torch.randn(n(512), 50_000)
out["topk"] = timed(lambda: torch.topk(y, 50, dim=1))
b, h, t, d = 4, 16, n(2048), 64
q, k, v = (torch.randn(b, h, t, d) for _ in range(3))
out["attention"] = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
go = torch.randn_like(o)
out["attention_grad"] = timed(lambda: torch.autograd.grad(o, (qg, kg, vg), go, retain_graph=True))
print(json.dumps(out))
