//! Local etcd, master and store processes for tests, benchmarks and chaos
//! runs: free loopback ports, a temp dir per cluster, logs, pauses, SIGKILL
//! and restart. Every child process is a [`ManagedChild`], the one place
//! that spawns, signals, kills and reaps.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crescent_client::MasterClient;

/// Finds one of our binaries: `$CRESCENT_<NAME>_BIN`, next to the running
/// executable (or its parent, for test binaries in `target/*/deps`), else PATH.
///
/// Tests of the package that builds a binary use cargo's
/// `CARGO_BIN_EXE_<name>` instead (the chaos tests do, and hand it on as
/// `CRESCENT_CHAOS_BIN`); cargo offers that only within one package (artifact
/// dependencies are unstable), so the masters, stores and `crescentctl` that
/// these tests start are found here, after `cargo build --bins`.
pub fn find_binary(name: &str) -> anyhow::Result<PathBuf> {
    let env = format!(
        "CRESCENT_{}_BIN",
        name.trim_start_matches("crescent-")
            .replace('-', "_")
            .to_uppercase()
    );
    if let Ok(p) = std::env::var(&env) {
        return Ok(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        let mut dir = exe.parent().map(Path::to_path_buf);
        for _ in 0..2 {
            if let Some(d) = &dir {
                let candidate = d.join(name);
                if candidate.is_file() {
                    return Ok(candidate);
                }
                dir = d.parent().map(Path::to_path_buf);
            }
        }
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for p in std::env::split_paths(&paths) {
            let c = p.join(name);
            if c.is_file() {
                return Ok(c);
            }
        }
    }
    anyhow::bail!(
        "cannot find the {name} binary (build it with `cargo build --release`, or set {env})"
    )
}

/// A free loopback port: bound, then released for a child to bind.
///
/// The kernel may hand a released port out again at once, so a port this
/// process already handed out is never returned twice: a master's gRPC and
/// HTTP ports once came out equal, and that master died at start
/// ("Address already in use"). Another process may still take a port
/// between its release here and the child's bind; tests run few at a time.
///
/// Ports come from below the kernel's ephemeral range where there is room:
/// a process restarted on its port (a master, a store, an etcd member after
/// a kill) would otherwise find it taken by an outgoing connection's source
/// port, which the kernel picks from that range while nothing listens there
/// (a chaos run of 91 rolling restarts ended so: an etcd member was not
/// listening 15 s after its restart).
pub fn free_port() -> anyhow::Result<u16> {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let take = |port: u16| {
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        handed_out.insert(port)
    };
    if let Some(range) = ports_below_ephemeral() {
        let span = u32::from(range.end - range.start);
        let first = start_offset() % span;
        for step in 0..1024 {
            let port = range.start + ((first + step) % span) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() && take(port) {
                return Ok(port);
            }
        }
    }
    for _ in 0..256 {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if take(port) {
            return Ok(port);
        }
    }
    anyhow::bail!("no loopback port this process has not handed out already, after 256 tries")
}

/// The lowest port [`free_port`] hands out from below the ephemeral range.
const LOWEST_TEST_PORT: u16 = 10_000;

/// `LOWEST_TEST_PORT..` the start of the kernel's ephemeral port range, or
/// None when that range is unknown or leaves fewer than 1,000 ports below it.
/// Read once per process.
fn ports_below_ephemeral() -> Option<std::ops::Range<u16>> {
    static RANGE: std::sync::OnceLock<Option<std::ops::Range<u16>>> = std::sync::OnceLock::new();
    RANGE
        .get_or_init(|| {
            let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
            let low: u16 = text.split_whitespace().next()?.parse().ok()?;
            (low >= LOWEST_TEST_PORT + 1_000).then_some(LOWEST_TEST_PORT..low)
        })
        .clone()
}

/// Where this process starts looking: differs between processes (tests run
/// as parallel processes) and between runs.
fn start_offset() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as u32
}

/// One child process: its command line, the log file its stdout and stderr
/// are appended to, and the running process if any. Dropping it kills and
/// reaps the process.
pub struct ManagedChild {
    binary: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log_path: PathBuf,
    child: Option<Child>,
}

impl ManagedChild {
    /// Not started yet.
    pub fn new(binary: PathBuf, args: Vec<String>, log_path: PathBuf) -> Self {
        Self {
            binary,
            args,
            env: Vec::new(),
            log_path,
            child: None,
        }
    }

    /// Sets an environment variable for every start.
    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Sets (or replaces) an environment variable for the next starts.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_string(), value.to_string()));
    }

    /// Changes the command line of the next start (a restart with other
    /// flags).
    pub fn edit_args(&mut self, edit: impl FnOnce(&mut Vec<String>)) {
        edit(&mut self.args);
    }

    /// Starts the process unless it is running; a killed or exited one starts
    /// again with the same command line and log.
    pub fn start(&mut self) -> anyhow::Result<()> {
        if self.is_running() {
            return Ok(());
        }
        self.reap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)?;
        let child = Command::new(&self.binary)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", self.binary.display()))?;
        self.child = Some(child);
        Ok(())
    }

    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// How the process ended, once it has; `None` while it runs (or before
    /// its first start).
    pub fn exit_status(&mut self) -> anyhow::Result<Option<std::process::ExitStatus>> {
        match &mut self.child {
            Some(c) => Ok(c.try_wait()?),
            None => Ok(None),
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL and reap; nothing to do when it is not running.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
    }

    /// SIGSTOP: it keeps its sockets and memory but runs no code.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGSTOP)
    }

    /// SIGCONT a paused process.
    pub fn resume(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGCONT)
    }

    /// SIGHUP: masters and stores re-read their token files.
    pub fn hangup(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGHUP)
    }

    fn signal(&self, signal: libc::c_int) -> anyhow::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| anyhow::anyhow!("{} is not running", self.binary.display()))?;
        // SAFETY: kill(2) on a pid we spawned and have not reaped.
        let rc = unsafe { libc::kill(pid as libc::pid_t, signal) };
        anyhow::ensure!(
            rc == 0,
            "kill({pid}, {signal}): {}",
            std::io::Error::last_os_error()
        );
        Ok(())
    }

    /// Collects an exited process so it leaves no zombie.
    fn reap(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

impl Drop for ManagedChild {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub struct MasterProcess {
    pub id: u64,
    pub addr: String,
    pub http: String,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    process: ManagedChild,
}

impl MasterProcess {
    /// A master `id` on loopback `port` (HTTP on `http`), data under `root`;
    /// `flags` follow the common ones. Not started yet.
    fn new(
        binary: &Path,
        root: &Path,
        id: u64,
        port: u16,
        http: u16,
        flags: Vec<String>,
    ) -> anyhow::Result<Self> {
        let data_dir = root.join(format!("master-{id}"));
        std::fs::create_dir_all(&data_dir)?;
        let mut args = vec![
            "--node-id".into(),
            id.to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--http".into(),
            format!("127.0.0.1:{http}"),
            "--data-dir".into(),
            data_dir.display().to_string(),
        ];
        args.extend(flags);
        let log_path = root.join(format!("master-{id}.log"));
        Ok(Self {
            id,
            addr: format!("127.0.0.1:{port}"),
            http: format!("127.0.0.1:{http}"),
            process: ManagedChild::new(binary.to_path_buf(), args, log_path.clone())
                .with_env("CRESCENT_LOG_FORMAT", "text"),
            log_path,
            data_dir,
        })
    }

    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }
}

/// A wall clock a test can step, for processes started with its
/// [`env`](Self::env): libfaketime (Debian's `libfaketime`) preloaded,
/// reading its offset from a file at most once a second. Only the wall
/// clock moves, as a real step (NTP, `date -s`) moves it: the monotonic
/// clock stays true.
pub struct FakeClock {
    file: PathBuf,
}

/// No extra environment, for [`LocalCluster`]'s constructors.
fn no_env(_id: u64) -> Vec<(String, String)> {
    Vec::new()
}

/// Where Debian's `libfaketime` puts the library.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

impl FakeClock {
    /// Starts at the true time; the offset file lives in `dir`.
    pub fn new(dir: &Path) -> anyhow::Result<Self> {
        anyhow::ensure!(
            Path::new(LIBFAKETIME).is_file(),
            "{LIBFAKETIME} is missing: install Debian's libfaketime (scripts/install-deps.sh does)"
        );
        let clock = Self {
            file: dir.join("faketime-offset"),
        };
        clock.set_offset_secs(0)?;
        Ok(clock)
    }

    /// The variables that put a process on this clock.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("LD_PRELOAD", LIBFAKETIME.to_string()),
            ("FAKETIME_TIMESTAMP_FILE", self.file.display().to_string()),
            ("FAKETIME_CACHE_DURATION", "1".to_string()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Steps the wall clock of every process on it to the true time plus
    /// `secs`; they see it within [`FakeClock::SEEN_WITHIN`].
    pub fn set_offset_secs(&self, secs: i64) -> anyhow::Result<()> {
        std::fs::write(&self.file, format!("{secs:+}\n"))?;
        Ok(())
    }

    /// How long a step takes to reach the processes (libfaketime's cache).
    pub const SEEN_WITHIN: Duration = Duration::from_millis(1_500);
}

/// An etcd cluster on loopback (Debian's `etcd-server`) of one or more
/// members, for tests, demos and chaos runs. Members can be killed and
/// restarted with their data.
pub struct LocalEtcd {
    /// The first member's client endpoint (`host:port`).
    pub endpoint: String,
    /// With TLS ([`start_tls`](Self::start_tls)): the certificates
    /// `crescentctl certs init` wrote, which etcd serves with and checks
    /// its clients against.
    pub certs: Option<PathBuf>,
    members: Vec<EtcdMember>,
    _dir: tempfile::TempDir,
}

struct EtcdMember {
    client: String,
    process: ManagedChild,
}

impl LocalEtcd {
    /// One member.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_cluster(1)
    }

    /// `n` members forming one cluster.
    pub fn start_cluster(n: usize) -> anyhow::Result<Self> {
        Self::start_members(n, false)
    }

    /// One member that serves its clients over TLS and accepts only clients
    /// with a certificate of its CA (`--client-cert-auth`); the certificates
    /// are written under its directory ([`certs`](Self::certs)).
    pub fn start_tls() -> anyhow::Result<Self> {
        Self::start_members(1, true)
    }

    fn start_members(n: usize, tls: bool) -> anyhow::Result<Self> {
        anyhow::ensure!(n >= 1, "an etcd cluster needs at least one member");
        let bin = which("etcd")
            .ok_or_else(|| anyhow::anyhow!("etcd not installed (apt-get install etcd-server)"))?;
        let dir = tempfile::Builder::new()
            .prefix("crescent-etcd-")
            .tempdir()?;
        let mut ports = Vec::new();
        for _ in 0..n {
            ports.push((free_port()?, free_port()?));
        }
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("etcd-{i}=http://127.0.0.1:{peer}"))
            .collect();
        let certs = if tls {
            let certs = dir.path().join("certs");
            write_certs(&certs)?;
            Some(certs)
        } else {
            None
        };
        let scheme = if tls { "https" } else { "http" };
        let mut members = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("etcd-{i}");
            let mut args = vec![
                "--name".to_string(),
                name.clone(),
                "--data-dir".into(),
                dir.path().join(&name).display().to_string(),
                "--listen-client-urls".into(),
                format!("{scheme}://127.0.0.1:{client}"),
                "--advertise-client-urls".into(),
                format!("{scheme}://127.0.0.1:{client}"),
                "--listen-peer-urls".into(),
                format!("http://127.0.0.1:{peer}"),
                "--initial-advertise-peer-urls".into(),
                format!("http://127.0.0.1:{peer}"),
                "--initial-cluster".into(),
                initial.join(","),
                "--initial-cluster-token".into(),
                "crescent-local".into(),
            ];
            if let Some(certs) = &certs {
                use crescent_auth::tls::{CA_CERT_FILE, NODE_CERT_FILE, NODE_KEY_FILE};
                args.extend([
                    "--cert-file".to_string(),
                    certs.join(NODE_CERT_FILE).display().to_string(),
                    "--key-file".into(),
                    certs.join(NODE_KEY_FILE).display().to_string(),
                    "--trusted-ca-file".into(),
                    certs.join(CA_CERT_FILE).display().to_string(),
                    "--client-cert-auth".into(),
                ]);
            }
            members.push(EtcdMember {
                client: format!("127.0.0.1:{client}"),
                process: ManagedChild::new(
                    bin.clone(),
                    args,
                    dir.path().join(format!("{name}.log")),
                ),
            });
        }
        let mut etcd = Self {
            endpoint: members[0].client.clone(),
            certs,
            members,
            _dir: dir,
        };
        for m in &mut etcd.members {
            m.process.start()?;
        }
        for m in &etcd.members {
            wait_listening(&m.client, Duration::from_secs(15))?;
        }
        Ok(etcd)
    }

    /// The directory of the members' data and logs (`etcd-<i>.log`).
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    /// Every member's client endpoint, comma-separated (`--etcd` takes this).
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| m.client.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// SIGKILL member `i` and reap it.
    pub fn kill(&mut self, i: usize) -> anyhow::Result<()> {
        self.members
            .get_mut(i)
            .ok_or_else(|| anyhow::anyhow!("no etcd member {i}"))?
            .process
            .kill()
    }

    /// Starts a killed member again with its data.
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        let m = self
            .members
            .get_mut(i)
            .ok_or_else(|| anyhow::anyhow!("no etcd member {i}"))?;
        if !m.process.is_running() {
            m.process.start()?;
            wait_listening(&m.client, Duration::from_secs(15))?;
        }
        Ok(())
    }

    /// `etcd://<endpoints>/<cluster>`.
    pub fn url(&self, cluster: &str) -> String {
        format!("etcd://{}/{cluster}", self.endpoints())
    }
}

/// Waits until something accepts TCP connections on `addr`.
pub fn wait_listening(addr: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while std::net::TcpStream::connect(addr).is_err() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "nothing listening on {addr} after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|p| p.join(name))
        .find(|p| p.is_file())
}

/// A `crescent-store` process.
pub struct StoreProcess {
    pub endpoint: String,
    /// Metrics/health HTTP address.
    pub http: String,
    pub log_path: PathBuf,
    process: ManagedChild,
}

impl StoreProcess {
    /// SIGKILL and reap. Its memory, and every replica in it, is gone.
    pub fn kill(&mut self) {
        if let Err(e) = self.process.kill() {
            eprintln!("harness: killing store {}: {e}", self.endpoint);
        }
    }

    /// Starts a killed store again on the same address (with a new, empty segment).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.process.start()
    }

    /// Sets `flag` to `value` for the next starts (replacing its value if
    /// the command line has it, else added): a restart with other flags.
    pub fn set_flag(&mut self, flag: &str, value: &str) {
        self.process
            .edit_args(|args| match args.iter().position(|a| a == flag) {
                Some(i) if i + 1 < args.len() => args[i + 1] = value.to_string(),
                _ => args.extend([flag.to_string(), value.to_string()]),
            });
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// SIGSTOP: it keeps its sockets and memory but neither serves nor heartbeats.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.process.pause()
    }

    /// SIGCONT a paused store.
    pub fn resume(&self) -> anyhow::Result<()> {
        self.process.resume()
    }

    /// SIGHUP: the store re-reads its token file.
    pub fn hangup(&self) -> anyhow::Result<()> {
        self.process.hangup()
    }
}

/// A master's flags for `tokens` (the directory `crescentctl tokens init`
/// writes), or `--insecure` without.
pub fn security_flags(tokens: Option<&Path>) -> Vec<String> {
    match tokens {
        None => vec!["--insecure".into()],
        Some(dir) => vec![
            "--token-file".into(),
            dir.join(crescent_auth::CLIENT_TOKEN_FILE)
                .display()
                .to_string(),
            "--admin-token-file".into(),
            dir.join(crescent_auth::ADMIN_TOKEN_FILE)
                .display()
                .to_string(),
            "--cluster-token-file".into(),
            dir.join(crescent_auth::CLUSTER_TOKEN_FILE)
                .display()
                .to_string(),
        ],
    }
}

/// N master processes on loopback sharing one `--peers` list, plus any stores.
pub struct LocalCluster {
    pub masters: Vec<MasterProcess>,
    pub stores: Vec<StoreProcess>,
    binary: PathBuf,
    _dir: Option<tempfile::TempDir>,
    pub root: PathBuf,
    /// The directory of client.token, admin.token and cluster.token in
    /// token mode; `None`: the masters run `--insecure`.
    pub tokens: Option<PathBuf>,
    /// The directory `crescentctl certs init` wrote when every gRPC
    /// connection is mutual TLS; `None`: plain HTTP/2.
    pub certs: Option<PathBuf>,
    /// Stores started from now on serve their data port with mutual TLS
    /// (`--data-tls`); on by default in a TLS cluster.
    pub data_tls: bool,
}

/// How a [`LocalCluster`]'s masters authenticate callers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Security {
    /// `--insecure`: no checks (most tests, which test other things).
    Insecure,
    /// Token mode with fresh tokens under the cluster's root.
    Tokens,
    /// Token mode, and mutual TLS on every gRPC connection with
    /// certificates `crescentctl certs init` writes under the root.
    TokensAndTls,
}

/// The `--tls-cert/--tls-key/--tls-ca` flags for the files `crescentctl
/// certs init` wrote in `dir`: the node pair for masters and stores, the
/// client pair for everything else.
pub fn tls_flags(dir: &Path, node: bool) -> Vec<String> {
    use crescent_auth::tls::*;
    let (cert, key) = if node {
        (NODE_CERT_FILE, NODE_KEY_FILE)
    } else {
        (CLIENT_CERT_FILE, CLIENT_KEY_FILE)
    };
    [
        ("--tls-cert", cert),
        ("--tls-key", key),
        ("--tls-ca", CA_CERT_FILE),
    ]
    .into_iter()
    .flat_map(|(flag, file)| [flag.to_string(), dir.join(file).display().to_string()])
    .collect()
}

/// Runs `crescentctl certs init dir`: a fresh CA and certificates.
pub fn write_certs(dir: &Path) -> anyhow::Result<()> {
    let out = std::process::Command::new(find_binary("crescentctl")?)
        .args(["certs", "init"])
        .arg(dir)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "crescentctl certs init failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

impl LocalCluster {
    /// Starts `n` masters (ids 1..=n) in a fresh temp dir. `extra` is appended
    /// to every master's flags.
    pub fn start(n: usize, extra: &[String]) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("crescent-cluster-")
            .tempdir()?;
        let root = dir.path().to_path_buf();
        let mut c = Self::start_in(&root, n, extra)?;
        c._dir = Some(dir);
        Ok(c)
    }

    /// [`start`](Self::start) in token mode: every process gets its token
    /// file; [`master_client`](Self::master_client) presents the client token.
    pub fn start_secured(n: usize, extra: &[String]) -> anyhow::Result<Self> {
        Self::start_as(n, extra, Security::Tokens)
    }

    /// [`start`](Self::start) with a choice of security.
    pub fn start_as(n: usize, extra: &[String], security: Security) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("crescent-cluster-")
            .tempdir()?;
        let root = dir.path().to_path_buf();
        let mut c = Self::start_mode(&root, n, extra, true, security, &no_env)?;
        c._dir = Some(dir);
        Ok(c)
    }

    /// Starts `n` masters that find each other through etcd (`--etcd`,
    /// `--cluster`), with no `--peers`.
    pub fn start_with_etcd(
        n: usize,
        etcd: &str,
        cluster: &str,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        Self::start_with_etcd_as(n, etcd, cluster, extra, Security::Insecure)
    }

    /// [`start_with_etcd`](Self::start_with_etcd) with a choice of security.
    pub fn start_with_etcd_as(
        n: usize,
        etcd: &str,
        cluster: &str,
        extra: &[String],
        security: Security,
    ) -> anyhow::Result<Self> {
        Self::start_with_etcd_env(n, etcd, cluster, extra, security, &no_env)
    }

    /// [`start_with_etcd_as`](Self::start_with_etcd_as), master `id` started
    /// with the environment variables `env(id)` (a [`FakeClock`]'s, say).
    pub fn start_with_etcd_env(
        n: usize,
        etcd: &str,
        cluster: &str,
        extra: &[String],
        security: Security,
        env: &dyn Fn(u64) -> Vec<(String, String)>,
    ) -> anyhow::Result<Self> {
        let mut args = vec![
            "--etcd".to_string(),
            etcd.to_string(),
            "--cluster".into(),
            cluster.to_string(),
        ];
        args.extend(extra.iter().cloned());
        let dir = tempfile::Builder::new()
            .prefix("crescent-cluster-")
            .tempdir()?;
        let root = dir.path().to_path_buf();
        let mut c = Self::start_mode(&root, n, &args, false, security, env)?;
        c._dir = Some(dir);
        Ok(c)
    }

    /// `n` masters through an etcd that speaks TLS ([`LocalEtcd::start_tls`]):
    /// tokens, mutual TLS with certificates of the etcd's CA, `--etcd-tls`.
    pub fn start_with_tls_etcd(
        n: usize,
        etcd: &LocalEtcd,
        cluster: &str,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let certs = etcd
            .certs
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("this etcd does not speak TLS"))?;
        let dir = tempfile::Builder::new()
            .prefix("crescent-cluster-")
            .tempdir()?;
        let root = dir.path().to_path_buf();
        // The cluster's certificates are the etcd's (`write_certs` keeps a
        // complete set it finds).
        std::fs::create_dir_all(root.join("certs"))?;
        for entry in std::fs::read_dir(certs)? {
            let entry = entry?;
            std::fs::copy(entry.path(), root.join("certs").join(entry.file_name()))?;
        }
        let mut args = vec![
            "--etcd".to_string(),
            etcd.endpoints(),
            "--cluster".into(),
            cluster.to_string(),
            "--etcd-tls".into(),
        ];
        args.extend(extra.iter().cloned());
        let mut c = Self::start_mode(&root, n, &args, false, Security::TokensAndTls, &no_env)?;
        c._dir = Some(dir);
        Ok(c)
    }

    /// [`start`](Self::start), master `id` started with the environment
    /// variables `env(id)` (`RUST_LOG`, say).
    pub fn start_with_env(
        n: usize,
        extra: &[String],
        env: &dyn Fn(u64) -> Vec<(String, String)>,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("crescent-cluster-")
            .tempdir()?;
        let root = dir.path().to_path_buf();
        let mut c = Self::start_mode(&root, n, extra, true, Security::Insecure, env)?;
        c._dir = Some(dir);
        Ok(c)
    }

    /// Like [`start`](Self::start) in a directory that is kept afterwards.
    pub fn start_in(root: &Path, n: usize, extra: &[String]) -> anyhow::Result<Self> {
        Self::start_mode(root, n, extra, true, Security::Insecure, &no_env)
    }

    fn start_mode(
        root: &Path,
        n: usize,
        extra: &[String],
        static_peers: bool,
        security: Security,
        env: &dyn Fn(u64) -> Vec<(String, String)>,
    ) -> anyhow::Result<Self> {
        let binary = find_binary("crescent-master")?;
        let tokens = match security {
            Security::Insecure => None,
            Security::Tokens | Security::TokensAndTls => {
                let dir = root.join("tokens");
                crescent_auth::write_token_files(&dir, false)?;
                Some(dir)
            }
        };
        let certs = match security {
            Security::TokensAndTls => {
                let dir = root.join("certs");
                write_certs(&dir)?;
                Some(dir)
            }
            _ => None,
        };
        let mut ports = Vec::new();
        for _ in 0..n {
            ports.push((free_port()?, free_port()?));
        }
        let peers = if n > 1 && static_peers {
            ports
                .iter()
                .enumerate()
                .map(|(i, (p, _))| format!("{}=127.0.0.1:{p}", i + 1))
                .collect::<Vec<_>>()
                .join(",")
        } else {
            String::new()
        };
        let mut masters = Vec::new();
        for (i, (port, http)) in ports.into_iter().enumerate() {
            let id = (i + 1) as u64;
            let mut flags = Vec::new();
            if static_peers {
                flags.extend(["--peers".to_string(), peers.clone()]);
            }
            flags.extend(security_flags(tokens.as_deref()));
            if let Some(dir) = &certs {
                flags.extend(tls_flags(dir, true));
            }
            flags.extend(extra.iter().cloned());
            let mut master = MasterProcess::new(&binary, root, id, port, http, flags)?;
            for (k, v) in env(id) {
                master.process.set_env(&k, &v);
            }
            masters.push(master);
        }
        let mut cluster = Self {
            masters,
            stores: Vec::new(),
            binary,
            _dir: None,
            root: root.to_path_buf(),
            tokens,
            data_tls: certs.is_some(),
            certs,
        };
        for m in &mut cluster.masters {
            m.process.start()?;
        }
        Ok(cluster)
    }

    /// Starts one more master (id `id`) with `--join`: it waits to be added
    /// with `crescentctl members add`. Returns its address.
    pub fn add_joining_master(&mut self, id: u64, extra: &[String]) -> anyhow::Result<String> {
        anyhow::ensure!(
            self.masters.iter().all(|m| m.id != id),
            "node id {id} already used"
        );
        let mut flags = vec!["--join".to_string()];
        flags.extend(security_flags(self.tokens.as_deref()));
        if let Some(dir) = &self.certs {
            flags.extend(tls_flags(dir, true));
        }
        flags.extend(extra.iter().cloned());
        let (port, http) = (free_port()?, free_port()?);
        let mut master = MasterProcess::new(&self.binary, &self.root, id, port, http, flags)?;
        master.process.start()?;
        let addr = master.addr.clone();
        self.masters.push(master);
        Ok(addr)
    }

    /// Starts a `crescent-store` against this cluster's masters; returns its index
    /// in `stores`. `extra` is appended to its flags (e.g. `--shm`).
    pub fn start_store(&mut self, segment_size: &str, extra: &[String]) -> anyhow::Result<usize> {
        self.start_store_at(&self.masters_arg(), segment_size, extra)
    }

    /// [`start_store`](Self::start_store) with environment variables (a
    /// [`FakeClock`]'s, say).
    pub fn start_store_env(
        &mut self,
        segment_size: &str,
        extra: &[String],
        env: &[(String, String)],
    ) -> anyhow::Result<usize> {
        self.start_store_with(&self.masters_arg(), segment_size, extra, env)
    }

    /// [`start_store`](Self::start_store) with `--master masters` (an
    /// `etcd://` address, say).
    pub fn start_store_at(
        &mut self,
        masters: &str,
        segment_size: &str,
        extra: &[String],
    ) -> anyhow::Result<usize> {
        self.start_store_with(masters, segment_size, extra, &[])
    }

    fn start_store_with(
        &mut self,
        masters: &str,
        segment_size: &str,
        extra: &[String],
        env: &[(String, String)],
    ) -> anyhow::Result<usize> {
        let binary = find_binary("crescent-store")?;
        let port = free_port()?;
        let http_port = free_port()?;
        let idx = self.stores.len();
        let log_path = self.root.join(format!("store-{idx}.log"));
        let mut args = vec![
            "--master".to_string(),
            masters.to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--segment-size".into(),
            segment_size.to_string(),
            "--http".into(),
            format!("127.0.0.1:{http_port}"),
        ];
        if let Some(token) = self.client_token_file() {
            args.extend(["--token-file".into(), token.display().to_string()]);
        }
        if let Some(dir) = &self.certs {
            args.extend(tls_flags(dir, true));
            if self.data_tls {
                args.push("--data-tls".into());
            }
        }
        args.extend(extra.iter().cloned());
        let mut process = ManagedChild::new(binary, args, log_path.clone());
        for (k, v) in env {
            process.set_env(k, v);
        }
        let mut store = StoreProcess {
            endpoint: format!("127.0.0.1:{port}"),
            http: format!("127.0.0.1:{http_port}"),
            process,
            log_path,
        };
        store.process.start()?;
        self.stores.push(store);
        Ok(idx)
    }

    /// Waits for a leader, starts one store of `segment_size` and waits until
    /// its segment is mounted: the set-up most tests begin with. Returns the
    /// leader's (id, address, term) as [`wait_for_leader`](Self::wait_for_leader).
    pub async fn with_mounted_store(
        &mut self,
        segment_size: &str,
    ) -> anyhow::Result<(u64, String, u64)> {
        let leader = self.wait_for_leader(Duration::from_secs(15)).await?;
        self.start_store(segment_size, &[])?;
        self.wait_for_segments(1, Duration::from_secs(15)).await?;
        Ok(leader)
    }

    /// The client token's file in token mode.
    pub fn client_token_file(&self) -> Option<PathBuf> {
        Some(self.tokens.as_ref()?.join(crescent_auth::CLIENT_TOKEN_FILE))
    }

    /// The admin token's file in token mode.
    pub fn admin_token_file(&self) -> Option<PathBuf> {
        Some(self.tokens.as_ref()?.join(crescent_auth::ADMIN_TOKEN_FILE))
    }

    /// The cluster (peer) token's file in token mode.
    pub fn cluster_token_file(&self) -> Option<PathBuf> {
        Some(
            self.tokens
                .as_ref()?
                .join(crescent_auth::CLUSTER_TOKEN_FILE),
        )
    }

    /// A client of the masters presenting the client token (if any).
    pub fn master_client(&self) -> anyhow::Result<MasterClient> {
        self.client_with_token(self.client_token_file().as_deref())
    }

    /// A client of the masters presenting the admin token (if any).
    pub fn admin_client(&self) -> anyhow::Result<MasterClient> {
        self.client_with_token(self.admin_token_file().as_deref())
    }

    /// A client of the masters presenting the first token in `file` (none
    /// without a file).
    pub fn client_with_token(&self, file: Option<&Path>) -> anyhow::Result<MasterClient> {
        let token = crescent_auth::BearerToken::from_optional_file(file)?;
        Ok(MasterClient::new(&self.masters_arg())?
            .with_token(token)
            .with_tls(self.client_tls()?.as_ref()))
    }

    /// The client certificate's TLS files when the cluster runs mutual TLS.
    pub fn client_tls(&self) -> anyhow::Result<Option<crescent_auth::tls::TlsFiles>> {
        Ok(match &self.certs {
            Some(dir) => Some(crescent_auth::tls::TlsFiles::client_in(dir)?),
            None => None,
        })
    }

    /// Waits until `n` segments are mounted (as the leader reports).
    pub async fn wait_for_segments(&self, n: u64, timeout: Duration) -> anyhow::Result<()> {
        let client = self.master_client()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(l) = client.get_leader().await {
                let r = client.node_status(&l.leader_addr).await;
                if let Ok(s) = r {
                    if s.segment_count >= n {
                        return Ok(());
                    }
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "fewer than {n} segments mounted after {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Comma list of every master's address.
    pub fn masters_arg(&self) -> String {
        self.masters
            .iter()
            .map(|m| m.addr.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn by_id(&mut self, id: u64) -> Option<&mut MasterProcess> {
        self.masters.iter_mut().find(|m| m.id == id)
    }

    fn process(&mut self, id: u64) -> anyhow::Result<&mut ManagedChild> {
        Ok(&mut self
            .by_id(id)
            .ok_or_else(|| anyhow::anyhow!("no master {id}"))?
            .process)
    }

    /// SIGKILL one master and reap it.
    pub fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        self.process(id)?.kill()
    }

    /// SIGHUP every master and store: they re-read their token files (and
    /// the TLS files they serve with).
    pub fn hangup_all(&mut self) -> anyhow::Result<()> {
        for m in &self.masters {
            m.process.hangup()?;
        }
        for s in &self.stores {
            s.hangup()?;
        }
        Ok(())
    }

    /// SIGSTOP one master: it keeps its sockets but answers nothing.
    pub fn pause(&mut self, id: u64) -> anyhow::Result<()> {
        self.process(id)?.pause()
    }

    /// SIGCONT a paused master.
    pub fn resume(&mut self, id: u64) -> anyhow::Result<()> {
        self.process(id)?.resume()
    }

    /// Starts a killed master again with the same id, address and data dir.
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        self.process(id)?.start()
    }

    /// Sets an environment variable for master `id`'s next starts.
    pub fn set_master_env(&mut self, id: u64, key: &str, value: &str) -> anyhow::Result<()> {
        self.process(id)?.set_env(key, value);
        Ok(())
    }

    /// Waits until some master names a leader that itself says it leads.
    pub async fn wait_for_leader(&self, timeout: Duration) -> anyhow::Result<(u64, String, u64)> {
        let client = self.master_client()?;
        let deadline = Instant::now() + timeout;
        loop {
            for m in &self.masters {
                let r = client.node_status(&m.addr).await;
                if let Ok(s) = r {
                    if s.role == crescent_proto::pb::Role::Leader as i32 {
                        return Ok((s.id, s.addr, s.term));
                    }
                }
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = self
                    .masters
                    .iter()
                    .map(|m| format!("{}", m.log_path.display()))
                    .collect();
                anyhow::bail!("no leader within {timeout:?}; logs: {}", logs.join(", "));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last lines of a master's log, for failure messages.
    pub fn log_tail(&self, id: u64, lines: usize) -> String {
        let Some(m) = self.masters.iter().find(|m| m.id == id) else {
            return String::new();
        };
        let text = std::fs::read_to_string(&m.log_path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Handed-out ports are distinct, bindable, and below the ephemeral
    /// range when the kernel leaves room there.
    #[test]
    fn free_ports_are_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..64).map(|_| free_port().unwrap()).collect();
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        if let Some(range) = ports_below_ephemeral() {
            assert!(
                ports.iter().all(|p| range.contains(p)),
                "{ports:?} not in {range:?}"
            );
        }
        for p in ports.iter().take(8) {
            TcpListener::bind(("127.0.0.1", *p)).expect("a handed-out port binds");
        }
    }
}
