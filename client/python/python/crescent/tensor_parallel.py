"""Mooncake's unified parallelism API for tensors: ``ParallelAxis``,
``TensorParallelism``, ``ReadTarget`` and the ``*_with_parallelism`` calls.

Where shards live (Mooncake's key names, so either system reads the other's
layout the same way):
- one tensor-parallel axis: ``f"{key}_tp_{rank}"``, plus a 96-byte manifest
  at ``f"{key}__parallelism_manifest"`` (global shape, split dim, count);
- several axes, or axes without TP: ``key`` followed by ``__{kind}_{rank}of
  {size}`` per axis in DP, TP, EP, PP order (``_sd``, ``_eid``, ``_sid`` for
  the split dim, expert and stage ids);
- a writer partition (one writer's slice of a whole tensor):
  ``f"{key}__writer_{rank}of{size}_sd{split_dim}"``, manifest at
  ``f"{key}__writer_manifest"``.

A shard is read from its own key, or rebuilt from whatever TP shards are
stored (written with 4 ranks, read with 2), and ``mode="full"`` rebuilds the
whole tensor. Writes are puts: an existing key keeps its value. Shards of
one write are put in one batch, the manifest after them.
"""

from __future__ import annotations

import ctypes
import logging
import struct
from typing import Any, Optional, Sequence

from crescent._native import INVALID_PARAMS
from crescent.tensor import (
    TENSOR_METADATA_SIZE,
    Header,
    TensorError,
    _is_torch_tensor,
    _numpy,
    _view_or_none,
    decode,
    _ok_header,
    encode,
    split_equally,
    tensor_in_buffer,
)

log = logging.getLogger("crescent.tensor")

_KINDS = {"dp": 0, "tp": 1, "ep": 2, "pp": 3}
_MODES = ("as_stored", "shard", "full")
_MANIFEST = struct.Struct("<IHHiiiii4x8q")
_MANIFEST_MAGIC = 0x574D414E


class ParallelAxis:
    """One axis of a tensor's parallel layout: kind "tp", "dp", "ep" or
    "pp"; TP needs split_dim, EP expert_id, PP stage_id."""

    def __init__(self) -> None:
        self.kind = ""
        self.rank = 0
        self.size = 1
        self.split_dim: Optional[int] = None
        self.expert_id: Optional[int] = None
        self.stage_id: Optional[int] = None

    def __repr__(self) -> str:
        return (
            f"ParallelAxis(kind={self.kind!r}, rank={self.rank}, size={self.size}, split_dim={self.split_dim}, "
            f"expert_id={self.expert_id}, stage_id={self.stage_id})"
        )


class TensorParallelism:
    """The axes of a layout. Reading ``axes`` gives a copy (as Mooncake's
    does), so assign a whole list rather than appending."""

    def __init__(self) -> None:
        self._axes: list = []

    @property
    def axes(self) -> list:
        return list(self._axes)

    @axes.setter
    def axes(self, value: Sequence[Any]) -> None:
        self._axes = list(value)


class ReadTarget:
    """What a read returns: ``"as_stored"`` (the object under the key),
    ``"shard"`` (the shard of ``parallelism``) or ``"full"`` (the whole
    tensor, rebuilt)."""

    def __init__(self) -> None:
        self._mode = "as_stored"
        self.parallelism: Optional[TensorParallelism] = None

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        m = str(value).lower()
        if m not in _MODES:
            raise RuntimeError("Unsupported ReadTarget mode")
        self._mode = m


class _Axis:
    """A checked axis: kind number and name, rank, size, split dim, id."""

    __slots__ = ("kind", "name", "rank", "size", "split_dim", "expert_id", "stage_id", "ident", "index")

    def __init__(self, a: Any, index: int):
        name = str(a.kind).lower()
        if name not in _KINDS:
            raise TensorError(f"unknown parallel axis kind {a.kind!r}")
        self.kind, self.name, self.index = _KINDS[name], name, index
        self.rank, self.size = _i32(a.rank, "rank"), _i32(a.size, "size")
        if not 0 <= self.rank < self.size:
            raise TensorError(f"{name} rank {self.rank} is not below size {self.size}")
        self.split_dim = None if a.split_dim is None else _i32(a.split_dim, "split_dim")
        self.expert_id = None if a.expert_id is None else _i32(a.expert_id, "expert_id")
        self.stage_id = None if a.stage_id is None else _i32(a.stage_id, "stage_id")
        if (name == "tp") != (self.split_dim is not None):
            raise TensorError("a TP axis needs split_dim, and only a TP axis has one")
        if name == "tp" and self.split_dim < 0:
            raise TensorError("split_dim must be 0 or more")
        if name == "ep" and self.expert_id is None:
            raise TensorError("an EP axis needs expert_id")
        if name == "pp" and self.stage_id is None:
            raise TensorError("a PP axis needs stage_id")
        self.ident = self.expert_id if name == "ep" else self.stage_id if name == "pp" else None

    def suffix(self) -> str:
        s = f"__{self.name}_{self.rank}of{self.size}"
        if self.split_dim is not None:
            s += f"_sd{self.split_dim}"
        if self.expert_id is not None:
            s += f"_eid{self.expert_id}"
        if self.stage_id is not None:
            s += f"_sid{self.stage_id}"
        return s

    def with_rank(self, rank: int, size: int) -> "_Axis":
        other = object.__new__(_Axis)
        for f in _Axis.__slots__:
            setattr(other, f, getattr(self, f))
        other.rank, other.size = rank, size
        return other

    def header_entry(self, extent: int) -> tuple:
        split = -1 if self.split_dim is None else self.split_dim
        return (self.kind, self.index, self.rank, self.size, split, self.ident or 0, extent)

    def signature(self) -> tuple:
        split = -1 if self.split_dim is None else self.split_dim
        return (self.kind, self.rank, self.size, split, self.ident or 0)


def _i32(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TensorError(f"{what} must be an int, got {type(value).__name__}")
    if not -(2**31) <= value < 2**31:
        raise TensorError(f"{what} {value} does not fit in 32 bits")
    return value


def _axes(parallelism: Any) -> list:
    raw = list(parallelism.axes)
    if not 1 <= len(raw) <= 4:
        raise TensorError(f"a parallelism has 1 to 4 axes, got {len(raw)}")
    axes = [_Axis(a, i) for i, a in enumerate(raw)]
    if len({a.name for a in axes}) != len(axes):
        raise TensorError("a parallelism names each kind once")
    return axes


def _canonical(key: str, axes: list) -> str:
    return key + "".join(a.suffix() for a in sorted(axes, key=lambda a: a.kind))


def _tp(axes: list) -> Optional[_Axis]:
    return next((a for a in axes if a.name == "tp"), None)


def _shard_key(key: str, axes: list, tp: _Axis) -> str:
    """Where the shard of `tp` lives in a layout of `axes`."""
    if len(axes) == 1:
        return f"{key}_tp_{tp.rank}"
    return _canonical(key, [tp if a.name == "tp" else a for a in axes])


# -- array helpers (torch or numpy) ----------------------------------------


def _shape(t: Any) -> tuple:
    return tuple(t.shape)


def _cat(parts: list, dim: int) -> Any:
    if _is_torch_tensor(parts[0]):
        import torch

        return torch.cat(parts, dim)
    return _numpy().concatenate(parts, axis=dim)


def _manifest(dtype_number: int, global_shape: tuple, split_dim: int, count: int) -> bytes:
    dims = list(global_shape) + [-1] * (8 - len(global_shape))
    return _MANIFEST.pack(_MANIFEST_MAGIC, 1, _MANIFEST.size, dtype_number, len(global_shape), split_dim, count, 0, *dims)


def _read_manifest(raw: Optional[Any]) -> Optional[tuple]:
    """(split dim, shard count) from a stored manifest, or None."""
    if raw is None or len(raw) != _MANIFEST.size:
        return None
    f = _MANIFEST.unpack(bytes(raw))
    magic, version, size, _dtype, ndim, split_dim, count = f[:7]
    if magic != _MANIFEST_MAGIC or version != 1 or size != _MANIFEST.size or count < 1:
        return None
    if not 0 <= split_dim < ndim <= 8:
        return None
    return split_dim, count


def _dtype_number(head: bytes) -> int:
    return struct.unpack_from("<i", head, 8)[0]


class _Write:
    """The objects one tensor write puts: shards first, then a manifest."""

    def __init__(self) -> None:
        self.shards: list = []  # (key, header, data, owner)
        self.manifest: Optional[tuple] = None  # (key, bytes)


def _plan_write(key: str, tensor: Any, parallelism: Any, writer_partition: Any, whole: bool) -> _Write:
    """What writing `tensor` under `key` puts. `whole` says the tensor is
    the whole one even for a single TP axis (the ``_from`` calls), where a
    tensor write takes it as this rank's shard."""
    w = _Write()
    if writer_partition is not None:
        rank, size, dim = int(writer_partition.rank), int(writer_partition.size), int(writer_partition.split_dim)
        if not 0 <= rank < size:
            raise TensorError(f"writer rank {rank} is not below size {size}")
        shard = split_equally(tensor, dim, size)[rank]
        axis = [(1, 0, rank, size, dim, 0, _shape(shard)[dim])]
        head, data, _, owner = encode(shard, axes=axis, global_shape=_shape(tensor))
        w.shards.append((f"{key}__writer_{rank}of{size}_sd{dim}", head, data, owner))
        w.manifest = (f"{key}__writer_manifest", _manifest(_dtype_number(head), _shape(tensor), dim, size))
        return w
    axes = _axes(parallelism)
    tp = _tp(axes)
    if tp is None:
        entries = [a.header_entry(0) for a in axes]
        head, data, _, owner = encode(tensor, axes=entries)
        w.shards.append((_canonical(key, axes), head, data, owner))
        return w
    if len(axes) == 1 and not whole:
        shape = list(_shape(tensor))
        if tp.split_dim >= len(shape):
            raise TensorError(f"split_dim {tp.split_dim} is not a dimension of a {len(shape)}-d tensor")
        extent = shape[tp.split_dim]
        shape[tp.split_dim] = extent * tp.size
        head, data, _, owner = encode(tensor, axes=[tp.header_entry(extent)], global_shape=tuple(shape))
        w.shards.append((f"{key}_tp_{tp.rank}", head, data, owner))
        w.manifest = (f"{key}__parallelism_manifest", _manifest(_dtype_number(head), tuple(shape), tp.split_dim, tp.size))
        return w
    shards = split_equally(tensor, tp.split_dim, tp.size)
    ranks = range(tp.size) if whole else [tp.rank]
    for r in ranks:
        rt = tp.with_rank(r, tp.size)
        layout = [rt if a.name == "tp" else a for a in axes]
        entries = [a.header_entry(_shape(shards[r])[tp.split_dim] if a.name == "tp" else 0) for a in layout]
        head, data, _, owner = encode(shards[r], axes=entries, global_shape=_shape(tensor))
        w.shards.append((_shard_key(key, layout, rt), head, data, owner))
    if not whole:
        head = w.shards[0][1]
        w.manifest = (
            f"{key}__parallelism_manifest",
            _manifest(_dtype_number(head), _shape(tensor), tp.split_dim, tp.size),
        )
    return w


class ParallelTensorCalls:
    """The ``*_with_parallelism`` calls, over the tensor calls."""

    # -- writes -----------------------------------------------------------

    def put_tensor_with_parallelism(
        self, key: str, tensor: Any, parallelism: Any = None, config: Any = None, writer_partition: Any = None
    ) -> int:
        return self.batch_put_tensor_with_parallelism(
            [key], [tensor], None if parallelism is None else [parallelism], config,
            None if writer_partition is None else [writer_partition],
        )[0]

    def batch_put_tensor_with_parallelism(
        self,
        keys: Sequence[str],
        tensors_list: Sequence[Any],
        parallelisms: Optional[Sequence[Any]] = None,
        config: Any = None,
        writer_partitions: Optional[Sequence[Any]] = None,
    ) -> list:
        return self._put_planned(keys, tensors_list, parallelisms, writer_partitions, config, whole=False)

    def put_tensor_with_parallelism_from(
        self, key: str, buffer_ptr: int, size: int, parallelism: Any = None, config: Any = None, writer_partition: Any = None
    ) -> int:
        return self.batch_put_tensor_with_parallelism_from(
            [key], [buffer_ptr], [size], None if parallelism is None else [parallelism], config,
            None if writer_partition is None else [writer_partition],
        )[0]

    def batch_put_tensor_with_parallelism_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        parallelisms: Optional[Sequence[Any]] = None,
        config: Any = None,
        writer_partitions: Optional[Sequence[Any]] = None,
    ) -> list:
        keys = list(keys)
        if len(buffer_ptrs) != len(keys) or len(sizes) != len(keys):
            return [INVALID_PARAMS] * len(keys)
        if parallelisms is None and writer_partitions is None:
            # No layout: the object is stored as it is, header and all.
            if config is None:
                return self.batch_put_tensor_from(keys, buffer_ptrs, sizes)
            if not self._set_up() or any(_ok_header(self, p, s) is None for p, s in zip(buffer_ptrs, sizes)):
                return [INVALID_PARAMS] * len(keys)
            return self.batch_put_from(keys, list(buffer_ptrs), list(sizes), config)
        tensors = [tensor_in_buffer(self, k, p, s) for k, p, s in zip(keys, buffer_ptrs, sizes)]
        return self._put_planned(keys, tensors, parallelisms, writer_partitions, config, whole=True)

    def _put_planned(self, keys, tensors_list, parallelisms, writer_partitions, config, whole: bool) -> list:
        keys = list(keys)
        n = len(keys)
        if len(tensors_list) != n or (parallelisms is not None and writer_partitions is not None):
            return [INVALID_PARAMS] * n
        if not self._set_up():
            return [INVALID_PARAMS] * n
        for per_key in (parallelisms, writer_partitions):
            if per_key is not None and (not isinstance(per_key, list) or len(per_key) != n):
                return [INVALID_PARAMS] * n
        codes = [0] * n
        plans: list = [None] * n
        for i, (key, tensor) in enumerate(zip(keys, tensors_list)):
            par = parallelisms[i] if parallelisms is not None else None
            part = writer_partitions[i] if writer_partitions is not None else None
            if tensor is None:
                codes[i] = INVALID_PARAMS
                continue
            if par is None and part is None:
                codes[i] = self.pub_tensor(key, tensor, config)
                continue
            try:
                plans[i] = _plan_write(key, tensor, par, part, whole)
            except (TensorError, AttributeError, TypeError, ValueError, IndexError, RuntimeError, struct.error) as e:
                log.warning("put %r with parallelism: %s", key, e)
                codes[i] = INVALID_PARAMS
        shard_of = [(i, s) for i, p in enumerate(plans) if p is not None for s in p.shards]
        if shard_of:
            results = self.batch_put_parts([s[0] for _, s in shard_of], [[s[1], s[2]] for _, s in shard_of], config=config)
            for (i, _), rc in zip(shard_of, results):
                if rc != 0 and codes[i] == 0:
                    codes[i] = rc
        manifests = [(i, p.manifest) for i, p in enumerate(plans) if p is not None and p.manifest and codes[i] == 0]
        if manifests:
            results = self.batch_put_parts([m[0] for _, m in manifests], [[m[1]] for _, m in manifests], config=config)
            for (i, _), rc in zip(manifests, results):
                codes[i] = rc
        return codes

    # -- reads ------------------------------------------------------------

    def get_tensor_with_parallelism(self, key: str, target: Any = None) -> Any:
        got = self._read(key, target)
        return None if got is None else got[0]

    def batch_get_tensor_with_parallelism(self, keys: Sequence[str], targets: Optional[Sequence[Any]] = None) -> list:
        keys = list(keys)
        if targets is None:
            return self.batch_get_tensor(keys)
        if not isinstance(targets, list) or len(targets) != len(keys):
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism(k, t) for k, t in zip(keys, targets)]

    def get_tensor_with_parallelism_into(self, key: str, buffer_ptr: int, size: int, target: Any = None) -> Any:
        got = self._read(key, target)
        if got is None or buffer_ptr == 0:
            return None
        tensor, entries, global_shape = got
        try:
            head, data, nbytes, _owner = encode(tensor, axes=entries, global_shape=global_shape)
        except (TensorError, struct.error):
            return None
        needed = TENSOR_METADATA_SIZE + nbytes
        if needed > size or not self._registered(buffer_ptr, needed, True):
            return None
        ctypes.memmove(buffer_ptr, head, TENSOR_METADATA_SIZE)
        if nbytes:
            ctypes.memmove(buffer_ptr + TENSOR_METADATA_SIZE, bytes(memoryview(data).cast("B")), nbytes)
        return _view_or_none(key, buffer_ptr, needed)

    def batch_get_tensor_with_parallelism_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int], targets: Optional[Sequence[Any]] = None
    ) -> list:
        keys = list(keys)
        if len(buffer_ptrs) != len(keys) or len(sizes) != len(keys):
            return [None] * len(keys)
        if targets is not None and (not isinstance(targets, list) or len(targets) != len(keys)):
            return [None] * len(keys)
        ts = targets if targets is not None else [None] * len(keys)
        return [self.get_tensor_with_parallelism_into(k, p, s, t) for k, p, s, t in zip(keys, buffer_ptrs, sizes, ts)]

    def _read(self, key: str, target: Any) -> Optional[tuple]:
        """(tensor, header axes, global shape) for the target, or None."""
        try:
            mode = "as_stored" if target is None else str(target.mode).lower()
            par = None if target is None else target.parallelism
            axes = None if par is None else _axes(par)
        except (TensorError, AttributeError, TypeError, ValueError) as e:
            log.warning("get %r with parallelism: %s", key, e)
            return None
        try:
            return self._read_mode(key, mode, axes)
        except (TensorError, IndexError, RuntimeError, ValueError, OverflowError) as e:
            # Stored shards that do not fit together (a stale manifest, a
            # layout rewritten with other shapes): nothing to return.
            log.warning("get %r with parallelism: %s", key, e)
            return None

    def _read_mode(self, key: str, mode: str, axes: Optional[list]) -> Optional[tuple]:
        if mode == "as_stored":
            return None if axes else self._stored(key)
        if mode == "full":
            return self._full(key, axes)
        if mode == "shard" and axes:
            return self._shard(key, axes)
        return None

    def _stored(self, key: str) -> Optional[tuple]:
        buf = self.get_buffer(key)
        if buf is None:
            return None
        try:
            h = Header(bytes(memoryview(buf)[:TENSOR_METADATA_SIZE]), len(buf))
            return decode(buf), [a for a in h.axes], h.global_shape
        except TensorError:
            return None

    def _shard(self, key: str, axes: list) -> Optional[tuple]:
        tp = _tp(axes)
        want = sorted(a.signature() for a in axes)
        exact = _shard_key(key, axes, tp) if tp else _canonical(key, axes)
        got = self._stored(exact)
        if got is not None and sorted(_signature(e) for e in got[1]) == want:
            return got
        if tp is None:
            return None
        if len(axes) == 1:
            got = self._stored(f"{key}__writer_{tp.rank}of{tp.size}_sd{tp.split_dim}")
            if got is not None:
                return got
        whole = self._rebuild(key, axes, tp)
        if whole is not None:
            try:
                shard = split_equally(whole, tp.split_dim, tp.size)[tp.rank]
            except TensorError:
                return None
            entries = [a.header_entry(_shape(shard)[tp.split_dim] if a.name == "tp" else 0) for a in axes]
            return shard, entries, _shape(whole)
        return self._stored(f"{key}_tp_{tp.rank}") if len(axes) == 1 else None

    def _full(self, key: str, axes: Optional[list]) -> Optional[tuple]:
        if not axes:
            found = _read_manifest(self.get_buffer(f"{key}__writer_manifest"))
            if found is None:
                return self._stored(key)
            dim, count = found
            parts = [self._stored(f"{key}__writer_{r}of{count}_sd{dim}") for r in range(count)]
            if any(p is None for p in parts):
                return None
            whole = _cat([p[0] for p in parts], dim)
            return whole, [], _shape(whole)
        tp = _tp(axes)
        if tp is None:
            return None
        whole = self._rebuild(key, axes, tp)
        return None if whole is None else (whole, [], _shape(whole))

    def _rebuild(self, key: str, axes: list, tp: _Axis) -> Any:
        """The whole tensor from the TP shards stored for this layout: their
        count comes from the manifest, else from shard 0's header."""
        found = _read_manifest(self.get_buffer(f"{key}__parallelism_manifest"))
        dim, count = found if found is not None else (tp.split_dim, None)
        if count is None:
            first = self._stored(_shard_key(key, axes, tp.with_rank(0, tp.size)))
            if first is None and len(axes) == 1:
                first = self._stored(f"{key}_tp_0")
            tp_entry = None if first is None else next((e for e in first[1] if e[0] == 1), None)
            if tp_entry is None:
                return None
            dim, count = tp_entry[4], tp_entry[3]
        parts = []
        for r in range(count):
            got = self._stored(_shard_key(key, axes, tp.with_rank(r, count)))
            if got is None:
                return None
            parts.append(got[0])
        return _cat(parts, dim)


def _signature(entry: tuple) -> tuple:
    kind, _index, rank, count, split, ident, _extent = entry
    return (kind, rank, count, split, ident)
