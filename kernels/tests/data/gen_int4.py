"""Generates int4_conformance.txt, the independent table the packed-dtype tests read: numpy's
ml_dtypes (int4, uint4) decoding every 4-bit pattern, casting integers -300..300 (two's
complement low bits kept: a wrap) and float32 values inside each range (truncation toward zero:
every tenth from the least to the greatest, their neighbours one float32 step away, and ±0).
Floats outside the range are left out: ml_dtypes leaves their cast unspecified (it gives 0),
where nx saturates as every nx float-to-integer conversion does.

Usage: python gen_int4.py > int4_conformance.txt   (ml_dtypes 0.7, numpy 2)
Lines: `FORMAT decode PATTERN VALUE`, `FORMAT int VALUE PATTERN`, `FORMAT float F32BITS PATTERN`
(PATTERN and F32BITS hexadecimal, VALUE decimal).
"""
import ml_dtypes
import numpy as np

for name, dt, lo, hi in (("int4", ml_dtypes.int4, -8, 7), ("uint4", ml_dtypes.uint4, 0, 15)):
    pats = np.arange(16, dtype=np.uint8)
    for p, v in zip(pats, pats.view(dt).astype(np.int64)):
        print(f"{name} decode {p:x} {v}")
    ints = np.arange(-300, 301, dtype=np.int64)
    for i, p in zip(ints, ints.astype(dt).view(np.uint8)):
        print(f"{name} int {i} {p & 0xF:x}")
    xs = np.arange(lo * 10, hi * 10 + 10, dtype=np.float64) / 10
    xs = xs[(xs > lo - 1) & (xs < hi + 1)].astype(np.float32)
    xs = np.concatenate([xs, np.nextafter(xs, np.float32(np.inf)), np.nextafter(xs, np.float32(-np.inf))])
    xs = np.concatenate([xs, np.array([0.0, -0.0], np.float32)])
    xs = xs[(xs > lo - 1) & (xs < hi + 1)]
    xs = np.unique(xs.view(np.uint32)).view(np.float32)
    for x, p in zip(xs, xs.astype(dt).view(np.uint8)):
        print(f"{name} float {x.view(np.uint32):08x} {p & 0xF:x}")
