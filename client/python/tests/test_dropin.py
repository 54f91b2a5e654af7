"""The drop-in step: with the `crescent-mooncake-compat` distribution
installed instead of Mooncake's wheel, code written only against
`mooncake.store` runs unchanged against Crescent."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("engine_sequences.py")


def test_mooncake_store_is_crescent():
    import crescent.store
    import mooncake.store as mooncake_store  # from client/python/mooncake-shim

    assert mooncake_store.MooncakeDistributedStore is crescent.store.MooncakeDistributedStore


def test_engine_sequences_run_unchanged(cluster):
    env = dict(os.environ, MOONCAKE_MASTER=cluster.masters)
    r = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "engine sequences: ok" in r.stdout
