"""Python vs Rust client, same cluster, same run.

Starts three masters and one store process (TCP) from --bin-dir, runs
`crescentctl bench data` (the Rust client) against them, then the same
operations through `crescent.store.MooncakeDistributedStore` from this one
Python process, and prints both with the ratio Python/Rust. Both clients
call themselves "<host>-remote" so bytes move over loopback TCP, and both
use zero-copy calls (Rust: put/get_into and put_batch/batch_get_into; Python:
put_from/get_into and batch_put_from/batch_get_into on registered buffers).

Then the tensor calls next to the byte calls they ride on, from Python:
put_tensor/get_tensor of a 1 MiB and a 16 MiB tensor (torch if installed,
else numpy) against put/get of bytes of the same size.

    make bench-python        # release wheel and binaries
"""

import argparse
import ctypes
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster import Cluster  # noqa: E402

from crescent.store import MooncakeDistributedStore, ReplicateConfig  # noqa: E402

# (size, batch): single 4 KiB, batch-128 of 4 KiB, 1 MiB and 16 MiB singles.
CASES = [(4 << 10, 1), (4 << 10, 128), (1 << 20, 1), (16 << 20, 1)]
BYTES_PER_RUN = 512 << 20
MAX_OPS = 2000


def ops_for(size, batch):
    """The Rust bench's operation count for one client."""
    ops = min(max(BYTES_PER_RUN // size, 4), MAX_OPS)
    return -(-ops // batch) * batch


def pct(sorted_ms, p):
    if not sorted_ms:
        return 0.0
    return sorted_ms[min(len(sorted_ms) - 1, int(round(p * (len(sorted_ms) - 1))))]


def rust_rows(cluster, bin_dir):
    rows = {}
    for sizes, batches in (("4kb", "1,128"), ("1mb,16mb", "1")):
        out = subprocess.run(
            [str(bin_dir / "crescentctl"), "--json", "bench", "data", "--masters", cluster.masters,
             "--sizes", sizes, "--batch", batches, "--clients", "1", "--transports", "tcp"],
            capture_output=True, text=True, timeout=1800, check=True,
        )
        doc = json.loads(out.stdout)
        ceilings = (doc["loopback_tcp_gb_per_s"], doc["memcpy_gb_per_s"])
        for r in doc["results"]:
            rows[(r["size"], r["batch"], r["op"])] = dict(r, gbps=r["gb_per_s"])
    return rows, ceilings


def python_rows(cluster):
    store = MooncakeDistributedStore()
    rc = store.setup(f"{socket.gethostname()}-remote", "P2PHANDSHAKE", 0, 64 << 20, "tcp", "",
                     cluster.masters)
    assert rc == 0, f"setup returned {rc}"
    cfg = ReplicateConfig(replica_num=1)
    rows = {}
    for size, batch in CASES:
        ops = ops_for(size, batch)
        src = ctypes.create_string_buffer(bytes(i % 251 for i in range(size)), size)
        dst = ctypes.create_string_buffer(size * batch)
        s_ptr, d_ptr = ctypes.addressof(src), ctypes.addressof(dst)
        assert store.register_buffer(s_ptr, size) == 0
        assert store.register_buffer(d_ptr, size * batch) == 0
        prefix = f"bench-py/{uuid.uuid4().hex[:8]}/"
        for op in ("put", "get"):
            lat_ms, errors = [], 0
            start = time.perf_counter()
            for first in range(0, ops, batch):
                keys = [f"{prefix}{i}" for i in range(first, first + batch)]
                t = time.perf_counter()
                if batch == 1:
                    if op == "put":
                        errors += store.put_from(keys[0], s_ptr, size, cfg) != 0
                    else:
                        errors += store.get_into(keys[0], d_ptr, size) != size
                else:
                    if op == "put":
                        rcs = store.batch_put_from(keys, [s_ptr] * batch, [size] * batch, cfg)
                        errors += sum(r != 0 for r in rcs)
                    else:
                        got = store.batch_get_into(keys, [d_ptr + i * size for i in range(batch)],
                                                   [size] * batch)
                        errors += sum(n != size for n in got)
                lat_ms.append((time.perf_counter() - t) * 1000)
            elapsed = time.perf_counter() - start
            lat_ms.sort()
            rows[(size, batch, op)] = {
                "ops": ops, "gbps": ops * size / elapsed / 1e9, "p50_ms": pct(lat_ms, 0.5),
                "p99_ms": pct(lat_ms, 0.99), "errors": errors,
            }
        if op == "get" and batch == 1 and size <= 4096:
            assert dst.raw[:size] == src.raw[:size], "bytes read back differ"
        store.remove_by_regex("^" + prefix, force=True)
        store.unregister_buffer(s_ptr)
        store.unregister_buffer(d_ptr)
    store.close()
    return rows


def tensor_rows(cluster):
    """Per size and op: GB/s of the tensor call and of the byte call."""
    try:
        import torch

        make = lambda n: torch.arange(n, dtype=torch.int32) % 251  # noqa: E731
        lib = f"torch {torch.__version__}"
    except ImportError:
        import numpy as np

        make = lambda n: np.arange(n, dtype=np.int32) % 251  # noqa: E731
        lib = f"numpy {np.__version__} (torch is not installed)"
    store = MooncakeDistributedStore()
    rc = store.setup(f"{socket.gethostname()}-remote", "P2PHANDSHAKE", 0, 64 << 20, "tcp", "",
                     cluster.masters)
    assert rc == 0, f"setup returned {rc}"
    rows = []
    for size in (1 << 20, 16 << 20):
        ops = ops_for(size, 1)
        tensor = make(size // 4)
        value = bytes(tensor.numpy() if hasattr(tensor, "numpy") else tensor)
        prefix = f"bench-py-tensor/{uuid.uuid4().hex[:8]}/"
        calls = {
            "bytes": (lambda k: store.put(k, value) == 0, lambda k: len(store.get(k)) == size),
            "tensor": (lambda k: store.put_tensor(k, tensor) == 0, lambda k: store.get_tensor(k) is not None),
        }
        # Two rounds in opposite orders (bytes, tensor; tensor, bytes), so
        # neither call gets the warmer segment; the rate is the mean.
        seconds, errors = {}, 0
        for rnd, kinds in enumerate((("bytes", "tensor"), ("tensor", "bytes"))):
            for kind in kinds:
                put, get = calls[kind]
                for op, call in (("put", put), ("get", get)):
                    start = time.perf_counter()
                    errors += sum(not call(f"{prefix}{kind}/{rnd}/{i}") for i in range(ops))
                    seconds[(kind, op)] = seconds.get((kind, op), 0.0) + time.perf_counter() - start
        gbps = {k: 2 * ops * size / t / 1e9 for k, t in seconds.items()}
        for op in ("put", "get"):
            rows.append({"size": size, "op": op, "ops": ops, "bytes_gbps": gbps[("bytes", op)],
                         "tensor_gbps": gbps[("tensor", op)],
                         "tensor_over_bytes": gbps[("tensor", op)] / gbps[("bytes", op)], "errors": errors})
        store.remove_by_regex("^" + prefix, force=True)
    store.close()
    return lib, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", type=Path, default=Path(__file__).resolve().parents[3] / "target" / "release")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="crescent-pybench-"))
    cluster = Cluster(root, bin_dir=args.bin_dir, segment_size="3gb", lease_ttl="10s")
    cluster.start()
    try:
        # A first pass, discarded, faults in the store segment's pages, so
        # neither measured client pays first-touch costs the other does not.
        print("warm-up pass (discarded) ...", file=sys.stderr)
        rust_rows(cluster, args.bin_dir)
        print("running the Rust client (crescentctl bench data) ...", file=sys.stderr)
        rust, (tcp_ceiling, memcpy) = rust_rows(cluster, args.bin_dir)
        print("running the Python client ...", file=sys.stderr)
        py = python_rows(cluster)
        print("running the Python tensor calls ...", file=sys.stderr)
        tensor_lib, tensors = tensor_rows(cluster)
    finally:
        cluster.stop()
    out = []
    for size, batch in CASES:
        for op in ("put", "get"):
            r, p = rust[(size, batch, op)], py[(size, batch, op)]
            out.append({
                "size": size, "batch": batch, "op": op, "ops": p["ops"],
                "rust_p50_ms": r["p50_ms"], "py_p50_ms": p["p50_ms"],
                "rust_p99_ms": r["p99_ms"], "py_p99_ms": p["p99_ms"],
                "rust_gbps": r["gbps"], "py_gbps": p["gbps"],
                "rust_objects_per_s": r["gbps"] * 1e9 / size, "py_objects_per_s": p["gbps"] * 1e9 / size,
                "py_over_rust_throughput": p["gbps"] / r["gbps"] if r["gbps"] else 0.0,
                "errors": p["errors"] + r["errors"],
            })
    if args.json:
        print(json.dumps({"loopback_tcp_gb_per_s": tcp_ceiling, "memcpy_gb_per_s": memcpy, "rows": out,
                          "tensor_library": tensor_lib, "tensor_rows": tensors}, indent=2))
        return
    print(f"ceilings (same run): loopback TCP {tcp_ceiling:.2f} GB/s, memcpy {memcpy:.2f} GB/s")
    print("one client process, 3 masters + 1 store over loopback TCP; zero-copy calls on both sides")
    print(f"{'case':<22}{'op':<5}{'Rust p50/p99 ms':>18}{'Python p50/p99 ms':>20}"
          f"{'Rust':>14}{'Python':>14}{'Py/Rust':>9}")
    for r in out:
        case = f"{r['size'] >> 10} KiB" if r["size"] < 1 << 20 else f"{r['size'] >> 20} MiB"
        case += f" x{r['batch']}" if r["batch"] > 1 else " single"
        if r["size"] < 1 << 20:
            rate = lambda x: f"{x:,.0f} obj/s"  # noqa: E731
            rt, pt = rate(r["rust_objects_per_s"]), rate(r["py_objects_per_s"])
        else:
            rt, pt = f"{r['rust_gbps']:.2f} GB/s", f"{r['py_gbps']:.2f} GB/s"
        print(f"{case:<22}{r['op']:<5}{r['rust_p50_ms']:>8.3f} /{r['rust_p99_ms']:>7.3f}"
              f"{r['py_p50_ms']:>10.3f} /{r['py_p99_ms']:>7.3f}{rt:>14}{pt:>14}"
              f"{r['py_over_rust_throughput']:>8.2f}x")
    print(f"\ntensor calls next to byte calls, Python, {tensor_lib} (put/get of bytes is the ceiling)")
    print(f"{'case':<22}{'op':<5}{'bytes':>14}{'tensor':>14}{'tensor/bytes':>14}")
    for r in tensors:
        print(f"{r['size'] >> 20} MiB single{'':<11}{r['op']:<5}{r['bytes_gbps']:>9.2f} GB/s"
              f"{r['tensor_gbps']:>9.2f} GB/s{r['tensor_over_bytes']:>13.2f}x")
    failed = [r for r in out + tensors if r["errors"]]
    for r in failed:
        print(f"errors: {r['errors']} in {r['size']}-byte x{r.get('batch', 1)} {r['op']}", file=sys.stderr)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
