from typing import Any, Optional, Sequence, Union

OBJECT_NOT_FOUND: int
INVALID_PARAMS: int
NO_AVAILABLE_HANDLE: int
RPC_FAIL: int

Size = Union[int, str]
Tensor = Any

class SoftPinAction:
    PRESERVE: SoftPinAction
    ENABLE: SoftPinAction
    DISABLE: SoftPinAction
    def __int__(self) -> int: ...

class ObjectDataType:
    UNKNOWN: ObjectDataType
    KVCACHE: ObjectDataType
    TENSOR: ObjectDataType
    WEIGHT: ObjectDataType
    SAMPLE: ObjectDataType
    ACTIVATION: ObjectDataType
    GRADIENT: ObjectDataType
    OPTIMIZER_STATE: ObjectDataType
    METADATA: ObjectDataType
    GENERAL: ObjectDataType
    def __int__(self) -> int: ...

UNKNOWN: ObjectDataType
KVCACHE: ObjectDataType
TENSOR: ObjectDataType
WEIGHT: ObjectDataType
SAMPLE: ObjectDataType
ACTIVATION: ObjectDataType
GRADIENT: ObjectDataType
OPTIMIZER_STATE: ObjectDataType
METADATA: ObjectDataType
GENERAL: ObjectDataType

class ReplicateConfig:
    replica_num: int
    # Crescent has neither NVMe-oF nor DFS replicas: a put with either
    # count above 0 returns INVALID_PARAMS.
    nof_replica_num: int
    dfs_replica_num: int
    soft_pin_action: SoftPinAction
    # None, or 0..2**64 (else TypeError). ENABLE with 0 stores the object
    # unpinned; any other value pins it for the masters' --soft-pin-ttl
    # (the per-object TTL is not applied). Above 24 h, or with PRESERVE or
    # DISABLE, a put returns INVALID_PARAMS.
    soft_pin_ttl_ms: Optional[int]
    # The older API's switch: True is soft_pin_action = ENABLE.
    with_soft_pin: bool
    with_hard_pin: bool
    preferred_segment: str
    preferred_segments: list[str]
    preferred_nof_segments: list[str]
    prefer_alloc_in_same_node: bool
    # Accepted and not used.
    data_type: ObjectDataType
    group_ids: Optional[list[Any]]
    def __init__(
        self,
        replica_num: int = 1,
        with_soft_pin: bool = False,
        with_hard_pin: bool = False,
        preferred_segment: str = "",
        preferred_segments: Sequence[str] = (),
        prefer_alloc_in_same_node: bool = False,
        soft_pin_action: SoftPinAction = ...,
        soft_pin_ttl_ms: Optional[int] = None,
        nof_replica_num: int = 0,
        dfs_replica_num: int = 0,
        preferred_nof_segments: Sequence[str] = (),
        data_type: ObjectDataType = ...,
        group_ids: Optional[Sequence[Any]] = None,
        **ignored: Any,
    ) -> None: ...
    def __setattr__(self, name: str, value: Any) -> None: ...

class BufferHandle:
    def ptr(self) -> int: ...
    def size(self) -> int: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class MooncakeHostMemAllocator:
    def __init__(self) -> None: ...
    def alloc(self, size: int) -> int: ...
    def free(self, ptr: int) -> int: ...

class ReplicaDescriptor:
    segment_name: str
    endpoint: str
    size: int
    def is_memory_replica(self) -> bool: ...
    def is_disk_replica(self) -> bool: ...
    def is_local_disk_replica(self) -> bool: ...

class MooncakeDistributedStore:
    def __init__(self) -> None: ...
    # setup() also reads, as Mooncake does, MOONCAKE_*/CRESCENT_* variables
    # and MOONCAKE_CONFIG_PATH; Crescent's credentials come from there too:
    # CRESCENT_TOKEN_FILE, and for masters that require mutual TLS
    # CRESCENT_TLS_CERT, CRESCENT_TLS_KEY, CRESCENT_TLS_CA (and
    # CRESCENT_ETCD_TLS=1 to read an etcd:// address over TLS with them,
    # CRESCENT_DATA_TLS=1 for stores started with --data-tls).
    # enable_ssd_offload=True with ssd_offload_path (or
    # MOONCAKE_OFFLOAD_FILE_STORAGE_PATH) contributes a disk segment in that
    # directory beside global_segment_size of memory: objects the masters
    # demote go there and survive this process's restart on the same
    # directory. Its size is CRESCENT_DISK_SIZE (default 16gb); one process
    # per directory. A directory that cannot be used fails setup, and so
    # does a segment file formatted for another size (left as it is, with
    # its objects; CRESCENT_DISK_REFORMAT=1, set once, formats it anew at the
    # new size and discards them).
    # CRESCENT_DESCRIPTOR_CACHE=1 reads a key looked up before with no
    # master call while its read lease lasts (not linearizable against a
    # forced remove; see docs/guarantees.md).
    def setup(
        self,
        local_hostname: Union[str, dict[str, Any], None] = None,
        metadata_server: Optional[str] = None,
        global_segment_size: Optional[Size] = None,
        local_buffer_size: Optional[Size] = None,
        protocol: Optional[str] = None,
        rdma_devices: Optional[str] = None,
        master_server_addr: Optional[str] = None,
        engine: Any = None,
        enable_ssd_offload: bool = False,
        ssd_offload_path: Optional[str] = None,
        tenant_id: Optional[str] = None,
        enable_client_http_server: bool = False,
        client_http_port: int = 9300,
    ) -> int: ...
    def setup_dummy(self, mem_pool_size: Size, local_buffer_size: Size, server_address: str) -> int: ...
    def close(self) -> int: ...
    # A dummy client's (setup_dummy) memory: size bytes of its mem_pool_size,
    # page-aligned, to register and use in zero-copy calls; 0 when there is
    # no room, and always 0 for a client set up with setup(). The memory
    # lives as long as the store object.
    def alloc_from_mem_pool(self, size: int, /) -> int: ...
    def health_check(self) -> int: ...
    def get_hostname(self) -> str: ...
    def put(self, key: str, value: Any, config: Optional[ReplicateConfig] = None) -> int: ...
    def put_parts(self, key: str, *parts: Any, config: Optional[ReplicateConfig] = None) -> int: ...
    def put_batch(self, keys: Sequence[str], values: Sequence[Any], config: Optional[ReplicateConfig] = None) -> int: ...
    # One object per key from that key's parts in order; per key, a code.
    def batch_put_parts(
        self, keys: Sequence[str], all_parts: Sequence[Sequence[Any]], config: Optional[ReplicateConfig] = None
    ) -> list[int]: ...
    def get(self, key: str) -> bytes: ...
    def get_batch(self, keys: Sequence[str]) -> list[bytes]: ...
    def get_buffer(self, key: str) -> Optional[BufferHandle]: ...
    def batch_get_buffer(self, keys: Sequence[str]) -> list[Optional[BufferHandle]]: ...
    def get_size(self, key: str) -> int: ...
    def is_exist(self, key: str) -> int: ...
    def batch_is_exist(self, keys: Sequence[str]) -> list[int]: ...
    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]: ...
    def batch_get_replica_desc(self, keys: Sequence[str]) -> dict[str, list[ReplicaDescriptor]]: ...
    def remove(self, key: str, force: bool = False) -> int: ...
    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]: ...
    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int: ...
    def remove_all(self, force: bool = False) -> int: ...
    def register_buffer(self, buffer_ptr: int, size: int) -> int: ...
    def unregister_buffer(self, buffer_ptr: int) -> int: ...
    def put_from(self, key: str, buffer_ptr: int, size: int, config: Optional[ReplicateConfig] = None) -> int: ...
    def get_into(self, key: str, buffer_ptr: int, size: int) -> int: ...
    def batch_put_from(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int], config: Optional[ReplicateConfig] = None
    ) -> list[int]: ...
    def batch_get_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]: ...
    def batch_put_from_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        config: Optional[ReplicateConfig] = None,
    ) -> list[int]: ...
    def batch_get_into_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> list[int]: ...
    # Per buffer i, per key j, per range k: size bytes from the object's
    # src offset to the buffer's dst offset. Shaped like all_dst_offsets:
    # bytes read, or a negative code per range.
    def get_into_ranges(
        self,
        buffer_ptrs: Sequence[int],
        all_keys: Sequence[Sequence[str]],
        all_dst_offsets: Sequence[Sequence[Sequence[int]]],
        all_src_offsets: Sequence[Sequence[Sequence[int]]],
        all_sizes: Sequence[Sequence[Sequence[int]]],
    ) -> list[list[list[int]]]: ...

    # Tensors (crescent.tensor). `Tensor` is a torch.Tensor, or without torch
    # a numpy array. A stored tensor is Mooncake's 304-byte header and the
    # elements; puts answer 0 or a code, reads the tensor or None.
    def put_tensor(self, key: str, tensor: Tensor) -> int: ...
    def pub_tensor(self, key: str, tensor: Tensor, config: Optional[ReplicateConfig] = None) -> int: ...
    def batch_put_tensor(self, keys: Sequence[str], tensors_list: Sequence[Tensor]) -> list[int]: ...
    def batch_pub_tensor(
        self, keys: Sequence[str], tensors_list: Sequence[Tensor], config: Optional[ReplicateConfig] = None
    ) -> list[int]: ...
    def get_tensor(self, key: str) -> Optional[Tensor]: ...
    def batch_get_tensor(self, keys: Sequence[str]) -> list[Optional[Tensor]]: ...
    # The buffer holds a whole tensor object (header + elements), registered.
    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int: ...
    def batch_put_tensor_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]: ...
    # size is the registered buffer's capacity; the result views it at +304.
    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Optional[Tensor]: ...
    def batch_get_tensor_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[Union[Optional[Tensor], int]]: ...
    # Every rank's shard of the whole tensor, under f"{key}_tp_{rank}".
    def put_tensor_with_tp(
        self, key: str, tensor: Tensor, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> int: ...
    def pub_tensor_with_tp(
        self,
        key: str,
        tensor: Tensor,
        config: Optional[ReplicateConfig] = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int: ...
    def batch_put_tensor_with_tp(
        self, base_keys: Sequence[str], tensors_list: Sequence[Tensor], tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> list[int]: ...
    def batch_pub_tensor_with_tp(
        self,
        base_keys: Sequence[str],
        tensors_list: Sequence[Tensor],
        config: Optional[ReplicateConfig] = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]: ...
    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> Optional[Tensor]: ...
    def batch_get_tensor_with_tp(
        self, base_keys: Sequence[str], tp_rank: int = 0, tp_size: int = 1
    ) -> list[Optional[Tensor]]: ...
    def get_tensor_with_tp_into(
        self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> Optional[Tensor]: ...
    def batch_get_tensor_with_tp_into(
        self, base_keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int], tp_rank: int = 0, tp_size: int = 1
    ) -> list[Union[Optional[Tensor], int]]: ...
    # Needs the safetensors package. 0, -1100 (no such tensor) or -600.
    def save_tensor_to_safetensor(self, key: str, file_name: Optional[str] = None) -> int: ...
    def load_tensor_from_safetensor(self, key: Optional[str] = None, file_name: Optional[str] = None) -> Optional[Tensor]: ...

    # The unified parallelism API (crescent.tensor_parallel): a layout is
    # one to four ParallelAxis (tp needs split_dim, ep expert_id, pp
    # stage_id); a writer_partition is any object with rank, size, split_dim.
    def put_tensor_with_parallelism(
        self,
        key: str,
        tensor: Tensor,
        parallelism: Optional[TensorParallelism] = None,
        config: Optional[ReplicateConfig] = None,
        writer_partition: Any = None,
    ) -> int: ...
    def batch_put_tensor_with_parallelism(
        self,
        keys: Sequence[str],
        tensors_list: Sequence[Tensor],
        parallelisms: Optional[list[TensorParallelism]] = None,
        config: Optional[ReplicateConfig] = None,
        writer_partitions: Optional[list[Any]] = None,
    ) -> list[int]: ...
    def put_tensor_with_parallelism_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        parallelism: Optional[TensorParallelism] = None,
        config: Optional[ReplicateConfig] = None,
        writer_partition: Any = None,
    ) -> int: ...
    def batch_put_tensor_with_parallelism_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        parallelisms: Optional[list[TensorParallelism]] = None,
        config: Optional[ReplicateConfig] = None,
        writer_partitions: Optional[list[Any]] = None,
    ) -> list[int]: ...
    def get_tensor_with_parallelism(self, key: str, target: Optional[ReadTarget] = None) -> Optional[Tensor]: ...
    def batch_get_tensor_with_parallelism(
        self, keys: Sequence[str], targets: Optional[list[ReadTarget]] = None
    ) -> list[Optional[Tensor]]: ...
    def get_tensor_with_parallelism_into(
        self, key: str, buffer_ptr: int, size: int, target: Optional[ReadTarget] = None
    ) -> Optional[Tensor]: ...
    def batch_get_tensor_with_parallelism_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int], targets: Optional[list[ReadTarget]] = None
    ) -> list[Optional[Tensor]]: ...
    def put_tensor_with_tp_from(
        self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> int: ...
    def batch_put_tensor_with_tp_from(
        self,
        base_keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]: ...

class ParallelAxis:
    kind: str
    rank: int
    size: int
    split_dim: Optional[int]
    expert_id: Optional[int]
    stage_id: Optional[int]
    def __init__(self) -> None: ...

class TensorParallelism:
    # Reading gives a copy: assign the whole list.
    axes: list[ParallelAxis]
    def __init__(self) -> None: ...

class ReadTarget:
    # "as_stored", "shard" or "full"; anything else raises RuntimeError.
    mode: str
    parallelism: Optional[TensorParallelism]
    def __init__(self) -> None: ...

def _tensor_metadata_size() -> int: ...
def _serialize_tensor(tensor: Tensor) -> tuple[bytes, int, int, Any]: ...
def _deserialize_tensor(payload: Any) -> Tensor: ...
