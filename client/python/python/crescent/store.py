"""Mooncake Store's Python API (``mooncake.store``), served by Crescent.

Method names, parameters, defaults and return codes follow Mooncake's
``MooncakeDistributedStore``: 0 is success, a negative number is Mooncake's
error code (-704 OBJECT_NOT_FOUND, -200 NO_AVAILABLE_HANDLE, -600
INVALID_PARAMS, -900 RPC_FAIL, ...), a missed ``get`` returns ``b""``.
Every call that does I/O releases the GIL. The tensor calls
(``put_tensor``, ``get_tensor``, ...) are in ``crescent.tensor``.
"""

from crescent._native import (
    INVALID_PARAMS,
    NO_AVAILABLE_HANDLE,
    OBJECT_NOT_FOUND,
    RPC_FAIL,
    BufferHandle,
    MooncakeHostMemAllocator,
    ObjectDataType,
    ReplicaDescriptor,
    ReplicateConfig,
    SoftPinAction,
)
from crescent._native import MooncakeDistributedStore as _NativeStore
from crescent.tensor_parallel import ParallelAxis, ParallelTensorCalls, ReadTarget, TensorParallelism
from crescent.tensor import (  # noqa: F401 - structured_object_store imports these from here
    TensorCalls,
    _deserialize_tensor,
    _serialize_tensor,
    _tensor_metadata_size,
)


class MooncakeDistributedStore(ParallelTensorCalls, TensorCalls, _NativeStore):
    """Mooncake's store client: the byte calls are native, the tensor calls
    encode tensors over them."""


# Mooncake exports ObjectDataType's members at module level too (not
# SoftPinAction's).
_DATA_TYPES = (
    "UNKNOWN",
    "KVCACHE",
    "TENSOR",
    "WEIGHT",
    "SAMPLE",
    "ACTIVATION",
    "GRADIENT",
    "OPTIMIZER_STATE",
    "METADATA",
    "GENERAL",
)
globals().update({name: getattr(ObjectDataType, name) for name in _DATA_TYPES})

__all__ = [
    "BufferHandle",
    "MooncakeDistributedStore",
    "MooncakeHostMemAllocator",
    "ObjectDataType",
    "ParallelAxis",
    "ReadTarget",
    "ReplicaDescriptor",
    "ReplicateConfig",
    "SoftPinAction",
    "TensorParallelism",
    "INVALID_PARAMS",
    "NO_AVAILABLE_HANDLE",
    "OBJECT_NOT_FOUND",
    "RPC_FAIL",
    *_DATA_TYPES,
]
