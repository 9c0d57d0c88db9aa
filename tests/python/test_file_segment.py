"""Storage segments from Python as a KV offload layer uses them: blocks of a registered numpy
buffer written to a file at chosen offsets in one submit_arrays, read back into another buffer,
byte-exact (and checked against the file itself); a READ past the end raises with the file's
name and -ENODATA."""

import errno

import numpy as np
import pytest

import ferry_te as ferry
from conftest import pattern, plugin_state

BLOCK = 4096
N = 256


def test_kv_blocks_to_a_file_and_back(tmp_path):
    ok, why = plugin_state("file")
    if not ok:
        print("SKIPPED: " + why)
        pytest.skip("SKIPPED: " + why)
    path = tmp_path / "kv.bin"
    with ferry.Engine(plugins="file", file__create=True) as engine:
        kv = pattern(N * BLOCK, 31)
        region = engine.register(kv)
        seg = engine.open_segment("file:%s" % path)
        # Block i goes to file slot N-1-i: offsets in the buffer, offsets in the file.
        src = np.arange(N, dtype=np.uint64) * BLOCK
        dst = (N - 1 - np.arange(N, dtype=np.uint64)) * BLOCK
        engine.submit_arrays(ferry.WRITE, seg, src, dst, BLOCK, local_base=region, remote_base=0).wait()
        on_disk = np.fromfile(path, dtype=np.uint8)
        assert on_disk.size == N * BLOCK
        assert (on_disk.reshape(N, BLOCK)[::-1].reshape(-1) == kv).all()

        back = np.zeros_like(kv)
        back_region = engine.register(back)
        engine.submit_arrays(ferry.READ, seg, src, dst, BLOCK, local_base=back_region, remote_base=0).wait()
        assert (back == kv).all()

        with pytest.raises(ferry.FerryError) as info:
            engine.read(back[:BLOCK], seg, N * BLOCK)
        assert info.value.code == -errno.ENODATA
        assert str(path) in info.value.message
