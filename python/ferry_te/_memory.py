"""Turns what users hand to register()/read()/write() into (address, length, kind, device)."""

import sys

MEMORY_HOST = 0
MEMORY_CUDA = 1
MEMORY_ROCM = 2

_KIND_NAMES = {"cpu": MEMORY_HOST, "host": MEMORY_HOST, "cuda": MEMORY_CUDA,
               "rocm": MEMORY_ROCM, "hip": MEMORY_ROCM}


class Span:
    """A contiguous range of memory and what it is. `owner` keeps the memory alive; `keep`
    holds buffer exports (so, e.g., a registered bytearray cannot be resized)."""

    __slots__ = ("address", "length", "kind", "device", "readonly", "owner", "keep")

    def __init__(self, address, length, kind=MEMORY_HOST, device=-1, readonly=False, owner=None,
                 keep=None):
        self.address = int(address)
        self.length = int(length)
        self.kind = kind
        self.device = int(device)
        self.readonly = readonly
        self.owner = owner
        self.keep = keep

    def release(self, ffi):
        """Drops the buffer exports taken at registration (so e.g. an mmap can close)."""
        keep, self.keep = self.keep, None
        if keep:
            mv, cdata = keep
            try:
                ffi.release(cdata)
            except (AttributeError, ValueError):
                pass
            mv.release()

    def __repr__(self):
        return "Span(address=%#x, length=%d, kind=%d, device=%d)" % (
            self.address, self.length, self.kind, self.device)


def parse_kind(kind):
    """None, MEMORY_* or 'host'/'cpu'/'cuda'/'rocm'/'hip' -> None or MEMORY_*."""
    if kind is None or isinstance(kind, int):
        return kind
    value = _KIND_NAMES.get(str(kind).lower())
    if value is None:
        raise ValueError("memory kind %r: expected 'host', 'cuda' or 'rocm'" % (kind,))
    return value


def parse_device(device, kind=None):
    """(kind, ordinal) from None/-1/'cpu', 'cuda:1', ('rocm', 0), an int ordinal (CUDA unless
    kind says otherwise) or a torch.device."""
    kind = parse_kind(kind)
    if device is None or (isinstance(device, int) and device < 0):
        return (kind if kind is not None else MEMORY_HOST), -1
    if isinstance(device, int):
        return (kind if kind is not None else MEMORY_CUDA), device
    if isinstance(device, tuple) and len(device) == 2:
        k, ordinal = device
        return parse_device("%s:%d" % (k, ordinal if ordinal is not None else 0), kind)
    typ = getattr(device, "type", None)  # torch.device
    if typ is not None:
        k = _torch_kind(typ, kind)
        if k == MEMORY_HOST:
            return k, -1
        return k, device.index if device.index is not None else 0
    text = str(device).lower()
    name, _, ordinal = text.partition(":")
    if name not in _KIND_NAMES:
        raise ValueError("device %r: expected 'cpu', 'cuda:N', 'rocm:N' or an ordinal" % (device,))
    k = _KIND_NAMES[name] if kind is None else kind
    if k == MEMORY_HOST:
        return MEMORY_HOST, -1
    return k, int(ordinal) if ordinal else 0


def _torch_kind(device_type, kind=None):
    if kind is not None:
        return kind
    if device_type == "cpu":
        return MEMORY_HOST
    if device_type == "cuda":
        # PyTorch for ROCm calls HIP devices "cuda"; torch.version.hip tells them apart.
        torch = sys.modules.get("torch")
        hip = getattr(getattr(torch, "version", None), "hip", None) if torch else None
        return MEMORY_ROCM if hip else MEMORY_CUDA
    raise ValueError("tensors on device type %r cannot be registered (cpu or cuda only)" % device_type)


def _from_torch(obj, kind):
    if not obj.is_contiguous():
        raise ValueError("tensor is not contiguous; call .contiguous() first")
    length = obj.numel() * obj.element_size()
    dev = obj.device
    k = _torch_kind(dev.type, kind)
    ordinal = -1 if k == MEMORY_HOST else (dev.index if dev.index is not None else 0)
    return Span(obj.data_ptr(), length, k, ordinal, readonly=False, owner=obj)


def _from_cuda_array_interface(obj, cai, kind):
    address, readonly = cai["data"]
    shape = tuple(cai.get("shape", ()))
    typestr = cai["typestr"]
    itemsize = int(typestr[2:])
    strides = cai.get("strides")
    count = 1
    for n in shape:
        count *= n
    if strides is not None and count > 1:
        expect = itemsize
        for n, s in reversed(list(zip(shape, strides))):
            if n != 1 and s != expect:
                raise ValueError("__cuda_array_interface__ array is not C-contiguous")
            expect *= n
    ordinal = 0
    dev = getattr(obj, "device", None)
    if dev is not None:
        ordinal = getattr(dev, "id", None)  # cupy
        if ordinal is None:
            ordinal = getattr(dev, "index", None)  # torch-like
        if ordinal is None:
            ordinal = 0
    k = kind if kind is not None else MEMORY_CUDA
    return Span(address or 0, count * itemsize, k, int(ordinal), readonly=bool(readonly), owner=obj)


def _from_buffer(ffi, obj):
    mv = memoryview(obj)
    if not mv.c_contiguous:
        raise ValueError("buffer is not C-contiguous; register a contiguous copy (numpy: "
                         "np.ascontiguousarray)")
    mv = mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv
    length = mv.nbytes
    if length == 0:
        raise ValueError("buffer is empty")
    cdata = ffi.from_buffer(mv)
    address = int(ffi.cast("uintptr_t", cdata))
    return Span(address, length, MEMORY_HOST, -1, readonly=mv.readonly, owner=obj, keep=(mv, cdata))


def resolve(ffi, obj, device=None, kind=None):
    """Span for a buffer-protocol object, numpy array, torch tensor (data_ptr()), an object with
    __cuda_array_interface__, or a raw (address, length[, device]) tuple."""
    kind = parse_kind(kind)
    if isinstance(obj, tuple):
        if len(obj) not in (2, 3):
            raise ValueError("a raw region is (address, length) or (address, length, device)")
        address, length = int(obj[0]), int(obj[1])
        dev = obj[2] if len(obj) == 3 else device
        k, ordinal = parse_device(dev, kind)
        if address == 0 or length <= 0:
            raise ValueError("raw region needs a non-NULL address and a positive length")
        return Span(address, length, k, ordinal, readonly=False, owner=None)
    if isinstance(obj, Span):
        return obj
    if callable(getattr(obj, "data_ptr", None)) and hasattr(obj, "device") and \
            hasattr(obj, "element_size"):
        return _from_torch(obj, kind)
    cai = None
    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
    except (AttributeError, RuntimeError, TypeError):
        cai = None
    if cai is not None:
        return _from_cuda_array_interface(obj, cai, kind)
    try:
        return _from_buffer(ffi, obj)
    except TypeError:
        pass
    if callable(getattr(obj, "data_ptr", None)) and hasattr(obj, "nbytes"):
        k, ordinal = parse_device(device, kind)
        return Span(obj.data_ptr(), obj.nbytes, k, ordinal, owner=obj)
    raise TypeError(
        "cannot register %s: expected an object with the buffer protocol (bytearray, numpy "
        "array, memoryview, mmap), __cuda_array_interface__, data_ptr() (a torch tensor), or an "
        "(address, length[, device]) tuple" % type(obj).__name__)
