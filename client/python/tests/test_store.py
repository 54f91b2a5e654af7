"""crescent.store.MooncakeDistributedStore against a real cluster: Mooncake's
calling conventions, return codes, zero-copy calls and bad input."""

import ctypes
import mmap
import os
import sys
import threading
import time
import uuid

import pytest

from crescent.store import (
    BufferHandle,
    MooncakeDistributedStore,
    MooncakeHostMemAllocator,
    ReplicateConfig,
)

OBJECT_NOT_FOUND = -704
INVALID_PARAMS = -600
NOT_SET_UP = -1010
RPC_FAIL = -900


def key(name):
    return f"{name}-{uuid.uuid4().hex[:8]}"


def round_trip_then_close(s, value):
    try:
        k = key("roundtrip")
        assert s.put(k, value) == 0
        assert s.get(k) == value
    finally:
        s.close()


def test_put_get_exists_size_remove(store):
    k = key("basic")
    assert store.get(k) == b""
    assert store.is_exist(k) == 0
    assert store.get_size(k) == OBJECT_NOT_FOUND
    value = os.urandom(10_000)
    assert store.put(k, value) == 0
    assert store.put(k, b"another value") == 0, "first writer wins, as in Mooncake"
    assert store.get(k) == value
    assert store.is_exist(k) == 1
    assert store.get_size(k) == len(value)
    assert store.remove(k, force=True) == 0
    assert store.get(k) == b""
    assert store.remove(k) == OBJECT_NOT_FOUND


def test_any_buffer_and_parts(store):
    k1, k2, k3 = key("bytearray"), key("memoryview"), key("parts")
    assert store.put(k1, bytearray(b"abc" * 100)) == 0
    assert store.get(k1) == b"abc" * 100
    floats = memoryview(bytearray(8 * 16)).cast("d")
    assert store.put(k2, floats, ReplicateConfig(replica_num=1)) == 0
    assert len(store.get(k2)) == 8 * 16
    assert store.put_parts(k3, b"head-", bytearray(b"middle-"), memoryview(b"tail")) == 0
    assert store.get(k3) == b"head-middle-tail"
    with pytest.raises(TypeError, match="buffer protocol"):
        store.put(key("bad"), 12345)


def test_batches_have_per_key_results(store):
    keys = [key(f"batch{i}") for i in range(20)]
    values = [os.urandom(100 + i) for i in range(20)]
    assert store.put_batch(keys, values) == 0
    assert store.get_batch(keys + ["missing-" + keys[0]]) == values + [b""]
    assert store.batch_is_exist(keys[:2] + ["nope-" + keys[0]]) == [1, 1, 0]
    assert store.put_batch(keys[:2], values[:1]) == INVALID_PARAMS
    handles = store.batch_get_buffer(keys[:3] + ["nope-" + keys[0]])
    assert handles[3] is None
    for h, v in zip(handles[:3], values[:3]):
        assert isinstance(h, BufferHandle)
        assert h.size() == len(h) == len(v) and h.ptr() != 0
        assert bytes(memoryview(h)) == v
    assert store.batch_remove(keys[:2] + ["nope-" + keys[0]], force=True) == [0, 0, OBJECT_NOT_FOUND]
    assert store.remove_by_regex("^" + keys[2].split("-")[0] + "-", force=True) >= 1


def test_zero_copy_calls_on_registered_memory(store):
    n, size = 8, 4096
    src = ctypes.create_string_buffer(n * size)
    dst = ctypes.create_string_buffer(n * size)
    base_src, base_dst = ctypes.addressof(src), ctypes.addressof(dst)
    for i in range(n):
        ctypes.memmove(base_src + i * size, os.urandom(size), size)
    assert store.register_buffer(base_src, n * size) == 0
    assert store.register_buffer(base_dst, n * size) == 0
    assert store.register_buffer(base_src + 16, 10) == INVALID_PARAMS, "overlap"
    keys = [key(f"zc{i}") for i in range(n)]
    ptrs = [base_src + i * size for i in range(n)]
    assert store.put_from(keys[0], ptrs[0], size) == 0
    assert store.batch_put_from(keys[1:], ptrs[1:], [size] * (n - 1)) == [0] * (n - 1)
    got = store.batch_get_into(keys, [base_dst + i * size for i in range(n)], [size] * n)
    assert got == [size] * n
    assert dst.raw == src.raw
    assert store.get_into(keys[0], base_dst, size) == size
    assert store.get_into(key("missing"), base_dst, size) == OBJECT_NOT_FOUND
    assert store.get_into(keys[0], base_dst, size - 1) == INVALID_PARAMS, "buffer too small"
    # One object from two buffers, read back into three.
    mk = key("multi")
    assert store.batch_put_from_multi_buffers([mk], [[ptrs[0], ptrs[1]]], [[size, size]]) == [0]
    ctypes.memset(base_dst, 0, n * size)
    parts = [[base_dst, base_dst + 1000, base_dst + 2 * size]]
    assert store.batch_get_into_multi_buffers([mk], parts, [[1000, 2 * size - 1000, 10]]) == [2 * size]
    assert dst.raw[: 2 * size] == src.raw[: 2 * size]
    assert store.batch_get_into_multi_buffers([mk], [[base_dst]], [[size]]) == [INVALID_PARAMS]
    assert store.unregister_buffer(base_src) == 0
    assert store.put_from(key("after-unregister"), ptrs[0], size) == INVALID_PARAMS
    assert store.unregister_buffer(base_src) == INVALID_PARAMS


def test_pointers_outside_registered_memory_are_refused_not_crashes(store):
    buf = ctypes.create_string_buffer(4096)
    base = ctypes.addressof(buf)
    assert store.register_buffer(base, 4096) == 0
    assert store.put_from(key("out"), base + 4000, 200) == INVALID_PARAMS
    assert store.get_into(key("out"), 0xDEAD0000, 64) == INVALID_PARAMS
    assert store.batch_put_from([key("a"), key("b")], [base, 16], [64, 64]) == [0, INVALID_PARAMS]
    assert store.batch_get_into([key("a")], [base], [64, 64]) == [INVALID_PARAMS]
    # Unmapped memory (as a GPU pointer would be here) cannot be registered.
    assert store.register_buffer(0x10, 4096) == INVALID_PARAMS
    assert store.register_buffer(base, 0) == INVALID_PARAMS
    assert store.register_buffer(-1 & 0xFFFFFFFFFFFFFFFF, 4096) == INVALID_PARAMS
    with pytest.raises(OverflowError):
        store.register_buffer(-5, 10)


def test_calls_before_setup_and_after_close():
    s = MooncakeDistributedStore()
    assert s.health_check() == 1
    assert s.put("k", b"v") == NOT_SET_UP
    assert s.get("k") == b""
    assert s.get_buffer("k") is None
    assert s.batch_is_exist(["a", "b"]) == [NOT_SET_UP, NOT_SET_UP]
    assert s.remove_all() == NOT_SET_UP
    assert s.close() == 0
    assert s.close() == 0


def test_bad_arguments_get_codes_or_exceptions(cluster):
    s = MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", -1, 1 << 20, "tcp", "", cluster.masters) == INVALID_PARAMS
    assert s.setup("localhost", "P2PHANDSHAKE", "lots", 1 << 20, "tcp", "", cluster.masters) == INVALID_PARAMS
    assert s.setup("localhost", "P2PHANDSHAKE", 0, 1 << 20, "carrier-pigeon", "", cluster.masters) == INVALID_PARAMS
    assert s.setup("localhost", "P2PHANDSHAKE", 0, 1 << 20, "tcp", "", "not an address") < 0
    assert s.health_check() == 1
    assert s.setup("localhost", "P2PHANDSHAKE", 0, 1 << 20, "tcp", "", cluster.masters) == 0
    try:
        assert s.setup("localhost", "P2PHANDSHAKE", 0, 1 << 20, "tcp", "", cluster.masters) == INVALID_PARAMS
        with pytest.raises(TypeError):
            s.put(None, b"x")
        with pytest.raises(TypeError):
            s.get_batch([None])
        with pytest.raises(ValueError):
            s.put(key("neg"), b"x", ReplicateConfig(replica_num=-1))
        assert s.put(key("empty"), b"") == INVALID_PARAMS
    finally:
        s.close()


def test_setup_by_keyword_dict_and_sizes_as_text(cluster):
    s = MooncakeDistributedStore()
    assert s.setup(
        local_hostname="localhost",
        metadata_server="P2PHANDSHAKE",
        global_segment_size="32mb",
        local_buffer_size="16MB",
        protocol="rdma",  # served over TCP, with a warning
        rdma_devices="mlx5_0",
        master_server_addr=cluster.masters,
    ) == 0
    assert s.health_check() == 0
    # With a segment of its own, the hostname is that segment's name (LMCache
    # passes it back as a preferred segment).
    own = s.get_hostname()
    status, segments = cluster.http_get("/get_all_segments")
    assert status == 200 and own in segments.splitlines(), (own, segments)
    k = key("kw")
    assert s.put(k, b"from a segment-contributing client", ReplicateConfig(preferred_segment=own)) == 0
    status, text = cluster.http_get(f"/query_segment?segment={own}")
    assert status == 200 and not text.splitlines()[1].endswith(": 0"), text
    s.close()
    d = MooncakeDistributedStore()
    assert d.setup({
        "local_hostname": "localhost",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": 0,
        "local_buffer_size": 1 << 24,
        "protocol": "tcp",
        "device_name": "",
        "master_server_address": cluster.masters,
    }) == 0
    k2 = key("dict")
    assert d.put(k2, b"set up from a dict") == 0
    assert d.get(k2) == b"set up from a dict"
    assert d.get_hostname() == "localhost", "a pure client answers its host name"
    d.close()


def test_host_allocator():
    a = MooncakeHostMemAllocator()
    p = a.alloc(1 << 20)
    assert p % 4096 == 0
    ctypes.memset(p, 7, 1 << 20)
    assert a.free(p) == 0
    assert a.free(p) == INVALID_PARAMS


def test_many_threads_share_one_store(store):
    errors = []

    def worker(t):
        try:
            for i in range(20):
                k = key(f"t{t}-{i}")
                v = os.urandom(2048)
                assert store.put(k, v) == 0
                assert store.get(k) == v
        except BaseException as e:  # noqa: BLE001 - any failure in a worker fails the test
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_gil_is_released_during_io(store):
    """A Python thread keeps counting while this one waits inside a get. The
    switch interval is raised so that, were the GIL held through the call,
    the counter could not run at all while the call lasts."""
    k = key("big")
    assert store.put(k, os.urandom(32 << 20)) == 0
    count = 0
    stop = threading.Event()

    def counter():
        nonlocal count
        while not stop.is_set():
            count += 1
            time.sleep(0)

    old = sys.getswitchinterval()
    sys.setswitchinterval(100)
    t = threading.Thread(target=counter)
    t.start()
    try:
        time.sleep(0.05)
        before = count
        for _ in range(5):
            assert len(store.get(k)) == 32 << 20
        during = count - before
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert during > 0, "no Python ran while the gets were in progress"


def test_remove_all(store):
    ks = [key("all") for _ in range(3)]
    for k in ks:
        assert store.put(k, b"x") == 0
    assert store.remove_all(force=True) >= 3
    assert store.batch_is_exist(ks) == [0, 0, 0]


def test_token_roles(cluster, monkeypatch):
    """With the client token an engine puts and gets but cannot wipe the
    cluster; without a token it is refused everything."""
    monkeypatch.setenv("CRESCENT_TOKEN_FILE", str(cluster.client_token))
    s = MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", cluster.masters) == 0
    assert s.put("token-roles", b"client token") == 0
    assert s.get("token-roles") == b"client token"
    assert s.remove_all(force=True) == RPC_FAIL
    assert s.is_exist("token-roles") == 1, "remove_all must have changed nothing"
    s.close()
    monkeypatch.delenv("CRESCENT_TOKEN_FILE")
    s = MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", cluster.masters)
    assert rc != 0 or s.put("token-roles-2", b"x") < 0, "served without a token"
    if rc == 0:
        s.close()


def test_tls_is_required(cluster, monkeypatch):
    """The cluster runs mutual TLS: an engine that speaks clear text, or
    presents no client certificate, is not served."""
    for name in ("CRESCENT_TLS_CERT", "CRESCENT_TLS_KEY", "CRESCENT_TLS_CA"):
        monkeypatch.delenv(name)
    s = MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", cluster.masters)
    assert rc != 0 or s.put("tls-required", b"x") < 0, "served in clear text"
    if rc == 0:
        s.close()
    # Half a TLS set-up is a configuration error, not a silent clear-text client.
    monkeypatch.setenv("CRESCENT_TLS_CA", str(cluster.ca))
    s = MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", cluster.masters) != 0


def test_setup_from_a_mooncake_config_file(cluster, tmp_path, monkeypatch):
    """vLLM and SGLang write Mooncake's JSON (sizes as "4GB" strings, their
    own extra fields) and point MOONCAKE_CONFIG_PATH at it."""
    import json

    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps({
        "local_hostname": "localhost",
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": cluster.masters,
        "protocol": "tcp",
        "device_name": "",
        "global_segment_size": "0",
        "local_buffer_size": "16MB",
        "transfer_timeout": 20,
    }))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    s = MooncakeDistributedStore()
    assert s.setup() == 0
    round_trip_then_close(s, b"configured from the file")
    path.write_text(json.dumps({"master_server_address": cluster.masters, "global_segment_size": "lots"}))
    assert MooncakeDistributedStore().setup() == INVALID_PARAMS


def test_setup_dummy_uses_the_masters_from_the_environment(cluster, monkeypatch):
    """SGLang's standalone mode: the segment belongs to a separate store
    process; this client only talks to the masters and that store."""
    monkeypatch.setenv("MOONCAKE_MASTER", cluster.masters)
    s = MooncakeDistributedStore()
    assert s.setup_dummy(1 << 30, "16mb", "127.0.0.1:50052") == 0
    round_trip_then_close(s, b"via the standalone store")
    assert MooncakeDistributedStore().setup_dummy(-1, 1 << 20, "x") == INVALID_PARAMS


def test_reads_into_overlapping_or_read_only_memory_are_refused(store):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = mmap.PAGESIZE
    anon = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    # Read-only memory: puts may read it, gets may not write into it.
    ro = libc.mmap(None, 2 * page, mmap.PROT_READ, anon, -1, 0)
    assert ro not in (None, ctypes.c_void_p(-1).value)
    assert store.register_buffer(ro, 2 * page) == 0
    k = key("ro")
    assert store.put_from(k, ro, page) == 0
    assert store.get_into(k, ro, page) == INVALID_PARAMS
    assert store.batch_get_into([k], [ro], [page]) == [INVALID_PARAMS]
    assert store.unregister_buffer(ro) == 0
    # A range with an unmapped hole in the middle cannot be registered.
    rw = libc.mmap(None, 3 * page, mmap.PROT_READ | mmap.PROT_WRITE, anon, -1, 0)
    assert libc.munmap(rw + page, page) == 0
    assert store.register_buffer(rw, 3 * page) == INVALID_PARAMS
    assert store.register_buffer(rw, page) == 0
    # Two destinations of one batch that overlap would alias: refused whole.
    assert store.batch_get_into([k, k], [rw, rw + 100], [page // 2, page // 2]) == [INVALID_PARAMS] * 2
    assert store.batch_get_into([k], [rw], [page]) == [page]
    store.unregister_buffer(rw)
    libc.munmap(ro, 2 * page)
    libc.munmap(rw, page)
    libc.munmap(rw + 2 * page, page)


def test_a_key_twice_in_one_batch_put_is_one_object(store):
    buf = ctypes.create_string_buffer(b"first" + b"second", 11)
    base = ctypes.addressof(buf)
    assert store.register_buffer(base, 11) == 0
    k = key("dup")
    assert store.batch_put_from([k, k], [base, base + 5], [5, 6]) == [0, 0]
    assert store.get(k) == b"first"
    k2 = key("dup-copy")
    assert store.put_batch([k2, k2], [b"one", b"two"]) == 0
    assert store.get(k2) == b"one"
    store.unregister_buffer(base)


def live_segments(cluster):
    status, text = cluster.http_get("/metrics")
    assert status == 200, text
    for line in text.splitlines():
        if line.startswith("master_segment_count "):
            return int(float(line.split()[1]))
    raise AssertionError("/metrics lacks master_segment_count")


EXITS_WITH_A_SEGMENT = """
import os, sys
from crescent.store import MooncakeDistributedStore
s = MooncakeDistributedStore()
rc = s.setup("localhost", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", sys.argv[1])
assert rc == 0, rc
assert s.put("exit-" + os.urandom(4).hex(), b"x" * 4096) == 0
if sys.argv[2] == "drop":
    del s            # collected: Drop closes, and waits for it
    os._exit(0)      # no atexit hooks
# else: exits with `s` still open; the exit hook closes it
"""


@pytest.mark.parametrize("how", ["drop", "exit"])
def test_a_process_that_never_calls_close_unmounts_its_segment(cluster, how):
    # Before, Drop only started close() in the background and nothing ran
    # at exit: the segment stayed mounted until the client TTL (10 s), and
    # puts placed on it meanwhile failed.
    import subprocess

    before = live_segments(cluster)
    subprocess.run(
        [sys.executable, "-c", EXITS_WITH_A_SEGMENT, cluster.masters, how],
        check=True,
        timeout=60,
    )
    deadline = time.monotonic() + 3
    while live_segments(cluster) != before:
        assert time.monotonic() < deadline, (
            f"{how}: the exited process's segment is still mounted 3 s after it exited"
        )
        time.sleep(0.1)
