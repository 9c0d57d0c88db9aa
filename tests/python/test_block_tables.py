"""Engine.create_block_table / submit_blocks against a second process over tcp and shm: pages
named once, moved by index in any order, every byte checked; bad input refused with a reason."""

from array import array

import numpy as np
import pytest

import ferry_te as ferry
from conftest import sha256

SIZE = 1 << 20
BLOCK = 4096
N = SIZE // BLOCK  # 256 blocks a side


def test_blocks_by_index_two_processes(protocol, make_peer):
    peer = make_peer(protocol, SIZE, buffers=1, seed=31)
    remote = peer.addresses[0]
    with ferry.Engine(plugins=protocol) as engine:
        local = np.zeros(SIZE, np.uint8)
        region = engine.register(local)
        seg = engine.open_segment(peer.session)
        offs = np.arange(0, SIZE, BLOCK, dtype=np.uint64)
        with engine.create_block_table(offs, BLOCK, base=region) as lt, \
                engine.create_block_table(offs + remote, BLOCK, segment=seg) as rt:
            assert len(lt) == N and len(rt) == N
            # READ remote block (7 i mod N) into local block i: uint32 numpy indices.
            li = np.arange(N, dtype=np.uint32)
            ri = (li * 7) % N
            for _ in range(2):  # as ops, then (where the transport has block lists) whole
                local[:] = 0
                with engine.submit_blocks(ferry.READ, lt, li, rt, ri) as batch:
                    batch.wait()
                    assert batch.count == N
                    assert all(s.state == "done" for s in batch.statuses)
                want = peer.expected(0).reshape(N, BLOCK)[ri.astype(np.int64)].reshape(-1)
                assert sha256(local) == sha256(want)
            # WRITE every block back where it came from: lists and array('I').
            engine.submit_blocks("write", lt, list(range(N)), rt, array("I", ri.tolist())).wait()
            assert peer.ask("sha256 0") == sha256(peer.expected(0))


def test_block_tables_refuse_bad_input(protocol, make_peer):
    peer = make_peer(protocol, SIZE, buffers=1, seed=32)
    remote = peer.addresses[0]
    with ferry.Engine(plugins=protocol) as engine:
        local = np.zeros(SIZE, np.uint8)
        region = engine.register(local)
        seg = engine.open_segment(peer.session)
        lt = engine.create_block_table([0, BLOCK], [BLOCK, 2 * BLOCK], base=region)
        rt = engine.create_block_table([remote, remote + BLOCK], BLOCK, segment=seg)
        with pytest.raises(ferry.InvalidArgument, match="past the table"):
            engine.submit_blocks(ferry.READ, lt, [0], rt, [2])
        with pytest.raises(ferry.InvalidArgument, match="equal blocks"):
            engine.submit_blocks(ferry.READ, lt, [1], rt, [0])
        with pytest.raises(ferry.InvalidArgument, match="one of each per pair"):
            engine.submit_blocks(ferry.READ, lt, [0, 0], rt, [0])
        with pytest.raises(ferry.InvalidArgument, match="not a block table of an open segment"):
            engine.submit_blocks(ferry.READ, lt, [0], lt, [0])
        with pytest.raises(ferry.InvalidArgument, match="op must be"):
            engine.submit_blocks("copy", lt, [0], rt, [0])
        # Outside any registered memory, on either side.
        with pytest.raises(ferry.BadAddress, match="not inside one registered region"):
            engine.create_block_table([SIZE], BLOCK, base=region)
        with pytest.raises(ferry.BadAddress, match="not inside one region that segment"):
            engine.create_block_table([remote + SIZE], BLOCK, segment=seg)
        with pytest.raises(ferry.InvalidArgument, match="give one length per block"):
            engine.create_block_table([0, BLOCK, 2 * BLOCK], [BLOCK, BLOCK], base=region)
        with pytest.raises(ferry.InvalidArgument, match="integers >= 0"):
            engine.create_block_table([-1], BLOCK)
        rt.destroy()
        with pytest.raises(ferry.InvalidArgument, match="not destroyed"):
            engine.submit_blocks(ferry.READ, lt, [0], rt, [0])
        lt.destroy()
        lt.destroy()  # a second destroy does nothing
