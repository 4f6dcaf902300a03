"""The peers for `nx bench kernels`' numeric rows, as JSON on one line: numpy (`np.fft.fft`,
pocketfft on one thread; `np.linalg.cholesky` and `svd`, LAPACK on THREADS threads through
threadpoolctl) and, where torch is importable, torch (`torch.fft.fft`, `torch.linalg.cholesky`,
`torch.linalg.svd`) on THREADS threads; and a grouped matmul as a user writes one in either
(a matmul per expert of the rows its ids select, written back to those rows).

Usage: python benches/peer_numeric.py REPEATS THREADS
Times a transform of 2^20 complex64 points, 1024 transforms of 1024 points (along the rows of a
1024 x 1024 complex64 array), standard normal inputs, the Cholesky factor of a 1024 x 1024 f64
positive definite matrix (M M^T + 1024 I) and the SVD (values and vectors) of M, 4096 float32
tokens of 1024 against 8 experts of 1024 x 1024 by uniform ids; prints the
median seconds of REPEATS runs after one warm-up, per case and peer.
"""
import json
import statistics
import sys
import time

import numpy as np

repeats, threads = int(sys.argv[1]), int(sys.argv[2])


def timed(f):
    f()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


rng = np.random.default_rng(0)
x = (rng.standard_normal(1 << 20) + 1j * rng.standard_normal(1 << 20)).astype(np.complex64)
y = (rng.standard_normal((1024, 1024)) + 1j * rng.standard_normal((1024, 1024))).astype(np.complex64)
assert np.fft.fft(x[:8]).dtype == np.complex64, "numpy computes complex64 in its own precision"
m = rng.standard_normal((1024, 1024))
spd = m @ m.T + 1024 * np.eye(1024)
xt = rng.standard_normal((4096, 1024), dtype=np.float32)
we = rng.standard_normal((8, 1024, 1024), dtype=np.float32)
ids = rng.integers(0, 8, 4096)


def grouped_np():
    out = np.zeros((4096, 1024), np.float32)
    for e in range(8):
        sel = np.nonzero(ids == e)[0]
        out[sel] = xt[sel] @ we[e]
    return out

try:
    from threadpoolctl import threadpool_limits

    limits = threadpool_limits(threads)  # numpy's LAPACK on THREADS threads, as nx and torch
except ImportError:
    limits = None
out = {
    "numpy": np.__version__,
    "fft": timed(lambda: np.fft.fft(x)),
    "fft_batched": timed(lambda: np.fft.fft(y, axis=1)),
    "cholesky": timed(lambda: np.linalg.cholesky(spd)),
    "svd": timed(lambda: np.linalg.svd(m)),
    "grouped_matmul": timed(grouped_np),
}
try:
    import torch

    torch.set_num_threads(threads)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    out["torch"] = torch.__version__
    out["torch_threads"] = torch.get_num_threads()
    out["torch_fft"] = timed(lambda: torch.fft.fft(tx))
    out["torch_fft_batched"] = timed(lambda: torch.fft.fft(ty, dim=1))
    ts = torch.from_numpy(spd)
    out["torch_cholesky"] = timed(lambda: torch.linalg.cholesky(ts))
    tm = torch.from_numpy(m)
    out["torch_svd"] = timed(lambda: torch.linalg.svd(tm))
    tx_, tw, tid = torch.from_numpy(xt), torch.from_numpy(we), torch.from_numpy(ids)

    def grouped_torch():
        o = torch.zeros(4096, 1024)
        for e in range(8):
            sel = (tid == e).nonzero().squeeze(1)
            o.index_copy_(0, sel, tx_.index_select(0, sel) @ tw[e])
        return o

    out["torch_grouped_matmul"] = timed(grouped_torch)
except ImportError:
    pass
print(json.dumps(out))
