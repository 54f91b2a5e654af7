"""Mooncake's current names for a put's options (SoftPinAction, the full
ReplicateConfig), get_into_ranges and mooncake.mooncake_config, against a
real cluster where the call reaches one."""

import ctypes
import json
import logging
import os
import time
import uuid

import pytest

from crescent.store import (
    MooncakeDistributedStore,
    ObjectDataType,
    ReplicateConfig,
    SoftPinAction,
)

OBJECT_NOT_FOUND = -704
INVALID_PARAMS = -600
NOT_SET_UP = -1010


def key(name):
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_mooncake_store_exports_the_enums():
    import mooncake.store as ms

    assert ms.SoftPinAction is SoftPinAction
    assert [int(a) for a in (SoftPinAction.PRESERVE, SoftPinAction.ENABLE, SoftPinAction.DISABLE)] == [0, 1, 2]
    assert int(ObjectDataType.GENERAL) == 9
    assert ms.TENSOR == ObjectDataType.TENSOR, "ObjectDataType's members are module names too"
    assert not hasattr(ms, "ENABLE"), "SoftPinAction's are not"


def test_replicate_config_defaults_and_round_trips():
    c = ReplicateConfig()
    assert c.replica_num == 1
    assert c.soft_pin_action == SoftPinAction.PRESERVE
    assert c.soft_pin_ttl_ms is None
    assert c.preferred_segment == "" and c.preferred_segments == []
    assert (c.nof_replica_num, c.dfs_replica_num) == (0, 0)
    assert c.data_type == ObjectDataType.UNKNOWN and c.group_ids is None
    c.replica_num = 3
    c.soft_pin_action = SoftPinAction.ENABLE
    c.soft_pin_ttl_ms = 1000
    c.preferred_segments = ["a", "b"]
    c.group_ids = ["g"]
    c.data_type = ObjectDataType.KVCACHE
    assert (c.soft_pin_action, c.soft_pin_ttl_ms, c.preferred_segments) == (SoftPinAction.ENABLE, 1000, ["a", "b"])
    assert "replica_num: 3" in str(c)
    c.soft_pin_ttl_ms = None
    assert c.soft_pin_ttl_ms is None
    c.group_ids = [0]  # older engines pass ints; the groups are not used
    assert c.group_ids == [0]
    c.group_ids = None
    assert c.group_ids is None
    for bad in (-1, 1 << 64, "5s"):
        with pytest.raises(TypeError):
            c.soft_pin_ttl_ms = bad
    with pytest.raises(TypeError):
        c.soft_pin_action = "ENABLE"
    c.unknown_future_field = 1  # other attributes are accepted


def test_the_older_with_soft_pin_switch_is_the_enable_action():
    c = ReplicateConfig(with_soft_pin=True)
    assert c.soft_pin_action == SoftPinAction.ENABLE and c.with_soft_pin
    c.with_soft_pin = False
    assert c.soft_pin_action == SoftPinAction.PRESERVE
    c.soft_pin_action = SoftPinAction.DISABLE
    c.with_soft_pin = False
    assert c.soft_pin_action == SoftPinAction.DISABLE, "turning the switch off leaves DISABLE alone"


def pinned_until(cluster, k):
    """The object's soft-pin deadline as the first master applied it."""
    deadline = time.monotonic() + 10
    while True:
        status, text = cluster.http_get(f"/query_key?key={k}")
        if status == 200:
            return json.loads(text)["soft_pin_until_ms"]
        assert time.monotonic() < deadline, f"{k} never reached the first master: {status} {text}"
        time.sleep(0.05)


def config(**fields):
    c = ReplicateConfig()
    for name, value in fields.items():
        setattr(c, name, value)
    return c


class LegacyConfig:
    """A config object of another class with the older attribute only."""

    replica_num = 1
    with_soft_pin = True


def test_soft_pin_actions_reach_the_masters(cluster, store):
    pinned = {
        "enable": config(soft_pin_action=SoftPinAction.ENABLE),
        "enable-ttl": config(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=60_000),
        "legacy": LegacyConfig(),
    }
    unpinned = {
        "default": None,
        "enable-ttl-0": config(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=0),
        "disable": config(soft_pin_action=SoftPinAction.DISABLE),
        "preserve": config(soft_pin_action=SoftPinAction.PRESERVE),
    }
    for name, c in {**pinned, **unpinned}.items():
        k = key(f"pin-{name}")
        assert store.put(k, b"v" * 64, config=c) == 0, name
        until = pinned_until(cluster, k)
        if name in pinned:
            assert until > 0, f"{name}: not soft-pinned"
        else:
            assert until == 0, f"{name}: soft-pinned until {until}"


def test_options_mooncake_refuses_are_invalid_params_and_put_nothing(store):
    refused = {
        "ttl with preserve": config(soft_pin_action=SoftPinAction.PRESERVE, soft_pin_ttl_ms=1000),
        "ttl with disable": config(soft_pin_action=SoftPinAction.DISABLE, soft_pin_ttl_ms=1000),
        "ttl above 24 h": config(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=24 * 3600_000 + 1),
        "nvme-of replicas": config(nof_replica_num=1),
        "dfs replicas": config(dfs_replica_num=1),
    }
    buf = ctypes.create_string_buffer(64)
    base = ctypes.addressof(buf)
    assert store.register_buffer(base, 64) == 0
    try:
        for name, c in refused.items():
            k = key("refused")
            assert store.put(k, b"x", config=c) == INVALID_PARAMS, name
            assert store.put_parts(k, b"x", b"y", config=c) == INVALID_PARAMS, name
            assert store.put_batch([k], [b"x"], config=c) == INVALID_PARAMS, name
            assert store.put_from(k, base, 8, config=c) == INVALID_PARAMS, name
            assert store.batch_put_from([k, k + "2"], [base, base + 8], [8, 8], config=c) == [INVALID_PARAMS] * 2, name
            assert store.is_exist(k) == 0, f"{name}: a refused put stored something"
    finally:
        store.unregister_buffer(base)


def test_get_into_ranges(store):
    k1, k2 = key("ranges-1"), key("ranges-2")
    v1, v2 = bytes(range(40)), bytes(range(100, 140))
    assert store.put(k1, v1) == 0 and store.put(k2, v2) == 0
    bufs = [ctypes.create_string_buffer(32) for _ in range(2)]
    p0, p1 = (ctypes.addressof(b) for b in bufs)
    for p in (p0, p1):
        assert store.register_buffer(p, 32) == 0
    try:
        out = store.get_into_ranges(
            [p0, p1],
            [[k1, k2], [k2]],
            [[[0, 10], [20]], [[5]]],  # destination offsets
            [[[3, 30], [1]], [[7]]],  # source offsets
            [[[4, 6], [5]], [[9]]],  # sizes
        )
        assert out == [[[4, 6], [5]], [[9]]]
        assert bufs[0].raw[0:4] == v1[3:7]
        assert bufs[0].raw[10:16] == v1[30:36]
        assert bufs[0].raw[20:25] == v2[1:6]
        assert bufs[1].raw[5:14] == v2[7:16]

        # Per range: past the object's end, past the buffer's end, a
        # missing key; the other ranges are still read.
        out = store.get_into_ranges(
            [p0],
            [[k1, "missing-" + k1, k2]],
            [[[0, 0], [0], [30]]],
            [[[38, 0], [0], [0]]],
            [[[4, 2], [1], [4]]],
        )
        assert out[0][0][0] == INVALID_PARAMS, "source past the object's end"
        assert out[0][0][1] == 2
        assert out[0][1] == [OBJECT_NOT_FOUND]
        assert out[0][2] == [INVALID_PARAMS], "destination past the buffer's end"

        # Lists of different lengths: that key's ranges, or everything.
        out = store.get_into_ranges([p0], [[k1, k2]], [[[0], []]], [[[0, 1], []]], [[[1], []]])
        assert out == [[[INVALID_PARAMS], []]]
        out = store.get_into_ranges([p0, p1], [[k1]], [[[0]]], [[[0]]], [[[1]]])
        assert out == [[[INVALID_PARAMS]]]

        # Memory that is not registered is never written.
        loose = ctypes.create_string_buffer(8)
        out = store.get_into_ranges([ctypes.addressof(loose)], [[k1]], [[[0]]], [[[0]]], [[[8]]])
        assert out == [[[INVALID_PARAMS]]] and loose.raw == b"\0" * 8
    finally:
        for p in (p0, p1):
            store.unregister_buffer(p)
    assert MooncakeDistributedStore().get_into_ranges([p0], [[k1]], [[[0]]], [[[0]]], [[[1]]]) == [[[NOT_SET_UP]]]


def test_a_dummy_clients_memory_pool(cluster, store, monkeypatch):
    assert store.alloc_from_mem_pool(4096) == 0, "a client set up with setup() has no pool"
    monkeypatch.setenv("MOONCAKE_MASTER", cluster.masters)
    d = MooncakeDistributedStore()
    assert d.alloc_from_mem_pool(4096) == 0, "nor one not set up"
    assert d.setup_dummy(1 << 20, 1 << 20, "127.0.0.1:50052") == 0
    src, dst = d.alloc_from_mem_pool(64 << 10), d.alloc_from_mem_pool(64 << 10)
    assert src and dst and src % 4096 == 0 and abs(src - dst) >= 64 << 10
    assert d.alloc_from_mem_pool(1 << 20) == 0, "beyond mem_pool_size"
    assert d.register_buffer(src, 64 << 10) == 0 and d.register_buffer(dst, 64 << 10) == 0
    value = os.urandom(64 << 10)
    ctypes.memmove(src, value, len(value))
    k = key("pool")
    assert d.put_from(k, src, len(value)) == 0
    assert d.get_into(k, dst, len(value)) == len(value)
    assert ctypes.string_at(dst, len(value)) == value
    assert d.close() == 0
    assert d.alloc_from_mem_pool(4096) == 0, "closed"


# ---------------------------------------------------------- mooncake_config


def test_mooncake_config_sizes_and_booleans():
    from mooncake.mooncake_config import _parse_bool, _parse_segment_size

    assert _parse_segment_size(4096) == 4096
    assert _parse_segment_size(1.9) == 1
    assert _parse_segment_size(" 4KB ") == 4096
    assert _parse_segment_size("1.5gb") == 3 << 29
    assert _parse_segment_size("2m") == 2 << 20
    assert _parse_segment_size("512b") == 512
    assert _parse_segment_size("1e3") == 1000
    for bad in ("", "gb", "lots"):
        with pytest.raises(ValueError):
            _parse_segment_size(bad)
    assert _parse_bool("Yes") and _parse_bool(1) and not _parse_bool(None) and not _parse_bool("off")
    with pytest.raises(ValueError):
        _parse_bool("maybe")


def test_mooncake_config_checks_its_fields(caplog):
    from mooncake.mooncake_config import MooncakeConfig

    fields = ["host", "P2PHANDSHAKE", 1 << 20, 1 << 20, " TCP ", "", "m:50051"]
    c = MooncakeConfig(*fields)
    assert c.protocol == "tcp" and c.tenant_id == "default" and c.client_http_port == 9300
    assert MooncakeConfig(**c.__dict__) == c, "rebuilt from its dict, as spawned workers do"
    with caplog.at_level(logging.WARNING, logger="mooncake.mooncake_config"):
        assert MooncakeConfig(*fields[:4], "Foo", *fields[5:]).protocol == "foo"
    assert "Unrecognised protocol" in caplog.text
    for i, bad in [(4, "  "), (2, -1), (0, ""), (6, " ")]:
        wrong = list(fields)
        wrong[i] = bad
        with pytest.raises(ValueError):
            MooncakeConfig(*wrong)


def test_mooncake_config_from_a_file_and_the_environment(tmp_path, monkeypatch):
    from mooncake.mooncake_config import (
        DEFAULT_GLOBAL_SEGMENT_SIZE,
        DEFAULT_LOCAL_BUFFER_SIZE,
        MooncakeConfig,
    )

    for name in list(os.environ):
        if name.startswith("MOONCAKE_"):
            monkeypatch.delenv(name)
    with pytest.raises(ValueError, match="MOONCAKE_CONFIG_PATH"):
        MooncakeConfig.load_from_env()

    monkeypatch.setenv("MOONCAKE_MASTER", "m:50051")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "2gb")
    monkeypatch.setenv("MOONCAKE_OFFLOAD_ENABLED", "on")
    c = MooncakeConfig.load_from_env()
    assert (c.master_server_address, c.local_hostname, c.metadata_server) == ("m:50051", "localhost", "P2PHANDSHAKE")
    assert (c.global_segment_size, c.local_buffer_size) == (2 << 30, DEFAULT_LOCAL_BUFFER_SIZE)
    assert c.enable_ssd_offload is True

    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps({"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "master_server_address": "m:1", "local_buffer_size": "16mb", "ssd_offload_path": None}))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    c = MooncakeConfig.load_from_env()
    assert (c.local_hostname, c.master_server_address) == ("h", "m:1")
    assert (c.global_segment_size, c.local_buffer_size) == (DEFAULT_GLOBAL_SEGMENT_SIZE, 16 << 20)
    assert (c.protocol, c.ssd_offload_path) == ("tcp", "")

    path.write_text(json.dumps({"local_hostname": "h", "metadata_server": "P2PHANDSHAKE"}))
    with pytest.raises(ValueError, match="Missing required config field: master_server_address"):
        MooncakeConfig.from_file(str(path))
