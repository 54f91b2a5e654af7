"""The disk tier from Python: a store with a disk segment, masters that
demote early; replica descriptors say which replicas are on disk (as vLLM's
connector asks), and objects read back right from either tier."""

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from cluster import Cluster, wait_until

BLOCK = 256 << 10


@pytest.fixture(scope="module")
def disk_store():
    saved = dict(os.environ)
    root = Path(tempfile.mkdtemp(prefix="crescent-pytest-disk-"))
    c = Cluster(
        root,
        segment_size="4mb",
        master_extra=[
            "--eviction-high-watermark", "0.5",
            "--eviction-ratio", "0.3",
            "--demotion-timeout", "15s",
            # The descriptors are asked for again and again: with promotion
            # on, objects read twice would gain memory replicas meanwhile.
            "--promotion-reads", "0",
        ],
        store_extra=["--disk-path", str(root / "disk"), "--disk-size", "64mb"],
    )
    try:
        c.start()
        from crescent.store import MooncakeDistributedStore

        s = MooncakeDistributedStore()
        assert s.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", c.masters) == 0
        yield s
        s.close()
    except BaseException:
        for f in sorted(root.glob("*.log")):
            print(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}")
        raise
    finally:
        c.stop()
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(root, ignore_errors=True)


def value(i: int) -> bytes:
    return bytes((i * 7 + j) % 251 for j in range(256)) * (BLOCK // 256)


def test_objects_past_the_watermark_are_disk_replicas_and_read_back(disk_store):
    s = disk_store
    keys = [f"py-block-{i}" for i in range(48)]  # 12 MiB through 4 MiB of memory
    for i, k in enumerate(keys):
        wait_until(f"put {k}", lambda k=k, i=i: s.put(k, value(i)) == 0, timeout=60, interval=0.05)

    def demoted():
        descs = s.batch_get_replica_desc(keys)
        return [k for k in keys if descs[k] and all(d.is_disk_replica() for d in descs[k])]

    wait_until("some objects on disk", lambda: len(demoted()) >= 20, timeout=30)
    descs = s.batch_get_replica_desc(keys + ["py-missing"])
    assert descs["py-missing"] == []
    on_disk = demoted()
    for k in on_disk:
        d = descs[k][0]
        assert d.is_disk_replica() and not d.is_memory_replica() and not d.is_local_disk_replica()
        assert d.size == BLOCK and d.segment_name.endswith("-disk")
    in_memory = [k for k in keys if descs[k] and descs[k][0].is_memory_replica()]
    assert in_memory, "the newest objects are still in memory"
    for i, k in enumerate(keys):
        assert s.get(k) == value(i), k
    single = s.get_replica_desc(on_disk[0])
    assert len(single) == 1 and single[0].is_disk_replica()
    assert "disk" in repr(single[0])
    # A disk object is removed like any other.
    assert s.remove(on_disk[0], True) == 0
    time.sleep(0.1)
    assert s.get_replica_desc(on_disk[0]) == []
