"""Engine call sequences written only against Mooncake's module
(`from mooncake.store import ...`), as SGLang HiCache and LMCache call it.
Run as a script by test_dropin.py with MOONCAKE_MASTER set; exits non-zero
with a message on the first mismatch."""

import ctypes
import os
import sys
import uuid

from mooncake.store import MooncakeDistributedStore, ReplicateConfig

PAGE = 64 * 1024
PAGES = 16


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def sglang_hicache(prefix):
    store = MooncakeDistributedStore()
    # SGLang: setup by position from env-derived config, sizes as numbers.
    rc = store.setup(
        os.environ.get("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
        os.environ.get("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
        64 * 1024 * 1024,
        16 * 1024 * 1024,
        os.environ.get("MOONCAKE_PROTOCOL", "tcp"),
        os.environ.get("MOONCAKE_DEVICE", ""),
        os.environ["MOONCAKE_MASTER"],
    )
    check(rc == 0, f"sglang setup returned {rc}")
    # Warm-up round trip.
    warm = f"{prefix}-warmup"
    check(store.put(warm, b"warmup-value") == 0, "warm-up put")
    check(store.is_exist(warm) == 1, "warm-up is_exist")
    check(store.get(warm) == b"warmup-value", "warm-up get")
    # The host KV pool, registered once.
    pool = ctypes.create_string_buffer(2 * PAGES * PAGE)
    base = ctypes.addressof(pool)
    check(store.register_buffer(base, 2 * PAGES * PAGE) == 0, "register_buffer")
    pages = [os.urandom(PAGE) for _ in range(PAGES)]
    for i, p in enumerate(pages):
        ctypes.memmove(base + i * PAGE, p, PAGE)
    keys = [f"{prefix}-page-{i}" for i in range(PAGES)]
    check(store.batch_is_exist(keys) == [0] * PAGES, "nothing cached yet")
    cfg = ReplicateConfig()
    cfg.replica_num = 1
    cfg.group_ids = [0]
    rcs = store.batch_put_from(keys, [base + i * PAGE for i in range(PAGES)], [PAGE] * PAGES, cfg)
    check(rcs == [0] * PAGES, f"batch_put_from: {rcs}")
    check(store.batch_is_exist(keys) == [1] * PAGES, "all pages cached")
    dst = base + PAGES * PAGE
    got = store.batch_get_into(keys, [dst + i * PAGE for i in range(PAGES)], [PAGE] * PAGES)
    check(all(n > 0 for n in got), f"batch_get_into: {got}")
    check(pool.raw[PAGES * PAGE:] == b"".join(pages), "batch_get_into bytes")
    # K and V halves of a page as two buffers (the _multi_buffers variants).
    mk = [f"{prefix}-kv-{i}" for i in range(4)]
    half = PAGE // 2
    rcs = store.batch_put_from_multi_buffers(
        mk, [[base + i * PAGE, base + i * PAGE + half] for i in range(4)], [[half, half]] * 4
    )
    check(rcs == [0] * 4, f"batch_put_from_multi_buffers: {rcs}")
    ctypes.memset(dst, 0, PAGES * PAGE)
    got = store.batch_get_into_multi_buffers(
        mk, [[dst + i * PAGE, dst + i * PAGE + half] for i in range(4)], [[half, half]] * 4
    )
    check(got == [PAGE] * 4, f"batch_get_into_multi_buffers: {got}")
    check(pool.raw[PAGES * PAGE:PAGES * PAGE + 4 * PAGE] == b"".join(pages[:4]), "multi-buffer bytes")
    removed = store.remove_all(force=True)
    check(removed >= PAGES + 4 + 1, f"remove_all removed {removed}")
    check(store.batch_is_exist(keys) == [0] * PAGES, "gone after remove_all")
    check(store.unregister_buffer(base) == 0, "unregister_buffer")
    check(store.close() == 0, "close")


def lmcache(prefix):
    store = MooncakeDistributedStore()
    # LMCache: seven positional arguments, sizes from its config.
    rc = store.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", os.environ["MOONCAKE_MASTER"])
    check(rc == 0, f"lmcache setup returned {rc}")
    check(isinstance(store.get_hostname(), str), "get_hostname")
    chunk = 256 * 1024
    buf = ctypes.create_string_buffer(4 * chunk)
    base = ctypes.addressof(buf)
    check(store.register_buffer(base, 4 * chunk) == 0, "register_buffer")
    data = os.urandom(chunk)
    ctypes.memmove(base, data, chunk)
    k = f"{prefix}-chunk"
    check(store.put_from(k, base, chunk) == 0, "put_from")
    check(store.is_exist(k) == 1, "is_exist")
    check(store.get_into(k, base + chunk, chunk) == chunk, "get_into")
    check(buf.raw[chunk:2 * chunk] == data, "get_into bytes")
    check(store.put_parts(f"{k}-parts", data[:1000], data[1000:]) == 0, "put_parts")
    handles = store.batch_get_buffer([k, f"{k}-parts", f"{k}-missing"])
    check(handles[2] is None, "missing key has no buffer")
    for h in handles[:2]:
        view = memoryview(h)
        check(view.nbytes == chunk and bytes(view) == data, "batch_get_buffer bytes")
        check(h.size() == len(h) == chunk and h.ptr() != 0, "handle size/ptr")
    check(store.unregister_buffer(base) == 0, "unregister_buffer")
    check(store.close() == 0, "close")


if __name__ == "__main__":
    run = uuid.uuid4().hex[:8]
    sglang_hicache(f"sglang-{run}")
    lmcache(f"lmcache-{run}")
    print("engine sequences: ok")
