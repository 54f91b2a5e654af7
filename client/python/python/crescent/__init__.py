"""Crescent: a highly available KV-cache store for LLM inference.

`crescent.store.MooncakeDistributedStore` is Mooncake Store's Python API over
Crescent's Rust client; see the README's "Using Crescent from Python".
"""

from crescent import store
from crescent.store import (
    BufferHandle,
    MooncakeDistributedStore,
    MooncakeHostMemAllocator,
    ObjectDataType,
    ReplicaDescriptor,
    ReplicateConfig,
    SoftPinAction,
)

__all__ = [
    "store",
    "BufferHandle",
    "MooncakeDistributedStore",
    "MooncakeHostMemAllocator",
    "ObjectDataType",
    "ReplicaDescriptor",
    "ReplicateConfig",
    "SoftPinAction",
]
