"""The strict fake CUDA driver of tests/gpu_fake through ctypes, for the Python tests of
stream-ordered submits (FERRY_TEST_FAKE_LIBCUDA names it; the engine loads it through
FERRY_LIBCUDA). Tests use the `cuda` fixture (conftest.py re-exports it)."""

import ctypes
import os

import pytest

FAKE = os.environ.get("FERRY_TEST_FAKE_LIBCUDA", "")


class FakeCuda:
    """The fake driver through ctypes: the same instance the engine dlopens (same path)."""

    def __init__(self, path):
        lib = self.lib = ctypes.CDLL(path)
        u64, vp, sz = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), sz]
        lib.cuMemcpyHtoD_v2.argtypes = [u64, vp, sz]
        lib.cuMemcpyDtoH_v2.argtypes = [vp, u64, sz]
        lib.cuMemcpyHtoDAsync_v2.argtypes = [u64, vp, sz, vp]
        lib.cuStreamCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_uint]
        lib.cuStreamSynchronize.argtypes = [vp]
        lib.cuStreamDestroy_v2.argtypes = [vp]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(vp), ctypes.c_int]
        lib.cuCtxPushCurrent_v2.argtypes = [vp]
        lib.ferry_fake_cuda_delay_next_copy_us.argtypes = [ctypes.c_uint]
        lib.ferry_fake_cuda_host_fn_violations.restype = u64
        ctx = vp()
        # A context current on this thread, as torch makes one.
        assert lib.cuInit(0) == 0 and lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
        assert lib.cuCtxPushCurrent_v2(ctx) == 0

    def alloc(self, n):
        p = ctypes.c_uint64()
        assert self.lib.cuMemAlloc_v2(ctypes.byref(p), n) == 0
        return p.value

    def put(self, dev, array):
        assert self.lib.cuMemcpyHtoD_v2(dev, array.ctypes.data, array.nbytes) == 0

    def get(self, dev, array):
        assert self.lib.cuMemcpyDtoH_v2(array.ctypes.data, dev, array.nbytes) == 0

    def put_async(self, dev, array, stream):
        assert self.lib.cuMemcpyHtoDAsync_v2(dev, array.ctypes.data, array.nbytes, stream) == 0

    def stream(self):
        s = ctypes.c_void_p()
        assert self.lib.cuStreamCreate(ctypes.byref(s), 1) == 0
        return s.value

    def sync(self, stream):
        assert self.lib.cuStreamSynchronize(stream) == 0


@pytest.fixture
def cuda(monkeypatch):
    if not FAKE or not os.path.exists(FAKE):
        why = "FERRY_TEST_FAKE_LIBCUDA does not name the fake CUDA driver (%r); run through meson" % FAKE
        print("SKIPPED: " + why)
        pytest.skip(why)
    # Read when an engine first needs the driver: these tests' engines get the fake.
    monkeypatch.setenv("FERRY_LIBCUDA", FAKE)
    fake = FakeCuda(FAKE)
    before = fake.lib.ferry_fake_cuda_host_fn_violations()
    yield fake
    assert fake.lib.ferry_fake_cuda_host_fn_violations() == before, "a host function made a CUDA call"
