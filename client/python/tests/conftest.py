"""Fixtures: a real Crescent cluster (harness/cluster.py) for the session,
and a store client set up against it."""

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
from cluster import Cluster  # noqa: E402


@pytest.fixture(scope="session")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="crescent-pytest-"))
    c = Cluster(root)
    try:
        c.start()
    except BaseException:
        c.stop()
        for f in sorted(root.glob("*.log")):
            print(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}")
        raise
    yield c
    c.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def store(cluster):
    from crescent.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", 0, 64 << 20, "tcp", "", cluster.masters)
    assert rc == 0, f"setup returned {rc}"
    yield s
    s.close()


@pytest.fixture(params=["numpy", "torch"])
def lib(request, monkeypatch):
    """The array library a tensor test builds its values with and gets back:
    numpy (what a process without torch gets), and torch where installed."""
    if request.param == "torch":
        return pytest.importorskip("torch")
    import numpy

    import crescent.tensor

    monkeypatch.setattr(crescent.tensor, "_torch", lambda: None)
    return numpy
