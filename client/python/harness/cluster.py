"""A real local Crescent cluster for the Python tests and benchmark: three
master processes (static peers) and one store process (TCP), started from the
workspace's binaries on free loopback ports, secured as a production cluster
is (tokens and mutual TLS). Test and benchmark code only:
it is not part of the `crescent` package an engine installs."""

import os
import socket
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
BIN = Path(os.environ.get("CRESCENT_BIN_DIR", REPO / "target" / "debug"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, check, timeout=60.0, interval=0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as e:  # noqa: BLE001 - reported below if it never succeeds
            last = e
        time.sleep(interval)
    raise TimeoutError(f"{what} not ready after {timeout} s (last error: {last!r})")


class Cluster:
    def __init__(
        self,
        root: Path,
        bin_dir: Path = None,
        segment_size: str = "256mb",
        lease_ttl: str = "1s",
        master_extra=(),
        store_extra=(),
    ):
        self.master_extra = list(master_extra)
        self.store_extra = list(store_extra)
        self.bin = Path(bin_dir or BIN)
        self.segment_size = segment_size
        self.lease_ttl = lease_ttl
        self.root = root
        self.procs = []
        self.master_ports = [free_port() for _ in range(3)]
        self.masters = ",".join(f"127.0.0.1:{p}" for p in self.master_ports)
        self.store_port = free_port()
        self.http_ports = [free_port() for _ in range(3)]

    def spawn(self, name, args, env=None):
        log = open(self.root / f"{name}.log", "wb")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.procs.append((name, p, log))
        return p

    def start(self):
        for exe in ("crescent-master", "crescent-store", "crescentctl"):
            if not (self.bin / exe).exists():
                raise RuntimeError(f"{self.bin / exe} is missing: run `cargo build --bins` first")
        # Token mode, as a real cluster runs: the store presents the client
        # token, crescentctl and this process's clients the admin token
        # (MooncakeDistributedStore.setup reads CRESCENT_TOKEN_FILE): the
        # engines' sequences end with remove_all, which needs the admin role.
        self.tokens = self.init_credentials("tokens")
        self.client_token = self.tokens / "client.token"
        self.admin_token = self.tokens / "admin.token"
        os.environ["CRESCENT_TOKEN_FILE"] = str(self.admin_token)
        # Mutual TLS on every gRPC connection, also as a real cluster runs:
        # masters and the store present the node certificate, this
        # process's clients and crescentctl the client certificate (setup
        # reads CRESCENT_TLS_CERT, CRESCENT_TLS_KEY and CRESCENT_TLS_CA).
        self.certs = self.init_credentials("certs")
        self.ca = self.certs / "ca.pem"
        node_tls = [
            "--tls-cert", str(self.certs / "node.pem"),
            "--tls-key", str(self.certs / "node.key"),
            "--tls-ca", str(self.ca),
        ]
        os.environ["CRESCENT_TLS_CERT"] = str(self.certs / "client.pem")
        os.environ["CRESCENT_TLS_KEY"] = str(self.certs / "client.key")
        os.environ["CRESCENT_TLS_CA"] = str(self.ca)
        peers = ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(self.master_ports))
        for i, port in enumerate(self.master_ports):
            self.spawn(
                f"master-{i + 1}",
                [
                    str(self.bin / "crescent-master"),
                    "--node-id", str(i + 1),
                    "--listen", f"127.0.0.1:{port}",
                    "--http", f"127.0.0.1:{self.http_ports[i]}",
                    "--data-dir", str(self.root / f"master-{i + 1}"),
                    "--peers", peers,
                    # Short read leases so non-forced removes in the tests
                    # are not refused for Mooncake's usual seconds.
                    "--lease-ttl", self.lease_ttl,
                    "--token-file", str(self.client_token),
                    "--admin-token-file", str(self.admin_token),
                    "--cluster-token-file", str(self.tokens / "cluster.token"),
                    *node_tls,
                    *self.master_extra,
                ],
            )
        wait_until("a leader", lambda: self.ctl("leader").returncode == 0)
        self.spawn(
            "store",
            [
                str(self.bin / "crescent-store"),
                "--master", self.masters,
                "--listen", f"127.0.0.1:{self.store_port}",
                "--http", f"127.0.0.1:{free_port()}",
                "--segment-size", self.segment_size,
                "--token-file", str(self.client_token),
                *node_tls,
                *self.store_extra,
            ],
        )
        wait_until("the store's segment", self.can_put)

    def init_credentials(self, kind):
        """`crescentctl tokens|certs init` into a fresh directory under the root."""
        directory = self.root / kind
        subprocess.run(
            [str(self.bin / "crescentctl"), kind, "init", str(directory)],
            check=True,
            capture_output=True,
            timeout=30,
        )
        return directory

    def http_get(self, path):
        """GET `path` from the first master's HTTPS port: (status, text)."""
        import ssl
        import urllib.error
        import urllib.request

        token = self.admin_token.read_text().strip()
        request = urllib.request.Request(
            f"https://127.0.0.1:{self.http_ports[0]}{path}",
            headers={"Authorization": f"Bearer {token}"},
        )
        trust = ssl.create_default_context(cafile=str(self.ca))
        try:
            with urllib.request.urlopen(request, timeout=10, context=trust) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def ctl(self, *args):
        return subprocess.run(
            [
                str(self.bin / "crescentctl"),
                "--master", self.masters,
                "--token-file", str(self.admin_token),
                *args,
            ],
            capture_output=True,
            timeout=30,
        )

    def can_put(self):
        r = self.ctl("put", "conftest-probe", "ok")
        return r.returncode == 0

    def stop(self):
        for _, p, _ in self.procs:
            p.terminate()
        for name, p, log in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
            log.close()


