"""Mooncake's tensor calls (crescent.tensor) against a real cluster.

Every cluster test runs twice: returning numpy arrays (what a process
without torch gets) and, where torch is installed, torch tensors. The
header's layout is checked byte by byte against Mooncake's, so an object
written here reads the same in a Mooncake process and back.
"""

import ctypes
import struct
import uuid

import numpy as np
import pytest

import crescent.tensor as tensor_module
from crescent.store import MooncakeDistributedStore, _deserialize_tensor, _serialize_tensor, _tensor_metadata_size
from crescent.tensor import TENSOR_METADATA_SIZE, Header, TensorError, decode, encode

INVALID_PARAMS = -600
FILE_NOT_FOUND = -1100

try:
    import torch
except ImportError:
    torch = None


def key(name):
    return f"{name}-{uuid.uuid4().hex[:8]}"


def array(lib, values, dtype):
    if lib is np:
        return np.array(values, dtype=dtype)
    return torch.tensor(values, dtype=getattr(torch, dtype))


def same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return (
        torch is not None
        and isinstance(b, torch.Tensor)
        and a.dtype == b.dtype
        and tuple(a.shape) == tuple(b.shape)
        and torch.equal(a.cpu(), b)
    )


# -- the header, without a cluster ---------------------------------------


def test_the_header_is_mooncakes_byte_for_byte():
    head, data, nbytes, _ = encode(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert len(head) == TENSOR_METADATA_SIZE == _tensor_metadata_size() == 304
    assert head[:4] == b"NOOM"
    magic, version, size, dtype, ndim, layout = struct.unpack_from("<IHHiiI", head)
    assert (magic, version, size, dtype, ndim, layout) == (0x4D4F4F4E, 1, 304, 6, 2, 0)
    assert struct.unpack_from("<QQ", head, 24) == (304, 24)
    assert struct.unpack_from("<8q", head, 40) == (2, 3, -1, -1, -1, -1, -1, -1)
    assert struct.unpack_from("<8q", head, 104) == (2, 3, -1, -1, -1, -1, -1, -1)
    assert struct.unpack_from("<I", head, 168) == (0,)
    assert head[176:] == bytes(128)
    assert nbytes == 24 and bytes(data) == np.arange(6, dtype=np.int32).tobytes()


@pytest.mark.parametrize(
    "dtype,number",
    [("float32", 0), ("float64", 1), ("int8", 2), ("uint8", 3), ("int16", 4), ("uint16", 5),
     ("int32", 6), ("uint32", 7), ("int64", 8), ("uint64", 9), ("bool", 10), ("float16", 11)],
)
def test_dtype_numbers_are_mooncakes(dtype, number):
    head, *_ = encode(np.zeros(3, dtype=dtype))
    assert struct.unpack_from("<i", head, 8) == (number,)


def test_bad_headers_are_refused_by_name():
    head, data, _, _ = encode(np.arange(4, dtype=np.float32))
    good = bytearray(head + bytes(data))
    assert decode(good).tolist() == [0.0, 1.0, 2.0, 3.0]

    def broken(offset, fmt, value, total=None):
        b = bytearray(good)
        struct.pack_into(fmt, b, offset, value)
        with pytest.raises(TensorError):
            Header(bytes(b[:304]), len(b) if total is None else total)

    broken(0, "<I", 0x12345678)  # magic
    broken(4, "<H", 2)  # version
    broken(8, "<i", 15)  # dtype past Mooncake's last
    broken(12, "<i", 9)  # more dimensions than 8
    broken(32, "<Q", 12)  # data bytes disagree with the object
    broken(48, "<q", 5)  # a slot past ndim that is not -1
    broken(104, "<q", 5)  # local shape needs 20 bytes, data is 16
    with pytest.raises(TensorError):
        Header(bytes(good[:304]), len(good) + 1)
    with pytest.raises(TensorError):
        Header(bytes(100), 100)


def test_what_cannot_be_stored_is_a_tensor_error():
    with pytest.raises(TensorError):
        encode(b"bytes are not a tensor")
    with pytest.raises(TensorError):
        encode(np.zeros(2, dtype=np.complex64))
    with pytest.raises(TensorError):
        encode(np.zeros((1,) * 9, dtype=np.int8))
    with pytest.raises(TensorError):
        encode(np.zeros(2, dtype=">i4"))


def test_structured_object_store_helpers_round_trip():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    head, ptr, nbytes, owner = _serialize_tensor(a)
    assert nbytes == 96 and ptr != 0
    payload = head + ctypes.string_at(ptr, nbytes)
    back = _deserialize_tensor(payload)
    assert np.array_equal(np.asarray(back), a)
    with pytest.raises(ValueError):
        _deserialize_tensor(b"not a tensor object, far too short")
    with pytest.raises(ValueError):
        _serialize_tensor("not a tensor")


# -- against the cluster --------------------------------------------------


@pytest.mark.parametrize(
    "values,dtype",
    [
        ([1.5, -2.0, 3.25, 4.0], "float32"),
        ([[1, 2, 3], [4, 5, 6]], "int64"),
        ([True, False, True], "bool"),
        ([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], "uint16"),
        (7, "int32"),  # 0-d: its shape () comes back as ()
        ([], "float16"),  # no elements: 304 bytes
    ],
)
def test_put_get_round_trips_dtype_and_shape(lib, store, values, dtype):
    k = key("tensor")
    t = array(lib, values, dtype)
    assert store.put_tensor(k, t) == 0
    back = store.get_tensor(k)
    assert same(t, back), (t, back)
    nbytes = t.nbytes if lib is np else t.numel() * t.element_size()
    assert store.get_size(k) == TENSOR_METADATA_SIZE + nbytes
    store.remove(k)


def test_a_missing_key_or_plain_bytes_read_as_none(lib, store):
    k = key("plain")
    assert store.get_tensor(key("never-put")) is None
    assert store.put(k, b"x" * 400) == 0
    assert store.get_tensor(k) is None
    assert store.put_tensor(key("no"), "a string") == INVALID_PARAMS
    assert store.batch_get_tensor([k, key("never-put")]) == [None, None]


def test_batches_answer_per_key(lib, store):
    keys = [key("batch") for _ in range(3)]
    values = [array(lib, [i, i + 1], "int32") for i in range(3)]
    values[1] = "not a tensor"
    assert store.batch_put_tensor(keys, values) == [0, INVALID_PARAMS, 0]
    got = store.batch_get_tensor(keys)
    assert same(values[0], got[0]) and got[1] is None and same(values[2], got[2])
    assert store.batch_put_tensor(keys[:2], values[:1]) == [INVALID_PARAMS] * 2
    assert store.batch_put_tensor([], []) == []


def test_from_and_into_registered_buffers(lib, store):
    k, k_from = key("into"), key("from")
    t = array(lib, [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], "float64")
    assert store.put_tensor(k, t) == 0
    size = store.get_size(k)
    buf = ctypes.create_string_buffer(size + 64)
    ptr = ctypes.addressof(buf)
    assert store.register_buffer(ptr, len(buf)) == 0
    try:
        view = store.get_tensor_into(k, ptr, len(buf))
        assert same(t, view)
        # The result views the caller's buffer, after the header.
        if lib is np:
            assert view.ctypes.data == ptr + TENSOR_METADATA_SIZE
        else:
            assert view.data_ptr() == ptr + TENSOR_METADATA_SIZE
        assert store.get_tensor_into(k, ptr, size - 1) is None, "buffer smaller than the object"
        assert store.put_tensor_from(k_from, ptr, size) == 0
        assert same(t, store.get_tensor(k_from))
        assert store.put_tensor_from(key("short"), ptr, size + 8) == INVALID_PARAMS, "size must be exact"
        assert store.put_tensor_from(key("zero"), 0, size) == INVALID_PARAMS
        other = ctypes.create_string_buffer(size)
        optr = ctypes.addressof(other)
        assert store.register_buffer(optr, size) == 0
        got = store.batch_get_tensor_into([k, k_from, key("never-put")], [ptr, optr, ptr + size], [size, size, 64])
        store.unregister_buffer(optr)
        assert same(t, got[0]) and same(t, got[1]) and got[2] is None
        assert store.batch_get_tensor_into([k], [ptr, ptr], [len(buf)]) == [INVALID_PARAMS]
        assert store.batch_put_tensor_from([key("b1"), key("b2")], [ptr, ptr], [size, 8]) == [INVALID_PARAMS] * 2
    finally:
        store.unregister_buffer(ptr)
    # A buffer nobody registered is never read for its header.
    loose = ctypes.create_string_buffer(size)
    assert store.put_tensor_from(key("loose"), ctypes.addressof(loose), size) == INVALID_PARAMS


def test_tensor_parallel_shards(lib, store):
    k = key("tp")
    t = array(lib, [[r * 10 + c for c in range(6)] for r in range(4)], "int32")
    assert store.put_tensor_with_tp(k, t, tp_size=3, split_dim=1) == 0
    for rank in range(3):
        shard = store.get_tensor_with_tp(k, tp_rank=rank, tp_size=3)
        want = t[:, 2 * rank : 2 * rank + 2]
        assert same(want if lib is np else want.contiguous(), shard)
        raw = store.get(f"{k}_tp_{rank}")
        h = Header(raw[:304], len(raw))
        assert h.global_shape == (4, 6) and h.local_shape == (4, 2)
        # kind TP, axis 0, rank, count, split dim, no id, local extent.
        assert h.axes == [(1, 0, rank, 3, 1, 0, 2)]
    assert store.put_tensor_with_tp(key("uneven"), t, tp_size=4, split_dim=1) == INVALID_PARAMS
    assert store.put_tensor_with_tp(key("nodim"), t, tp_size=2, split_dim=2) == INVALID_PARAMS
    # tp_size 1 is the plain key.
    k1 = key("tp1")
    assert store.put_tensor_with_tp(k1, t) == 0 and same(t, store.get_tensor(k1))
    # From a registered buffer holding the whole tensor object.
    src, kf = key("tp-src"), key("tp-from")
    assert store.put_tensor(src, t) == 0
    size = store.get_size(src)
    buf = ctypes.create_string_buffer(size)
    ptr = ctypes.addressof(buf)
    assert store.register_buffer(ptr, size) == 0
    try:
        assert store.get_into(src, ptr, size) == size
        assert store.put_tensor_with_tp_from(kf, ptr, size, tp_size=2, split_dim=0) == 0
        assert same(t[2:] if lib is np else t[2:].contiguous(), store.get_tensor(f"{kf}_tp_1"))
        assert store.batch_put_tensor_with_tp_from([key("a"), key("b")], [ptr, ptr], [size, size - 1], tp_size=2) == [
            0,
            INVALID_PARAMS,
        ]
    finally:
        store.unregister_buffer(ptr)
    keys = [key("tpb"), key("tpb")]
    assert store.batch_put_tensor_with_tp(keys, [t, t[:3]], tp_size=2, split_dim=0) == [0, INVALID_PARAMS]
    assert same(t[2:], store.batch_get_tensor_with_tp(keys, tp_rank=1, tp_size=2)[0])


def test_a_store_not_set_up_answers_like_mooncake(lib, tmp_path):
    s = MooncakeDistributedStore()
    t = array(lib, [1, 2], "int8")
    assert s.put_tensor(key("x"), t) == INVALID_PARAMS
    assert s.get_tensor(key("x")) is None
    assert s.batch_put_tensor([key("x")], [t]) == [INVALID_PARAMS]
    assert s.put_tensor_with_tp(key("x"), t, tp_size=2) == INVALID_PARAMS
    assert s.batch_get_tensor_into([key("x")], [1], [8]) == [INVALID_PARAMS]
    assert s.save_tensor_to_safetensor(key("x"), str(tmp_path / "f")) == INVALID_PARAMS
    assert s.get_tensor_into_cuda(key("x"), t) == INVALID_PARAMS


# -- torch only -----------------------------------------------------------


def test_torch_only_dtypes_and_layouts(store):
    if torch is None:
        pytest.skip("torch is not installed")
    for dtype, number in ((torch.bfloat16, 12), (torch.float8_e4m3fn, 13), (torch.float8_e5m2, 14)):
        head = encode(torch.zeros(2, dtype=dtype))[0]
        assert struct.unpack_from("<i", head, 8) == (number,)
    # One tensor that cannot be stored fails its key only.
    keys = [key("ok"), key("sparse")]
    assert store.batch_put_tensor(keys, [torch.ones(2), torch.eye(2).to_sparse()]) == [0, INVALID_PARAMS]
    cases = [
        torch.randn(3, 5).to(torch.bfloat16),
        torch.randn(8).to(torch.float8_e4m3fn),
        torch.randn(8).to(torch.float8_e5m2),
        torch.arange(24, dtype=torch.float32).reshape(4, 6).t(),  # not contiguous
        torch.nn.Parameter(torch.ones(2, 2)),
    ]
    for t in cases:
        k = key("torch")
        assert store.put_tensor(k, t) == 0, t.dtype
        back = store.get_tensor(k)
        assert back.dtype == t.dtype and back.shape == t.shape
        assert torch.equal(back.view(torch.uint8), t.detach().contiguous().view(torch.uint8))
    # Without torch a bfloat16 tensor cannot be built: None, as Mooncake.
    k = key("bf16")
    assert store.put_tensor(k, cases[0]) == 0
    tensor_module_torch = tensor_module._torch
    try:
        tensor_module._torch = lambda: None
        assert store.get_tensor(k) is None
    finally:
        tensor_module._torch = tensor_module_torch


def test_an_encoded_tensor_keeps_its_memory_alive():
    if torch is None:
        pytest.skip("torch is not installed")
    import gc

    # A non-contiguous tensor is encoded from a contiguous copy that only
    # the returned buffer refers to.
    data, nbytes = encode(torch.arange(4096, dtype=torch.int64).reshape(64, 64).t())[1:3]
    gc.collect()
    churn = [torch.full((64, 64), -1, dtype=torch.int64) for _ in range(64)]
    want = torch.arange(4096, dtype=torch.int64).reshape(64, 64).t().contiguous()
    assert bytes(data) == want.numpy().tobytes() and nbytes == 4096 * 8
    del churn


def test_safetensors_files(store, tmp_path):
    if torch is None:
        pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from safetensors.torch import load_file, save_file

    k = key("st")
    t = torch.randn(4, 4)
    assert store.put_tensor(k, t) == 0
    path = tmp_path / "one.safetensors"
    assert store.save_tensor_to_safetensor(k, str(path)) == 0
    assert torch.equal(load_file(str(path))[k], t)
    assert store.save_tensor_to_safetensor(key("never-put"), str(path)) == FILE_NOT_FOUND

    two = tmp_path / "two.safetensors"
    named = key("named")
    save_file({"a": torch.ones(2), named: torch.zeros(3)}, str(two))
    kb = key("b")
    # The entry named like the key, else the first; stored under the key.
    assert torch.equal(store.load_tensor_from_safetensor(named, str(two)), torch.zeros(3))
    assert torch.equal(store.get_tensor(named), torch.zeros(3))
    assert torch.equal(store.load_tensor_from_safetensor(kb, str(two)), torch.ones(2))
    assert torch.equal(store.get_tensor(kb), torch.ones(2))
    assert store.load_tensor_from_safetensor(kb, str(tmp_path / "missing")) is None
