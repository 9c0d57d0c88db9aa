"""Engine.submit_on_stream and submit_arrays_on_stream (ferry_submit_on_stream) against the strict
fake CUDA driver of tests/gpu_fake (FERRY_TEST_FAKE_LIBCUDA names it; the engine loads it through
FERRY_LIBCUDA): a slow async copy into (fake) device memory on a stream, then a WRITE ordered after
it on that stream to a target engine over tcp.so: the target receives what the copy wrote."""

import time

import numpy as np
import pytest

import ferry_te as ferry
from conftest import pattern
from fake_cuda import cuda  # noqa: F401,F811 (the fixture)

SIZE = 1 << 20

class TorchLikeStream:
    """What torch.cuda.Stream offers submit_on_stream: .cuda_stream."""

    def __init__(self, handle):
        self.cuda_stream = handle


def test_a_write_on_a_stream_sends_what_the_copy_before_it_wrote(cuda):
    with ferry.Engine(plugins="tcp", local_ip="127.0.0.1") as target, \
            ferry.Engine(plugins="tcp", local_ip="127.0.0.1") as engine:
        remote = np.zeros(SIZE, np.uint8)
        target.register(remote)
        dev = cuda.alloc(SIZE)
        engine.register((dev, SIZE, "cuda:0"))
        seg = engine.open_segment(target.segment_name)
        cuda.put(dev, np.full(SIZE, 0xa1, np.uint8))
        copied = pattern(SIZE, 5)
        stream = cuda.stream()
        cuda.lib.ferry_fake_cuda_delay_next_copy_us(300000)
        cuda.put_async(dev, copied, stream)
        t0 = time.monotonic()
        batch = engine.submit_on_stream([(ferry.WRITE, dev, seg, remote.ctypes.data, SIZE)], stream)
        took = time.monotonic() - t0
        assert took < 0.25, "submit_on_stream waited %.0f ms for the stream" % (took * 1000)
        with pytest.raises(ferry.Busy):
            batch.free()  # the stream has not reached it
        batch.wait(60)
        assert time.monotonic() - t0 >= 0.3, "the batch ended before the copy ahead of it"
        assert (remote == copied).all(), "the target holds what the copy before the call wrote"
        batch.free()

        # The arrays form, detached (Mooncake's calls return nothing), on a torch-like stream.
        again = pattern(SIZE, 6)
        cuda.lib.ferry_fake_cuda_delay_next_copy_us(100000)
        cuda.put_async(dev, again, stream)
        assert engine.submit_arrays_on_stream(ferry.WRITE, seg, [dev], [remote.ctypes.data], SIZE,
                                              TorchLikeStream(stream), detach=True) is None
        cuda.sync(stream)  # the stream passed the batch: it ended
        assert (remote == again).all()

        # Refused at the call: memory this engine never registered.
        loose = np.zeros(4096, np.uint8)
        with pytest.raises(ferry.BadAddress) as e:
            engine.submit_on_stream([(ferry.READ, loose.ctypes.data, seg, remote.ctypes.data, 4096)], stream)
        assert "register the buffer first" in e.value.message, e.value.message
        with pytest.raises(ferry.InvalidArgument):
            engine.submit_on_stream([(ferry.READ, dev, seg, remote.ctypes.data, 4096)], "not a stream")
        cuda.lib.cuStreamDestroy_v2(stream)


def test_a_failure_is_raised_by_the_batch_and_the_stream_goes_on(cuda):
    with ferry.Engine(plugins="tcp", local_ip="127.0.0.1") as target, \
            ferry.Engine(plugins="tcp", local_ip="127.0.0.1") as engine:
        remote = np.zeros(SIZE, np.uint8)
        target.register(remote)
        dev = cuda.alloc(SIZE)
        engine.register((dev, SIZE, "cuda:0"))
        seg = engine.open_segment(target.segment_name)
        stream = cuda.stream()
        # Past the target's buffer: the engine finds out by re-reading its descriptor.
        batch = engine.submit_on_stream([(ferry.WRITE, dev, seg, remote.ctypes.data + SIZE, 4096)],
                                        TorchLikeStream(stream))
        with pytest.raises(ferry.BadAddress) as e:
            batch.wait(60)
        assert "is not inside one region" in e.value.message, e.value.message
        assert batch.statuses[0].state == "failed"
        batch.free()
        cuda.sync(stream)
        cuda.lib.cuStreamDestroy_v2(stream)
