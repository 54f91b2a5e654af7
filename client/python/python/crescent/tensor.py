"""Mooncake's tensor calls on the store: put_tensor, get_tensor and their
batch, ``_from``/``_into``, tensor-parallel and safetensors forms.

A tensor is stored as one object: Mooncake's 304-byte tensor header (magic,
dtype, shapes, parallel axes) followed by the elements, C-contiguous and
little-endian, so ``get_size`` and the ``_from``/``_into`` buffers mean what
they mean in Mooncake.

torch is imported on first use, never at import: without torch the package
works, tensor calls accept and return numpy arrays (dtypes numpy has), and a
call that needs torch answers INVALID_PARAMS or None as Mooncake's does.
Bytes go between the store and a CPU tensor's own memory through the buffer
protocol; the only copy of a put is the client's gathering of header and
data into one value, and a get's tensor owns the buffer the bytes arrived in.
"""

from __future__ import annotations

import ctypes
import logging
import struct
import sys
from typing import Any, Optional, Sequence

from crescent._native import INVALID_PARAMS

log = logging.getLogger("crescent.tensor")

TENSOR_METADATA_SIZE = 304
MAX_DIMS = 8
MAX_AXES = 4
FILE_NOT_FOUND = -1100

_MAGIC = 0x4D4F4F4E
_VERSION = 1
_FULL, _SHARD = 0, 1
_AXIS_TP = 1

# magic, version, header size, dtype, ndim, layout, flags, data offset, data
# bytes, global shape[8], local shape[8], axis count, reserved.
_HEAD = struct.Struct("<IHHiiIIQQ8q8qII")
# kind, axis index, rank, count, split dim, reserved, local extent of the split.
_AXIS = struct.Struct("<iiiiiiq")
assert _HEAD.size + MAX_AXES * _AXIS.size == TENSOR_METADATA_SIZE

# Mooncake's dtype numbers: name -> (number, element size, numpy name or None).
_DTYPES = {
    "float32": (0, 4, "float32"),
    "float64": (1, 8, "float64"),
    "int8": (2, 1, "int8"),
    "uint8": (3, 1, "uint8"),
    "int16": (4, 2, "int16"),
    "uint16": (5, 2, "uint16"),
    "int32": (6, 4, "int32"),
    "uint32": (7, 4, "uint32"),
    "int64": (8, 8, "int64"),
    "uint64": (9, 8, "uint64"),
    "bool": (10, 1, "bool"),
    "float16": (11, 2, "float16"),
    "bfloat16": (12, 2, None),
    "float8_e4m3fn": (13, 1, None),
    "float8_e5m2": (14, 1, None),
}
_BY_NUMBER = {number: (name, size) for name, (number, size, _) in _DTYPES.items()}


class TensorError(ValueError):
    """A value that is not a tensor Crescent can store, or bytes that are
    not a stored tensor."""


def _torch():
    """torch, or None when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def _numpy():
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _is_torch_tensor(value: Any) -> bool:
    # A value can only be a torch tensor once torch is imported.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def header(
    dtype_name: str,
    global_shape: Sequence[int],
    local_shape: Sequence[int],
    axes: Sequence[tuple[int, int, int, int, int, int, int]] = (),
) -> bytes:
    """Mooncake's tensor header. `axes` holds (kind, axis index, rank,
    count, split dim, reserved, local extent) per parallel axis; none means
    the whole tensor."""
    number, size, _ = _DTYPES[dtype_name]
    ndim = len(local_shape)
    if ndim > MAX_DIMS:
        raise TensorError(f"a tensor has at most {MAX_DIMS} dimensions, got {ndim}")
    if len(axes) > MAX_AXES:
        raise TensorError(f"a tensor has at most {MAX_AXES} parallel axes, got {len(axes)}")
    nbytes = size
    for d in local_shape:
        nbytes *= d
    pad = [-1] * (MAX_DIMS - ndim)
    head = _HEAD.pack(
        _MAGIC,
        _VERSION,
        TENSOR_METADATA_SIZE,
        number,
        ndim,
        _SHARD if axes else _FULL,
        0,
        TENSOR_METADATA_SIZE,
        nbytes,
        *(list(global_shape) + pad),
        *(list(local_shape) + pad),
        len(axes),
        0,
    )
    packed = b"".join(_AXIS.pack(*a) for a in axes)
    return head + packed + bytes(MAX_AXES * _AXIS.size - len(packed))


class Header:
    """A stored tensor's header, checked."""

    __slots__ = ("dtype_name", "elem_size", "local_shape", "global_shape", "data_offset", "data_bytes", "axes")

    def __init__(self, raw: bytes, total: int):
        if total < TENSOR_METADATA_SIZE or len(raw) < TENSOR_METADATA_SIZE:
            raise TensorError(f"{total} bytes is shorter than a tensor header")
        f = _HEAD.unpack_from(raw, 0)
        magic, version, head_size, number, ndim, layout, _flags, offset, nbytes = f[:9]
        global_shape, local_shape = f[9:17], f[17:25]
        axis_count = f[25]
        if magic != _MAGIC or version != _VERSION or head_size != TENSOR_METADATA_SIZE:
            raise TensorError("not a tensor object (bad magic, version or header size)")
        if number not in _BY_NUMBER:
            raise TensorError(f"unknown tensor dtype number {number}")
        if not 0 <= ndim <= MAX_DIMS or axis_count > MAX_AXES or layout > _SHARD:
            raise TensorError("tensor header out of range (dims, axes or layout)")
        if not TENSOR_METADATA_SIZE <= offset <= total or nbytes != total - offset:
            raise TensorError(f"tensor header says {nbytes} bytes at {offset}, the object has {total}")
        for shape in (global_shape, local_shape):
            if any(d < 0 for d in shape[:ndim]) or any(d != -1 for d in shape[ndim:]):
                raise TensorError("tensor header has a bad shape")
        self.dtype_name, self.elem_size = _BY_NUMBER[number]
        expected = self.elem_size
        for d in local_shape[:ndim]:
            expected *= d
        if expected != nbytes:
            raise TensorError(f"tensor header's shape needs {expected} bytes, it says {nbytes}")
        self.axes = [_AXIS.unpack_from(raw, _HEAD.size + i * _AXIS.size) for i in range(axis_count)]
        for kind, _index, rank, count, split_dim, _r0, _r1 in self.axes:
            if not (0 <= kind <= 4 and 0 <= rank < count and -1 <= split_dim < ndim):
                raise TensorError("tensor header has a bad parallel axis")
        self.local_shape = tuple(local_shape[:ndim])
        self.global_shape = tuple(global_shape[:ndim])
        self.data_offset = offset
        self.data_bytes = nbytes


def encode(value: Any, axes=(), global_shape=None) -> tuple[bytes, Any, int, Any]:
    """(header, buffer over the elements, byte count, owner that keeps the
    buffer valid) for a torch tensor (any device: others are copied to the
    CPU) or a numpy array. TensorError for anything else."""
    if _is_torch_tensor(value):
        name = str(value.dtype).removeprefix("torch.")
        if name not in _DTYPES:
            raise TensorError(f"Crescent cannot store a tensor of {value.dtype}")
        try:
            t = value.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            t = t.contiguous()
            shape = tuple(t.shape)
            nbytes = t.numel() * t.element_size()
            data = _memory_at(t.data_ptr(), nbytes, t)
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
            # Sparse, nested and meta tensors have no plain memory to send.
            raise TensorError(f"cannot store this tensor: {e}") from None
        owner = t
    else:
        np = _numpy()
        if np is None or not isinstance(value, np.ndarray):
            raise TensorError(f"expected a torch.Tensor or a numpy array, got {type(value).__name__}")
        # (ascontiguousarray would turn a 0-d array into a 1-d one.)
        a = value if value.flags.c_contiguous else np.ascontiguousarray(value)
        name = a.dtype.name
        if name not in _DTYPES or a.dtype.byteorder == ">":
            raise TensorError(f"Crescent cannot store an array of {a.dtype}")
        shape = a.shape
        nbytes = a.nbytes
        data = a.reshape(-1).view(np.uint8) if nbytes else b""
        owner = a
    head = header(name, global_shape if global_shape is not None else shape, shape, axes)
    return head, data, nbytes, owner


def _memory_at(ptr: int, nbytes: int, owner: Any = None) -> Any:
    """A buffer object over `nbytes` at `ptr` that keeps `owner`, the
    object the memory belongs to, alive as long as it lives."""
    if nbytes == 0:
        return b""
    array = (ctypes.c_ubyte * nbytes).from_address(ptr)
    array.owner = owner
    # (ctypes' own buffer format, "<B", is refused where "B" is expected.)
    return memoryview(array).cast("B")


def decode(buf: Any, total: Optional[int] = None) -> Any:
    """The tensor in a stored object held by `buf` (a buffer object). The
    result shares `buf`'s memory. A torch tensor when torch is installed,
    else a numpy array; TensorError when the bytes are not a tensor, or the
    dtype needs torch and torch is missing."""
    view = memoryview(buf).cast("B")
    total = len(view) if total is None else total
    h = Header(bytes(view[:TENSOR_METADATA_SIZE]), total)
    torch = _torch()
    if torch is not None:
        dtype = getattr(torch, h.dtype_name, None)
        if dtype is None:
            raise TensorError(f"this torch has no {h.dtype_name}")
        if h.data_bytes == 0:
            return torch.empty(h.local_shape, dtype=dtype)
        flat = torch.frombuffer(buf, dtype=torch.uint8, count=h.data_bytes, offset=h.data_offset)
        if flat.data_ptr() % h.elem_size:
            flat = flat.clone()
        return flat.view(dtype).reshape(h.local_shape)
    np = _numpy()
    numpy_name = _DTYPES[h.dtype_name][2]
    if np is None or numpy_name is None:
        raise TensorError(f"reading a {h.dtype_name} tensor needs torch")
    a = np.frombuffer(buf, dtype=np.uint8, count=h.data_bytes, offset=h.data_offset)
    if a.ctypes.data % h.elem_size:
        a = a.copy()
    return a.view(numpy_name).reshape(h.local_shape)


def _ok_header(store, ptr: int, size: int) -> Optional[Header]:
    """The header of the tensor object in registered memory at `ptr`, or
    None (logged) when it is not one."""
    if ptr == 0 or size < TENSOR_METADATA_SIZE:
        return None
    if not store._registered(ptr, size):
        log.warning("tensor buffer at %#x is not inside a registered buffer", ptr)
        return None
    raw = ctypes.string_at(ptr, TENSOR_METADATA_SIZE)
    try:
        return Header(raw, size)
    except TensorError as e:
        log.warning("buffer at %#x is not a tensor object: %s", ptr, e)
        return None


def tensor_in_buffer(store, key: str, ptr: int, size: int) -> Any:
    """A copy of the tensor object in a registered buffer, or None (logged)."""
    if _ok_header(store, ptr, size) is None:
        return None
    try:
        return decode(bytearray(ctypes.string_at(ptr, size)))
    except TensorError as e:
        log.warning("put %r: %s", key, e)
        return None


def split_equally(t: Any, dim: int, size: int) -> list:
    """A torch tensor or numpy array cut into `size` equal views along `dim`."""
    shape = tuple(t.shape)
    if not 0 <= dim < len(shape):
        raise TensorError(f"split_dim {dim} is not a dimension of a {len(shape)}-d tensor")
    if shape[dim] % size:
        raise TensorError(f"dimension {dim} ({shape[dim]}) does not split into {size} equal shards")
    n = shape[dim] // size
    return [t[(slice(None),) * dim + (slice(r * n, (r + 1) * n),)] for r in range(size)]


def _tp_shards(value: Any, tp_size: int, split_dim: int) -> list[tuple[bytes, Any, int, Any]]:
    """The tensor cut into tp_size equal shards along split_dim, each encoded
    with its tensor-parallel axis."""
    np = _numpy()
    if not _is_torch_tensor(value) and (np is None or not isinstance(value, np.ndarray)):
        raise TensorError(f"expected a torch.Tensor or a numpy array, got {type(value).__name__}")
    shards = split_equally(value, split_dim, tp_size)
    n = tuple(shards[0].shape)[split_dim]
    return [
        encode(shard, axes=[(_AXIS_TP, 0, rank, tp_size, split_dim, 0, n)], global_shape=tuple(value.shape))
        for rank, shard in enumerate(shards)
    ]


class TensorCalls:
    """Mooncake's tensor methods, over the native store's byte calls."""

    # -- whole tensors ----------------------------------------------------

    def put_tensor(self, key: str, tensor: Any) -> int:
        return self.pub_tensor(key, tensor)

    def pub_tensor(self, key: str, tensor: Any, config: Any = None) -> int:
        if not self._set_up() or not _config_fits(config, None):
            return INVALID_PARAMS
        try:
            head, data, _, _owner = encode(tensor)
        except TensorError as e:
            log.warning("put_tensor %r: %s", key, e)
            return INVALID_PARAMS
        return self.put_parts(key, head, data, config=config)

    def _set_up(self) -> bool:
        """Whether setup succeeded and close has not run: Mooncake answers
        tensor calls before that with INVALID_PARAMS (or None)."""
        return self.health_check() != 1

    def batch_put_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> list[int]:
        return self.batch_pub_tensor(keys, tensors_list)

    def batch_pub_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any], config: Any = None) -> list[int]:
        keys = list(keys)
        if not keys:
            return []
        if len(keys) != len(tensors_list) or not self._set_up() or not _config_fits(config, len(keys)):
            return [INVALID_PARAMS] * len(keys)
        codes = [0] * len(keys)
        put_keys, parts, owners = [], [], []
        for i, (key, t) in enumerate(zip(keys, tensors_list)):
            try:
                head, data, _, owner = encode(t)
            except TensorError as e:
                log.warning("batch_put_tensor %r: %s", key, e)
                codes[i] = INVALID_PARAMS
                continue
            put_keys.append((i, key))
            parts.append([head, data])
            owners.append(owner)
        if put_keys:
            results = self.batch_put_parts([k for _, k in put_keys], parts, config=config)
            for (i, _), rc in zip(put_keys, results):
                codes[i] = rc
        return codes

    def get_tensor(self, key: str) -> Any:
        return _decode_or_none(key, self.get_buffer(key))

    def get_tensor_into_cuda(self, key: str, tensor: Any) -> int:
        """Mooncake reads into GPU memory only through a dummy client's CUDA
        IPC; Crescent has no GPU path, and answers as Mooncake's real client."""
        return INVALID_PARAMS

    def batch_get_tensor_into_cuda(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> list[int]:
        return [INVALID_PARAMS] * len(list(keys))

    def batch_get_tensor(self, keys: Sequence[str]) -> list[Any]:
        keys = list(keys)
        return [_decode_or_none(k, b) for k, b in zip(keys, self.batch_get_buffer(keys))]

    # -- caller memory (registered buffers) -------------------------------

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        if not self._set_up() or _ok_header(self, buffer_ptr, size) is None:
            return INVALID_PARAMS
        return self.put_from(key, buffer_ptr, size)

    def batch_put_tensor_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]:
        keys = list(keys)
        if not keys:
            return []
        if not (len(keys) == len(buffer_ptrs) == len(sizes)) or not self._set_up() or any(
            _ok_header(self, p, s) is None for p, s in zip(buffer_ptrs, sizes)
        ):
            return [INVALID_PARAMS] * len(keys)
        return self.batch_put_from(keys, list(buffer_ptrs), list(sizes))

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        if buffer_ptr == 0 or not self._set_up():
            return None
        n = self.get_into(key, buffer_ptr, size)
        return _view_or_none(key, buffer_ptr, n)

    def batch_get_tensor_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]) -> list[Any]:
        keys = list(keys)
        if not (len(keys) == len(buffer_ptrs) == len(sizes)) or any(p == 0 for p in buffer_ptrs) or not self._set_up():
            return [INVALID_PARAMS] * len(keys)
        counts = self.batch_get_into(keys, list(buffer_ptrs), list(sizes))
        return [_view_or_none(k, p, n) for k, p, n in zip(keys, buffer_ptrs, counts)]

    # -- tensor parallelism: shards under key_tp_<rank> --------------------

    def put_tensor_with_tp(self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> int:
        return self.pub_tensor_with_tp(key, tensor, None, tp_rank, tp_size, split_dim)

    def pub_tensor_with_tp(
        self, key: str, tensor: Any, config: Any = None, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> int:
        """Writes every rank's shard of the whole tensor (tp_rank is not used,
        as in Mooncake); tp_size 1 is a plain put under `key`."""
        return self.batch_pub_tensor_with_tp([key], [tensor], config, tp_rank, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp(
        self, base_keys: Sequence[str], tensors_list: Sequence[Any], tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> list[int]:
        return self.batch_pub_tensor_with_tp(base_keys, tensors_list, None, tp_rank, tp_size, split_dim)

    def batch_pub_tensor_with_tp(
        self,
        base_keys: Sequence[str],
        tensors_list: Sequence[Any],
        config: Any = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        base_keys = list(base_keys)
        if tp_size <= 1:
            return self.batch_pub_tensor(base_keys, tensors_list, config)
        if not base_keys or len(base_keys) != len(tensors_list) or not self._set_up():
            return [INVALID_PARAMS] * len(base_keys)
        if not _config_fits(config, None):
            return [INVALID_PARAMS] * len(base_keys)
        codes = [0] * len(base_keys)
        keys, parts, owner_of = [], [], []
        for i, (key, t) in enumerate(zip(base_keys, tensors_list)):
            try:
                shards = _tp_shards(t, tp_size, split_dim)
            except TensorError as e:
                log.warning("batch_put_tensor_with_tp %r: %s", key, e)
                codes[i] = INVALID_PARAMS
                continue
            for r, (h, d, _, _) in enumerate(shards):
                keys.append(f"{key}_tp_{r}")
                parts.append([h, d])
                owner_of.append(i)
        if keys:
            for i, rc in zip(owner_of, self.batch_put_parts(keys, parts, config=config)):
                if rc != 0 and codes[i] == 0:
                    codes[i] = rc
        return codes

    def put_tensor_with_tp_from(
        self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> int:
        """The buffer holds the whole tensor object; every rank's shard is put."""
        return self.batch_put_tensor_with_tp_from([key], [buffer_ptr], [size], tp_rank, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp_from(
        self,
        base_keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        base_keys = list(base_keys)
        if not base_keys or not (len(base_keys) == len(buffer_ptrs) == len(sizes)):
            return [INVALID_PARAMS] * len(base_keys)
        if tp_size <= 1:
            return [self.put_tensor_from(k, p, s) for k, p, s in zip(base_keys, buffer_ptrs, sizes)]
        tensors = [tensor_in_buffer(self, k, p, s) for k, p, s in zip(base_keys, buffer_ptrs, sizes)]
        codes = self.batch_put_tensor_with_tp(base_keys, tensors, tp_rank, tp_size, split_dim)
        return [INVALID_PARAMS if t is None else c for t, c in zip(tensors, codes)]

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> Any:
        return self.get_tensor(key if tp_size <= 1 else f"{key}_tp_{tp_rank}")

    def batch_get_tensor_with_tp(self, base_keys: Sequence[str], tp_rank: int = 0, tp_size: int = 1) -> list[Any]:
        keys = [k if tp_size <= 1 else f"{k}_tp_{tp_rank}" for k in base_keys]
        return self.batch_get_tensor(keys)

    def get_tensor_with_tp_into(
        self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> Any:
        return self.get_tensor_into(key if tp_size <= 1 else f"{key}_tp_{tp_rank}", buffer_ptr, size)

    def batch_get_tensor_with_tp_into(
        self, base_keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int], tp_rank: int = 0, tp_size: int = 1
    ) -> list[Any]:
        keys = [k if tp_size <= 1 else f"{k}_tp_{tp_rank}" for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    # -- safetensors files ------------------------------------------------

    def save_tensor_to_safetensor(self, key: str, file_name: Optional[str] = None) -> int:
        """Writes the tensor under `key` to a safetensors file (one entry,
        named `key`) at `file_name`, or at `key` when none is given."""
        if not self._set_up():
            return INVALID_PARAMS
        tensor = self.get_tensor(key)
        if tensor is None:
            return FILE_NOT_FOUND
        try:
            from safetensors.torch import save_file

            save_file({key: tensor.contiguous()}, file_name or key)
        except Exception as e:  # noqa: BLE001 - Mooncake answers any failure here with a code
            log.warning("save_tensor_to_safetensor %r: %s", key, e)
            return INVALID_PARAMS
        return 0

    def load_tensor_from_safetensor(self, key: Optional[str] = None, file_name: Optional[str] = None) -> Any:
        """Puts one tensor of a safetensors file under `key` (the entry named
        `key`, else the file's first) and returns it; None on failure."""
        if not file_name:
            return None
        try:
            from safetensors.torch import load_file

            entries = load_file(file_name)
        except Exception as e:  # noqa: BLE001
            log.warning("load_tensor_from_safetensor %r: %s", file_name, e)
            return None
        if not entries:
            return None
        if key is not None and key in entries:
            tensor = entries[key]
        else:
            if key is not None:
                log.warning("%s has no entry %r; storing its first entry", file_name, key)
            tensor = next(iter(entries.values()))
        store_key = key if key is not None else file_name
        return tensor if self.put_tensor(store_key, tensor) == 0 else None


def _config_fits(config: Any, n_keys: Optional[int]) -> bool:
    """Mooncake's checks of a tensor put's config: preferred segments, if
    any, one per replica; for a batch of n_keys, group ids, if any, one per
    key."""
    if config is None:
        return True
    preferred = list(getattr(config, "preferred_segments", []) or [])
    if preferred and len(preferred) != getattr(config, "replica_num", 1):
        return False
    groups = getattr(config, "group_ids", None)
    if n_keys is not None and groups is not None and len(list(groups)) != n_keys:
        return False
    return True


def _decode_or_none(key: str, buf: Any) -> Any:
    if buf is None:
        return None
    try:
        return decode(buf)
    except (TensorError, RuntimeError, ValueError, OverflowError) as e:
        log.warning("get_tensor %r: %s", key, e)
        return None


def _view_or_none(key: str, ptr: int, n: int) -> Any:
    if n < 0:
        return None
    try:
        return decode(_memory_at(ptr, n), n)
    except (TensorError, RuntimeError, ValueError, OverflowError) as e:
        log.warning("get_tensor_into %r: %s", key, e)
        return None


# Helpers Mooncake's structured_object_store takes from mooncake.store.


def _tensor_metadata_size() -> int:
    return TENSOR_METADATA_SIZE


def _serialize_tensor(tensor: Any) -> tuple[bytes, int, int, Any]:
    """(header, address of the elements, byte count, owner to keep alive)."""
    try:
        head, data, nbytes, owner = encode(tensor)
    except TensorError as e:
        raise ValueError(str(e)) from None
    ptr = 0
    if nbytes:
        ptr = owner.data_ptr() if _is_torch_tensor(owner) else owner.ctypes.data
    return head, ptr, nbytes, (owner, data)


def _deserialize_tensor(payload: Any) -> Any:
    """A tensor owning a copy of a stored tensor object's bytes."""
    try:
        return decode(bytearray(payload))
    except TensorError as e:
        raise ValueError(str(e)) from None
