"""DLPack between nx (through libnx_capi's C ABI, by ctypes) and NumPy / PyTorch, in one process.

Run by tests/python.rs as `python dlpack.py LIB`; prints one line per library checked and ends
with "dlpack: all checks passed". Without torch, only NumPy is checked (and it says so).
"""
import ctypes
import gc
import math
import sys
import weakref

import numpy as np

try:
    import torch
except ImportError:
    torch = None

lib = ctypes.CDLL(sys.argv[1])
P, I, SZ, D = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_double
lib.nx_array_f32.restype, lib.nx_array_f32.argtypes = P, [SZ, SZ]
lib.nx_array_drop.argtypes = [P]
lib.nx_view.restype, lib.nx_view.argtypes = P, [P, I]
lib.nx_get.restype, lib.nx_get.argtypes = I, [P, ctypes.POINTER(SZ), SZ, ctypes.POINTER(D), ctypes.c_char_p, SZ]
lib.nx_set.restype, lib.nx_set.argtypes = I, [P, ctypes.POINTER(SZ), SZ, D, ctypes.c_char_p, SZ]
lib.nx_dtype.argtypes = [P, ctypes.c_char_p, SZ]
lib.nx_free.restype, lib.nx_free.argtypes = I, [P, ctypes.c_char_p, SZ]
lib.nx_export.restype, lib.nx_export.argtypes = P, [P, I, I, ctypes.c_char_p, SZ]
lib.nx_address.restype, lib.nx_address.argtypes = SZ, [P]
lib.nx_import.restype, lib.nx_import.argtypes = P, [P, I, ctypes.c_char_p, SZ]
lib.nx_delete.argtypes = [P, I]

api = ctypes.pythonapi
api.PyCapsule_New.restype, api.PyCapsule_New.argtypes = ctypes.py_object, [P, ctypes.c_char_p, P]
api.PyCapsule_GetPointer.restype, api.PyCapsule_GetPointer.argtypes = P, [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_IsValid.restype, api.PyCapsule_IsValid.argtypes = I, [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.restype, api.PyCapsule_SetName.argtypes = I, [ctypes.py_object, ctypes.c_char_p]
# the destructor sees a capsule being freed: raw pointers only, no reference counting
raw_valid = ctypes.PYFUNCTYPE(I, P, ctypes.c_char_p)(("PyCapsule_IsValid", api))
raw_pointer = ctypes.PYFUNCTYPE(P, P, ctypes.c_char_p)(("PyCapsule_GetPointer", api))
VERSIONED, LEGACY = b"dltensor_versioned", b"dltensor"
# a capsule keeps a pointer to its name: the names it is renamed to live as long as the module
USED = {VERSIONED: b"used_dltensor_versioned", LEGACY: b"used_dltensor"}
DESTRUCTOR = ctypes.CFUNCTYPE(None, P)


@DESTRUCTOR
def destroy_versioned(cap):
    # a capsule no consumer took (its name unchanged): the tensor is still ours to delete
    if raw_valid(cap, VERSIONED):
        lib.nx_delete(raw_pointer(cap, VERSIONED), 1)


@DESTRUCTOR
def destroy_legacy(cap):
    if raw_valid(cap, LEGACY):
        lib.nx_delete(raw_pointer(cap, LEGACY), 0)


def err():
    return ctypes.create_string_buffer(1024)


class Nx:
    """An nx array handle, with the DLPack protocol's two methods."""

    def __init__(self, h, writable=False):
        assert h, "a null handle"
        self.h, self.writable = h, writable

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        versioned = max_version is not None and max_version[0] >= 1
        e = err()
        p = lib.nx_export(self.h, int(self.writable), int(versioned), e, 1024)
        if not p:
            raise BufferError(e.value.decode())
        if versioned:
            return api.PyCapsule_New(p, VERSIONED, ctypes.cast(destroy_versioned, P))
        return api.PyCapsule_New(p, LEGACY, ctypes.cast(destroy_legacy, P))

    def __dlpack_device__(self):
        return (1, 0)

    def get(self, *idx):
        out, e = D(), err()
        ix = (SZ * len(idx))(*idx)
        if lib.nx_get(self.h, ix, len(idx), ctypes.byref(out), e, 1024) != 0:
            raise RuntimeError(e.value.decode())
        return out.value

    def set(self, v, *idx):
        e = err()
        ix = (SZ * len(idx))(*idx)
        if lib.nx_set(self.h, ix, len(idx), v, e, 1024) != 0:
            raise RuntimeError(e.value.decode())

    def dtype(self):
        e = err()
        lib.nx_dtype(self.h, e, 1024)
        return e.value.decode()

    def view(self, kind):
        return Nx(lib.nx_view(self.h, kind), self.writable)

    def free(self):
        e = err()
        assert lib.nx_free(self.h, e, 1024) == 0, e.value.decode()

    def __del__(self):
        lib.nx_array_drop(self.h)


def nx_array(rows, cols, writable=False):
    return Nx(lib.nx_array_f32(rows, cols), writable)


def take(obj):
    """nx imports `obj` (a NumPy array or torch tensor) by its own __dlpack__."""
    try:
        cap = obj.__dlpack__(max_version=(1, 0))
    except TypeError:
        cap = obj.__dlpack__()
    versioned = api.PyCapsule_IsValid(cap, VERSIONED) == 1
    name = VERSIONED if versioned else LEGACY
    p = api.PyCapsule_GetPointer(cap, name)
    api.PyCapsule_SetName(cap, USED[name])  # consumed: its destructor leaves it alone
    e = err()
    h = lib.nx_import(p, int(versioned), e, 1024)
    if not h:
        raise BufferError(e.value.decode())
    return Nx(h, True)


def refused(f, *words):
    try:
        f()
    except (BufferError, RuntimeError) as e:
        text = str(e)
        assert all(w in text for w in words), f"{text!r} lacks {words}"
        return text
    raise AssertionError(f"not refused: {words}")


def expected(rows, cols):
    return np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) + 0.5


checks = 0


def check(cond, what):
    global checks
    assert cond, what
    checks += 1


def consumer_suite(name, from_dlpack, to_numpy, writable_flag):
    """nx exports to a consumer: values, zero-copy, claims held until the consumer lets go."""
    a = nx_array(3, 5)
    addr = lib.nx_address(a.h)
    x = from_dlpack(a)
    check(np.array_equal(to_numpy(x), expected(3, 5)), f"{name}: values of a read export")
    check(data_address(x) == addr, f"{name}: a read export shares nx's memory")
    if writable_flag is not None:
        check(not writable_flag(x), f"{name}: a read export is read-only")
    a.get(1, 1)  # nx may read while a reader holds it
    refused(lambda: a.set(9.0, 0, 0), "held exclusive")
    del x
    gc.collect()
    a.set(9.0, 0, 0)
    check(a.get(0, 0) == 9.0, f"{name}: nx writes once the consumer let go")

    w = nx_array(4, 3, writable=True)
    waddr = lib.nx_address(w.h)
    y = from_dlpack(w)
    check(data_address(y) == waddr, f"{name}: a write export shares nx's memory")
    y[1, 2] = 42.0
    refused(lambda: w.get(1, 2), "held exclusive")
    refused(lambda: from_dlpack(w), "held")
    del y
    gc.collect()
    check(w.get(1, 2) == 42.0, f"{name}: the consumer's write is seen by nx")
    # strided (transposed) windows go out with their strides
    t = nx_array(2, 3).view(2)
    z = from_dlpack(t)
    check(np.array_equal(to_numpy(z), expected(2, 3).T), f"{name}: a transposed window")
    del z
    # refusals, named
    refused(lambda: from_dlpack(nx_array(3, 2).view(1)), "negative", "axis 0")
    b = nx_array(2, 2, writable=True).view(3)
    refused(lambda: from_dlpack(b), "repeats elements")
    rb = nx_array(2, 2).view(3)
    check(np.array_equal(to_numpy(from_dlpack(rb)), np.broadcast_to(expected(2, 2)[0], (4, 2))), f"{name}: broadcast read")
    dead = nx_array(2, 2)
    dead.free()
    refused(lambda: from_dlpack(dead), "dead")
    print(f"dlpack: nx -> {name}: values, shared memory, claims, strides, refusals")


def data_address(x):
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0]
    return x.data_ptr()


def producer_suite(name, make, shares):
    """nx imports a producer's arrays: values, zero-copy both ways, lifetime, strides, dtypes."""
    x = make(np.arange(12, dtype=np.float32).reshape(3, 4))
    h = take(x)
    check(h.get(1, 2) == 6.0, f"{name}: an imported value")
    h.set(99.0, 1, 2)
    check(float(x[1, 2]) == 99.0, f"{name}: nx's write is seen by the producer")
    x[0, 0] = 5.0
    check(h.get(0, 0) == 5.0, f"{name}: the producer's write is seen by nx")
    s = take(x[:, 1::2])
    check(s.get(2, 1) == float(x[2, 3]), f"{name}: a strided view")
    if name == "numpy":
        ro = np.arange(4, dtype=np.float64)
        ro.flags.writeable = False
        r = take(ro)
        check(r.dtype() == "f64" and r.get(3) == 3.0, "numpy: a read-only float64 array")
        refused(lambda: r.set(1.0, 0), "read-only")
        # nx keeps the producer's memory alive after the producer's last reference
        base = np.arange(6, dtype=np.int64) * 7
        ref = weakref.ref(base)
        k = take(base)
        del base
        gc.collect()
        check(ref() is not None and k.get(5) == 35.0, "numpy: an import keeps its producer alive")
        del k
        gc.collect()
        check(ref() is None, "numpy: the producer is released when nx's last handle ends")
    else:
        check(take(torch.ones(3, dtype=torch.bfloat16)).dtype() == "bf16", "torch: bfloat16")
        check(take(torch.zeros(2, 2, dtype=torch.float64).t()).dtype() == "f64", "torch: float64")
        tt = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
        ht = take(tt)
        check(ht.get(2, 1) == 5.0, "torch: a transposed tensor")
        # a zero-size tensor
        check(take(torch.zeros(0, 3)).dtype() == "f32", "torch: an empty tensor")
        # the fp8s: DLPack codes 10 (float8_e4m3fn) and 12 (float8_e5m2), every pattern
        for tdt, short in ((torch.float8_e4m3fn, "f8e4m3"), (torch.float8_e5m2, "f8e5m2")):
            pats = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(tdt)
            h8 = take(pats)
            check(h8.dtype() == short, f"torch: {tdt} imports as {short}")
            ours = [h8.get(i) for i in range(256)]
            agree = all((math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(pats.float().tolist(), ours))
            check(agree, f"torch: every {tdt} pattern's value, read by nx")
            h8.set(-1.5, 7)
            check(float(pats[7].float()) == -1.5, f"torch: nx's write into a {tdt} is seen by torch")
            back = torch.from_dlpack(h8)
            check(back.dtype == tdt and back.data_ptr() == pats.data_ptr(), f"torch: nx exports a {tdt}, shared")
    print(f"dlpack: {name} -> nx: values, shared memory both ways, strides, dtypes, lifetime")


consumer_suite("numpy", np.from_dlpack, lambda x: x, lambda x: x.flags.writeable)
producer_suite("numpy", lambda a: a, True)
if torch is not None:
    consumer_suite("torch", torch.from_dlpack, lambda x: x.numpy(), None)
    producer_suite("torch", lambda a: torch.from_numpy(a.copy()), True)
    # the legacy capsule, through torch's own entry point
    legacy = nx_array(2, 2, writable=True)
    lt = torch.utils.dlpack.from_dlpack(legacy.__dlpack__())
    lt[0, 1] = -3.0
    del lt
    gc.collect()
    check(legacy.get(0, 1) == -3.0, "torch: a legacy capsule, written")
    print("dlpack: torch legacy capsule")
else:
    print("dlpack: no torch here: NumPy only")
print(f"dlpack: all checks passed ({checks} checks)")
