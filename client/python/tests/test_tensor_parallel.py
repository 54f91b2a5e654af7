"""Mooncake's unified parallelism API (crescent.tensor_parallel) against a
real cluster, with numpy arrays (and torch tensors where torch is installed):
where each layout's shards land, reading a shard back exactly or rebuilt
from another layout, rebuilding the whole tensor, and refusals."""

import ctypes
import struct
import uuid
from dataclasses import dataclass

import numpy as np
import pytest

from crescent.store import ParallelAxis, ReadTarget, TensorParallelism
from crescent.tensor import Header

INVALID_PARAMS = -600

try:
    import torch
except ImportError:
    torch = None


def key(name):
    return f"{name}-{uuid.uuid4().hex[:8]}"


def grid(lib, rows, cols):
    a = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    return a if lib is np else torch.from_numpy(a)


def same(a, b):
    """Equal values, shape and dtype, and the same kind of array."""
    if b is None or type(a) is not type(b) or a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    return np.array_equal(np.asarray(a), np.asarray(b))


def axis(kind, rank=0, size=1, split_dim=None, expert_id=None, stage_id=None):
    a = ParallelAxis()
    a.kind, a.rank, a.size, a.split_dim, a.expert_id, a.stage_id = kind, rank, size, split_dim, expert_id, stage_id
    return a


def layout(*axes):
    p = TensorParallelism()
    p.axes = list(axes)
    return p


def target(mode, parallelism=None):
    t = ReadTarget()
    t.mode = mode
    t.parallelism = parallelism
    return t


@dataclass
class WriterPartition:
    rank: int
    size: int
    split_dim: int


def test_the_classes_behave_like_mooncakes():
    a = ParallelAxis()
    assert (a.kind, a.rank, a.size, a.split_dim, a.expert_id, a.stage_id) == ("", 0, 1, None, None, None)
    p = TensorParallelism()
    p.axes.append(axis("tp", split_dim=0))
    assert p.axes == [], "reading axes gives a copy"
    t = ReadTarget()
    assert t.mode == "as_stored" and t.parallelism is None
    t.mode = "FULL"
    assert t.mode == "full"
    with pytest.raises(RuntimeError):
        t.mode = "sideways"


def test_each_rank_writes_its_shard_and_any_layout_reads_it(lib, store):
    k = key("tp")
    whole = grid(lib, 4, 8)
    for rank in range(4):
        shard = whole[:, 2 * rank : 2 * rank + 2]
        p = layout(axis("tp", rank, 4, split_dim=1))
        assert store.put_tensor_with_parallelism(k, shard, p) == 0
        raw = store.get(f"{k}_tp_{rank}")
        h = Header(raw[:304], len(raw))
        assert h.global_shape == (4, 8) and h.local_shape == (4, 2)
    manifest = store.get(f"{k}__parallelism_manifest")
    # magic "NAMW", version 1, size 96, float32, 2 dims, split dim 1, 4
    # shards, then the global shape padded with -1.
    assert struct.unpack("<IHHiiiii4x8q", manifest) == (0x574D414E, 1, 96, 0, 2, 1, 4, 0, 4, 8, -1, -1, -1, -1, -1, -1)
    # Exact shard, a shard of a layout nobody wrote (2 ranks), and the whole.
    assert same(whole[:, 2:4], store.get_tensor_with_parallelism(k, target("shard", layout(axis("tp", 1, 4, 1)))))
    assert same(whole[:, 4:8], store.get_tensor_with_parallelism(k, target("shard", layout(axis("tp", 1, 2, 1)))))
    assert same(whole, store.get_tensor_with_parallelism(k, target("full", layout(axis("tp", 0, 2, 1)))))
    # The legacy reader finds the same keys.
    assert same(whole[:, 6:8], store.get_tensor_with_tp(k, tp_rank=3, tp_size=4))
    # as_stored with a layout is not a thing; without one it is the plain key.
    assert store.get_tensor_with_parallelism(k, target("as_stored", layout(axis("tp", 0, 4, 1)))) is None
    plain = key("plain")
    assert store.put_tensor_with_parallelism(plain, whole) == 0
    assert same(whole, store.get_tensor_with_parallelism(plain))


def test_several_axes_and_axes_without_tp(lib, store):
    k = key("multi")
    whole = grid(lib, 6, 4)
    p = layout(axis("tp", 1, 3, split_dim=0), axis("dp", 1, 2))
    assert store.put_tensor_with_parallelism(k, whole, p) == 0
    assert same(whole[2:4], store.get_tensor(f"{k}__dp_1of2__tp_1of3_sd0"))
    assert same(whole[2:4], store.get_tensor_with_parallelism(k, target("shard", p)))

    # An id on any axis is part of its key name.
    d = key("dp-id")
    p2 = layout(axis("tp", 0, 2, split_dim=0), axis("dp", 0, 2, expert_id=7))
    assert store.put_tensor_with_parallelism(d, whole, p2) == 0
    assert same(whole[:3], store.get_tensor(f"{d}__dp_0of2_eid7__tp_0of2_sd0"))

    e = key("ep")
    ep = layout(axis("ep", 0, 2, expert_id=11))
    assert store.put_tensor_with_parallelism(e, whole, ep) == 0
    assert same(whole, store.get_tensor(f"{e}__ep_0of2_eid11"))
    assert same(whole, store.get_tensor_with_parallelism(e, target("shard", ep)))


def test_writer_partitions_rebuild_the_whole(lib, store):
    k = key("writers")
    whole = grid(lib, 4, 6)
    for rank in range(3):
        assert store.put_tensor_with_parallelism(k, whole, writer_partition=WriterPartition(rank, 3, 1)) == 0
    assert same(whole[:, 2:4], store.get_tensor(f"{k}__writer_1of3_sd1"))
    assert same(whole, store.get_tensor_with_parallelism(k, target("full")))
    assert same(whole[:, 4:6], store.get_tensor_with_parallelism(k, target("shard", layout(axis("tp", 2, 3, 1)))))


def test_refusals(lib, store):
    whole = grid(lib, 4, 4)
    bad = [
        layout(axis("tp", 0, 2)),  # TP without split_dim
        layout(axis("dp", 0, 2, split_dim=0)),  # DP with one
        layout(axis("ep", 0, 2)),  # EP without expert_id
        layout(axis("tp", 2, 2, split_dim=0)),  # rank not below size
        layout(axis("tp", 0, 2, split_dim=0), axis("tp", 1, 2, split_dim=0)),  # a kind twice
        layout(axis("xp", 0, 1)),
        layout(),
    ]
    for p in bad:
        assert store.put_tensor_with_parallelism(key("bad"), whole, p) == INVALID_PARAMS
    uneven = layout(axis("tp", 0, 3, split_dim=0), axis("dp", 0, 2))
    assert store.put_tensor_with_parallelism(key("uneven"), whole, uneven) == INVALID_PARAMS
    both = store.put_tensor_with_parallelism(
        key("both"), whole, layout(axis("tp", 0, 2, split_dim=0)), writer_partition=WriterPartition(0, 2, 0)
    )
    assert both == INVALID_PARAMS
    keys = [key("b1"), key("b2")]
    assert store.batch_put_tensor_with_parallelism(keys, [whole, whole], [layout(axis("tp", 0, 2, split_dim=0))]) == [
        INVALID_PARAMS
    ] * 2
    assert store.get_tensor_with_parallelism(key("never-put"), target("full", layout(axis("tp", 0, 2, 0)))) is None
    # Shards that do not fit together rebuild nothing, without raising.
    k = key("misfit")
    assert store.put_tensor_with_parallelism(k, grid(lib, 2, 2), writer_partition=WriterPartition(0, 2, 1)) == 0
    assert store.put_tensor_with_parallelism(k, grid(lib, 4, 4), writer_partition=WriterPartition(1, 2, 1)) == 0
    assert store.get_tensor_with_parallelism(k, target("full")) is None
    # Axis fields that are not 32-bit ints are refused, not raised.
    assert store.put_tensor_with_parallelism(key("big"), whole, layout(axis("tp", 0, 2**40, split_dim=0))) == INVALID_PARAMS
    assert store.put_tensor_with_parallelism(key("str"), whole, layout(axis("ep", 0, 2, expert_id="x"))) == INVALID_PARAMS


def test_from_a_buffer_writes_every_rank_and_into_gets_the_whole(lib, store):
    src, k = key("src"), key("from")
    whole = grid(lib, 4, 4)
    assert store.put_tensor(src, whole) == 0
    size = store.get_size(src)
    buf = ctypes.create_string_buffer(2 * size)
    ptr = ctypes.addressof(buf)
    assert store.register_buffer(ptr, len(buf)) == 0
    try:
        assert store.get_into(src, ptr, size) == size
        # Without a layout the object is stored as it is, header and all.
        plain = key("plain")
        assert store.put_tensor_with_parallelism_from(plain, ptr, size) == 0
        assert store.get(plain) == store.get(src)
        p = layout(axis("tp", 0, 2, split_dim=0))
        assert store.put_tensor_with_parallelism_from(k, ptr, size, p) == 0
        assert same(whole[2:], store.get_tensor(f"{k}_tp_1"))
        buf2 = ctypes.create_string_buffer(size)
        ptr2 = ctypes.addressof(buf2)
        assert store.register_buffer(ptr2, len(buf2)) == 0
        got = store.get_tensor_with_parallelism_into(k, ptr2, size, target("full", p))
        assert same(whole, got)
        assert store.get_tensor_with_parallelism_into(k, ptr2, size - 1, target("full", p)) is None
        store.unregister_buffer(ptr2)
    finally:
        store.unregister_buffer(ptr)
