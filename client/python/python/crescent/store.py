"""Mooncake Store's Python API (``mooncake.store``), served by Crescent.

Method names, parameters, defaults and return codes follow Mooncake's
``MooncakeDistributedStore``: 0 is success, a negative number is Mooncake's
error code (-704 OBJECT_NOT_FOUND, -200 NO_AVAILABLE_HANDLE, -600
INVALID_PARAMS, -900 RPC_FAIL, ...), a missed ``get`` returns ``b""``.
Every call that does I/O releases the GIL.
"""

from crescent._native import (
    INVALID_PARAMS,
    NO_AVAILABLE_HANDLE,
    OBJECT_NOT_FOUND,
    RPC_FAIL,
    BufferHandle,
    MooncakeDistributedStore,
    MooncakeHostMemAllocator,
    ReplicaDescriptor,
    ReplicateConfig,
)

__all__ = [
    "BufferHandle",
    "MooncakeDistributedStore",
    "MooncakeHostMemAllocator",
    "ReplicaDescriptor",
    "ReplicateConfig",
    "INVALID_PARAMS",
    "NO_AVAILABLE_HANDLE",
    "OBJECT_NOT_FOUND",
    "RPC_FAIL",
]
