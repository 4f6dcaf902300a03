"""Generates fp8_conformance.txt, the independent table the fp8 tests read: numpy's ml_dtypes
(float8_e4m3fn, float8_e5m2) decoding every bit pattern and encoding (a cast from float32, round
to nearest even, overflow to NaN or infinity) every finite value, every midpoint between
neighbours (ties), a float32 step either side of each midpoint, values past the largest, float32
subnormals, signed zeros, infinities and NaNs; and PyTorch's cast to float8_e4m3fn (which
saturates: past 448, infinities too, to ±448) of the same values.

Usage: python gen_fp8.py > fp8_conformance.txt   (ml_dtypes 0.7, numpy 2, torch 2.15)
Lines: `FORMAT decode BYTE F32BITS` and `FORMAT encode F32BITS BYTE`, hexadecimal; FORMAT
`e4m3sat` for torch's saturating cast.
"""
import ml_dtypes
import numpy as np
import torch

for name, dt in (("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)):
    allb = np.arange(256, dtype=np.uint8)
    vals = allb.view(dt).astype(np.float32)
    for b, v in zip(allb, vals):
        print(f"{name} decode {b:02x} {v.view(np.uint32):08x}")
    pos = np.unique(vals[np.isfinite(vals) & (vals >= 0)].astype(np.float64))
    mids = (pos[:-1] + pos[1:]) / 2
    top = pos[-1]
    step = pos[-1] - pos[-2]
    extra = np.array([top + step / 2, top + step, top * 2, 1e9, 3e38, 1e-30, 1e-45, 2.0**-126, 2.0**-149])
    xs = np.concatenate([pos, mids, extra]).astype(np.float32)
    xs = np.concatenate([xs, np.nextafter(xs, np.float32(np.inf)), np.nextafter(xs, np.float32(0))])
    xs = np.concatenate([xs, -xs, np.array([np.inf, -np.inf, np.nan, -np.nan], np.float32)])
    xs = np.unique(xs.view(np.uint32)).view(np.float32)
    enc = xs.astype(dt).view(np.uint8)
    for x, b in zip(xs, enc):
        print(f"{name} encode {x.view(np.uint32):08x} {b:02x}")
    if name == "e4m3":
        sat = torch.from_numpy(xs.copy()).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        for x, b in zip(xs, sat):
            print(f"e4m3sat encode {x.view(np.uint32):08x} {b:02x}")
