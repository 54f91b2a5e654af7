"""The disk tier from Python: a store with a disk segment, masters that
demote early; replica descriptors say which replicas are on disk (as vLLM's
connector asks), and objects read back right from either tier. An engine
set up with Mooncake's enable_ssd_offload contributes a disk segment of its
own, which keeps its objects across the engine's restart."""

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from cluster import Cluster, wait_until

BLOCK = 256 << 10
# The disk_store cluster's masters, for tests that set up engines of their own.
MASTERS = ""


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
        global MASTERS
        MASTERS = c.masters
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
    # From the same answer: the leader goes on demoting meanwhile, so a
    # second lookup may find on disk a key this answer still has in memory.
    on_disk = [k for k in keys if descs[k] and all(d.is_disk_replica() for d in descs[k])]
    assert len(on_disk) >= 20, "demoted objects stay on disk until read"
    for k in on_disk:
        d = descs[k][0]
        assert d.is_disk_replica() and not d.is_memory_replica() and not d.is_local_disk_replica()
        assert d.size == BLOCK and d.segment_name.endswith("-disk")
    # And a memory replica says so. Not judged from the keys above: each
    # put that found memory full counts as an allocation failure, and every
    # eviction round that sees new ones demotes another share whatever the
    # watermark (Mooncake's rule), so on a slow machine the burst can empty
    # memory altogether. A put made once the demotions have made room lands
    # in memory.
    fresh = []

    def a_fresh_put_lands_in_memory():
        k = f"py-fresh-{len(fresh)}"
        fresh.append(k)
        assert s.put(k, value(len(fresh))) == 0
        d = s.get_replica_desc(k)
        return len(d) == 1 and d[0].is_memory_replica() and not d[0].is_disk_replica()

    wait_until("a fresh put in memory", a_fresh_put_lands_in_memory, timeout=15, interval=0.5)
    for i, k in enumerate(keys):
        assert s.get(k) == value(i), k
    single = s.get_replica_desc(on_disk[0])
    assert len(single) == 1 and single[0].is_disk_replica()
    assert "disk" in repr(single[0])
    # A disk object is removed like any other.
    assert s.remove(on_disk[0], True) == 0
    time.sleep(0.1)
    assert s.get_replica_desc(on_disk[0]) == []


def engine_with_disk(masters: str, directory) -> "MooncakeDistributedStore":  # noqa: F821
    from crescent.store import MooncakeDistributedStore

    e = MooncakeDistributedStore()
    rc = e.setup(
        "localhost", "P2PHANDSHAKE", 4 << 20, 16 << 20, "tcp", "", masters,
        enable_ssd_offload=True, ssd_offload_path=str(directory),
    )
    assert rc == 0, f"setup with enable_ssd_offload returned {rc}"
    return e


def test_an_engine_with_ssd_offload_keeps_its_disk_objects_across_its_restart(disk_store):
    from crescent.store import MooncakeDistributedStore, ReplicateConfig

    masters = MASTERS
    # Not the 16gb default: the file is pre-allocated. (The fixture puts
    # the environment back.)
    os.environ["CRESCENT_DISK_SIZE"] = "64mb"
    directory = Path(tempfile.mkdtemp(prefix="crescent-pytest-offload-"))
    try:
        engine = engine_with_disk(masters, directory)
        own = engine.get_hostname()  # its memory segment's name
        config = ReplicateConfig()
        config.preferred_segment = own
        keys = [f"py-offload-{i}" for i in range(32)]  # 8 MiB through 4 MiB of its memory
        for i, k in enumerate(keys):
            wait_until(f"put {k}", lambda k=k, i=i: engine.put(k, value(i), config) == 0, timeout=60, interval=0.05)

        def on_own_disk():
            descs = engine.batch_get_replica_desc(keys)
            return [k for k in keys if any(d.is_disk_replica() and d.segment_name == f"{own}-disk" for d in descs[k])]

        wait_until("objects on the engine's own disk", lambda: len(on_own_disk()) >= 8, timeout=30)
        kept = on_own_disk()
        for i, k in enumerate(keys):
            assert engine.get(k) == value(i), k
        # The engine stops and starts again on the same directory: its disk
        # objects are served again, with no re-put.
        assert engine.close() == 0
        engine = engine_with_disk(masters, directory)
        wait_until("the disk objects listed again", lambda: set(kept) <= set(on_own_disk()), timeout=30)
        for k in kept:
            assert disk_store.get(k) == value(keys.index(k)), k
        assert engine.close() == 0
        # A switch with no directory, or a directory that is a file, fails
        # setup rather than run with no disk tier.
        bad = MooncakeDistributedStore()
        assert bad.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", masters, enable_ssd_offload=True) != 0
        not_a_dir = directory / "file"
        not_a_dir.write_bytes(b"x")
        assert bad.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", masters, enable_ssd_offload=True, ssd_offload_path=str(not_a_dir)) != 0
        assert bad.health_check() == 1, "a failed setup leaves the store not set up"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
