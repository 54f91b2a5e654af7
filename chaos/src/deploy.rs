//! Where a chaos run's processes live, and the faults that can be done to
//! them: local processes (kill, pause, restart) or containers on a private
//! Docker network (the same, plus partitions by disconnecting a container).
//!
//! Containers are driven with the `docker` CLI, which negotiates the API
//! version with the engine. (The `testcontainers` crate was the plan, but its
//! Docker client, bollard 0.20, speaks API 1.52 only, and the engine on these
//! machines, 20.10, refuses anything above 1.41.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crescent_integration::{find_binary, LocalCluster, LocalEtcd, ManagedChild, Security};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Containers,
    Processes,
}

/// What the workers need to know.
#[derive(Debug, Clone)]
pub struct WorkerPlan {
    pub workers: u32,
    pub tasks: u32,
    pub seed: u64,
    pub dir: PathBuf,
    pub max_duration: Duration,
}

/// How one worker ended.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkerExit {
    pub worker: u32,
    /// Its exit status; None when it had to be killed or none could be read.
    pub code: Option<i32>,
    /// It had already exited when the stop file was written.
    pub exited_early: bool,
    /// The last lines of its log, kept for a worker that ended badly.
    pub log_tail: String,
}

impl WorkerExit {
    fn new(worker: usize, code: Option<i32>, exited_early: bool, log: &str) -> Self {
        Self {
            worker: worker as u32,
            code,
            exited_early,
            log_tail: tail_lines(log, LOG_TAIL_LINES),
        }
    }

    pub fn ended_badly(&self) -> bool {
        self.exited_early || self.code != Some(0)
    }
}

/// The last `n` lines of `text`.
fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

const LOG_TAIL_LINES: usize = 20;

pub trait Deployment: Send {
    fn mode(&self) -> Mode;
    /// Whether partitions can be made.
    fn network_control(&self) -> bool;
    fn master_ids(&self) -> Vec<u64>;
    /// Master `id`'s gRPC address, reachable from this process.
    fn master_addr(&self, id: u64) -> String;
    /// Master `id`'s HTTP (metrics) address, reachable from this process.
    fn master_http(&self, id: u64) -> String;
    /// The client token's file when the masters run in token mode (`None`:
    /// `--insecure`).
    fn client_token_file(&self) -> Option<PathBuf> {
        None
    }
    fn kill_master(&mut self, id: u64) -> anyhow::Result<()>;
    fn start_master(&mut self, id: u64) -> anyhow::Result<()>;
    fn pause_master(&mut self, id: u64) -> anyhow::Result<()>;
    fn resume_master(&mut self, id: u64) -> anyhow::Result<()>;
    fn isolate_master(&mut self, id: u64) -> anyhow::Result<()>;
    fn heal_master(&mut self, id: u64) -> anyhow::Result<()>;
    fn kill_store(&mut self, idx: usize) -> anyhow::Result<()>;
    fn start_store(&mut self, idx: usize) -> anyhow::Result<()>;
    fn etcd_members(&self) -> usize;
    fn kill_etcd(&mut self, i: usize) -> anyhow::Result<()>;
    fn start_etcd(&mut self, i: usize) -> anyhow::Result<()>;
    fn start_workers(&mut self, plan: &WorkerPlan) -> anyhow::Result<()>;
    /// Asks the workers to stop (the stop file), waits for them and says how
    /// each ended.
    fn stop_workers(
        &mut self,
        plan: &WorkerPlan,
        timeout: Duration,
    ) -> anyhow::Result<Vec<WorkerExit>>;
    /// Copies every process's log into `dir`.
    fn collect_logs(&self, dir: &Path);
    fn teardown(&mut self);
}

fn stop_file(plan: &WorkerPlan) -> PathBuf {
    plan.dir.join("stop")
}

/// While this file exists in a run directory, workers favour a few hot keys.
pub fn focus_file(dir: &Path) -> PathBuf {
    dir.join("focus")
}

fn worker_args(
    plan: &WorkerPlan,
    i: u32,
    master: &str,
    dir: &str,
    token_file: Option<&Path>,
) -> Vec<String> {
    let token = token_file
        .map(|t| vec!["--token-file".to_string(), t.display().to_string()])
        .unwrap_or_default();
    let args = vec![
        "worker".into(),
        "--master".into(),
        master.into(),
        "--worker".into(),
        i.to_string(),
        "--tasks".into(),
        plan.tasks.to_string(),
        "--seed".into(),
        plan.seed.to_string(),
        "--out".into(),
        format!("{dir}/history-{i}.jsonl"),
        "--stop-file".into(),
        format!("{dir}/stop"),
        "--focus-file".into(),
        format!("{dir}/focus"),
        "--max-duration".into(),
        format!("{}s", plan.max_duration.as_secs().max(1)),
    ];
    args.into_iter().chain(token).collect()
}

// ------------------------------------------------------------- processes

/// etcd (3 members), 3 masters and 2 stores as local processes on loopback,
/// in token mode (every process and worker presents its token).
pub struct ProcessDeployment {
    etcd: LocalEtcd,
    cluster: LocalCluster,
    workers: Vec<ManagedChild>,
}

impl ProcessDeployment {
    pub fn start(master_flags: &[String]) -> anyhow::Result<Self> {
        let etcd = LocalEtcd::start_cluster(3)?;
        let mut cluster = LocalCluster::start_with_etcd_as(
            3,
            &etcd.endpoints(),
            "chaos",
            master_flags,
            Security::Tokens,
        )?;
        for _ in 0..2 {
            cluster.start_store("256mb", &[])?;
        }
        Ok(Self {
            etcd,
            cluster,
            workers: Vec::new(),
        })
    }
}

impl ProcessDeployment {
    fn master(&self, id: u64) -> Option<&crescent_integration::MasterProcess> {
        self.cluster.masters.iter().find(|m| m.id == id)
    }
}

impl Deployment for ProcessDeployment {
    fn mode(&self) -> Mode {
        Mode::Processes
    }
    fn network_control(&self) -> bool {
        false
    }
    fn master_ids(&self) -> Vec<u64> {
        self.cluster.masters.iter().map(|m| m.id).collect()
    }
    fn master_addr(&self, id: u64) -> String {
        self.master(id).map(|m| m.addr.clone()).unwrap_or_default()
    }
    fn master_http(&self, id: u64) -> String {
        self.master(id).map(|m| m.http.clone()).unwrap_or_default()
    }
    fn client_token_file(&self) -> Option<PathBuf> {
        self.cluster.client_token_file()
    }
    fn kill_master(&mut self, id: u64) -> anyhow::Result<()> {
        self.cluster.kill(id)
    }
    fn start_master(&mut self, id: u64) -> anyhow::Result<()> {
        self.cluster.restart(id)
    }
    fn pause_master(&mut self, id: u64) -> anyhow::Result<()> {
        self.cluster.pause(id)
    }
    fn resume_master(&mut self, id: u64) -> anyhow::Result<()> {
        self.cluster.resume(id)
    }
    fn isolate_master(&mut self, _id: u64) -> anyhow::Result<()> {
        anyhow::bail!("partitions need container mode")
    }
    fn heal_master(&mut self, _id: u64) -> anyhow::Result<()> {
        anyhow::bail!("partitions need container mode")
    }
    fn kill_store(&mut self, idx: usize) -> anyhow::Result<()> {
        self.cluster
            .stores
            .get_mut(idx)
            .ok_or_else(|| anyhow::anyhow!("no store {idx}"))?
            .kill();
        Ok(())
    }
    fn start_store(&mut self, idx: usize) -> anyhow::Result<()> {
        self.cluster
            .stores
            .get_mut(idx)
            .ok_or_else(|| anyhow::anyhow!("no store {idx}"))?
            .restart()
    }
    fn etcd_members(&self) -> usize {
        self.etcd.len()
    }
    fn kill_etcd(&mut self, i: usize) -> anyhow::Result<()> {
        self.etcd.kill(i)
    }
    fn start_etcd(&mut self, i: usize) -> anyhow::Result<()> {
        self.etcd.restart(i)
    }
    fn start_workers(&mut self, plan: &WorkerPlan) -> anyhow::Result<()> {
        let bin = find_binary("crescent-chaos")?;
        let dir = plan.dir.display().to_string();
        for i in 0..plan.workers {
            let mut worker = ManagedChild::new(
                bin.clone(),
                worker_args(
                    plan,
                    i,
                    &self.cluster.masters_arg(),
                    &dir,
                    self.cluster.client_token_file().as_deref(),
                ),
                plan.dir.join(format!("worker-{i}.log")),
            );
            worker.start()?;
            self.workers.push(worker);
        }
        Ok(())
    }
    fn stop_workers(
        &mut self,
        plan: &WorkerPlan,
        timeout: Duration,
    ) -> anyhow::Result<Vec<WorkerExit>> {
        let early: Vec<bool> = self
            .workers
            .iter_mut()
            .map(|w| matches!(w.exit_status(), Ok(Some(_))))
            .collect();
        std::fs::write(stop_file(plan), b"stop")?;
        let deadline = Instant::now() + timeout;
        let mut exits = Vec::new();
        for (i, w) in self.workers.iter_mut().enumerate() {
            let code = loop {
                if let Some(status) = w.exit_status()? {
                    break status.code();
                }
                if Instant::now() > deadline {
                    let _ = w.kill();
                    break None;
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            let log = std::fs::read_to_string(plan.dir.join(format!("worker-{i}.log")))
                .unwrap_or_default();
            exits.push(WorkerExit::new(i, code, early[i], &log));
        }
        Ok(exits)
    }
    fn collect_logs(&self, dir: &Path) {
        if let Ok(entries) = std::fs::read_dir(&self.cluster.root) {
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "log") {
                    if let Some(name) = p.file_name() {
                        let _ = std::fs::copy(&p, dir.join(name));
                    }
                }
            }
        }
    }
    fn teardown(&mut self) {
        for w in &mut self.workers {
            let _ = w.kill();
        }
    }
}

// ------------------------------------------------------------- containers

/// Runs `docker` with `args`; stdout on success.
pub fn docker(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("docker").args(args).output()?;
    anyhow::ensure!(
        out.status.success(),
        "docker {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Why container mode cannot run here, or None when it can.
pub fn container_mode_blocker(image: &str) -> Option<String> {
    match Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
    {
        Err(e) => return Some(format!("no docker CLI ({e})")),
        Ok(o) if !o.status.success() => {
            return Some(format!(
                "no Docker engine answers ({})",
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
        Ok(_) => {}
    }
    if docker(&["image", "inspect", image]).is_err() {
        return Some(format!("image {image} not built (run `make images`)"));
    }
    None
}

/// etcd (3), masters (3), stores (2) and workers each in a container on a
/// private network with fixed addresses, so a restarted or reconnected
/// container keeps its address and Raft peers stay valid. Token mode: the
/// tokens live in a host directory mounted read-only at [`TOKENS_MOUNT`].
pub struct ContainerDeployment {
    tokens: tempfile::TempDir,
    prefix: String,
    network: String,
    subnet_base: String,
    image: String,
    containers: Vec<String>,
    workers: Vec<String>,
}

const MASTER_IDS: [u64; 3] = [1, 2, 3];

/// Where the containers see the token directory.
const TOKENS_MOUNT: &str = "/crescent-tokens";

impl ContainerDeployment {
    pub fn start(image: &str, master_flags: &[String]) -> anyhow::Result<Self> {
        let prefix = format!("crescent-chaos-{}", std::process::id());
        // A /24 that does not collide with an existing network.
        let mut chosen = None;
        for third in (40..250u32).step_by(7) {
            let base = format!("10.201.{third}");
            let subnet = format!("{base}.0/24");
            if docker(&[
                "network",
                "create",
                "--subnet",
                &subnet,
                "--label",
                "crescent-chaos=1",
                &prefix,
            ])
            .is_ok()
            {
                chosen = Some(base);
                break;
            }
        }
        let subnet_base =
            chosen.ok_or_else(|| anyhow::anyhow!("cannot create a private docker network"))?;
        let tokens = tempfile::Builder::new()
            .prefix("crescent-chaos-tokens-")
            .tempdir()?;
        crescent_auth::write_token_files(tokens.path(), false)?;
        let mut d = Self {
            tokens,
            network: prefix.clone(),
            prefix,
            subnet_base,
            image: image.to_string(),
            containers: Vec::new(),
            workers: Vec::new(),
        };
        if let Err(e) = d.launch(master_flags) {
            d.teardown();
            return Err(e);
        }
        Ok(d)
    }

    fn ip(&self, host: u32) -> String {
        format!("{}.{host}", self.subnet_base)
    }
    fn etcd_name(&self, i: usize) -> String {
        format!("{}-etcd-{i}", self.prefix)
    }
    fn master_name(&self, id: u64) -> String {
        format!("{}-master-{id}", self.prefix)
    }
    fn store_name(&self, i: usize) -> String {
        format!("{}-store-{i}", self.prefix)
    }
    fn tokens_mount(&self) -> String {
        format!("{}:{TOKENS_MOUNT}:ro", self.tokens.path().display())
    }
    fn masters_arg(&self) -> String {
        MASTER_IDS
            .iter()
            .map(|id| format!("{}:50051", self.ip(20 + *id as u32)))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn run(&mut self, name: &str, ip: &str, extra: &[&str], cmd: &[String]) -> anyhow::Result<()> {
        let mut args: Vec<String> = vec![
            "run".into(),
            "-d".into(),
            "--name".into(),
            name.into(),
            "--hostname".into(),
            name.into(),
            "--network".into(),
            self.network.clone(),
            "--ip".into(),
            ip.into(),
            "--label".into(),
            format!("crescent-chaos={}", self.prefix),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.push(self.image.clone());
        args.extend(cmd.iter().cloned());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        docker(&refs)?;
        self.containers.push(name.to_string());
        Ok(())
    }

    fn launch(&mut self, master_flags: &[String]) -> anyhow::Result<()> {
        let initial: Vec<String> = (0..3)
            .map(|i| format!("etcd-{i}=http://{}:2380", self.ip(10 + i)))
            .collect();
        for i in 0..3usize {
            let ip = self.ip(10 + i as u32);
            let cmd: Vec<String> = [
                "etcd",
                "--name",
                &format!("etcd-{i}"),
                "--data-dir",
                "/var/lib/etcd",
                "--listen-client-urls",
                "http://0.0.0.0:2379",
                "--advertise-client-urls",
                &format!("http://{ip}:2379"),
                "--listen-peer-urls",
                "http://0.0.0.0:2380",
                "--initial-advertise-peer-urls",
                &format!("http://{ip}:2380"),
                "--initial-cluster",
                &initial.join(","),
                "--initial-cluster-token",
                "crescent-chaos",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let name = self.etcd_name(i);
            self.run(&name, &ip, &[], &cmd)?;
        }
        let etcd_endpoints: Vec<String> = (0..3)
            .map(|i| format!("{}:2379", self.ip(10 + i)))
            .collect();
        for id in MASTER_IDS {
            let ip = self.ip(20 + id as u32);
            let mut cmd: Vec<String> = vec![
                "crescent-master".into(),
                "--node-id".into(),
                id.to_string(),
                "--listen".into(),
                "0.0.0.0:50051".into(),
                "--advertise".into(),
                format!("{ip}:50051"),
                "--http".into(),
                "0.0.0.0:9003".into(),
                "--data-dir".into(),
                "/var/lib/crescent".into(),
                "--etcd".into(),
                etcd_endpoints.join(","),
                "--cluster".into(),
                "chaos".into(),
            ];
            cmd.extend(crescent_integration::security_flags(Some(Path::new(
                TOKENS_MOUNT,
            ))));
            cmd.extend(master_flags.iter().cloned());
            let name = self.master_name(id);
            let mount = self.tokens_mount();
            self.run(&name, &ip, &["-v", &mount], &cmd)?;
        }
        for i in 0..2usize {
            let ip = self.ip(30 + i as u32);
            let cmd: Vec<String> = vec![
                "crescent-store".into(),
                "--master".into(),
                self.masters_arg(),
                "--listen".into(),
                "0.0.0.0:50061".into(),
                "--advertise".into(),
                ip.clone(),
                "--segment-size".into(),
                "256mb".into(),
                "--http".into(),
                "0.0.0.0:9103".into(),
                "--token-file".into(),
                format!("{TOKENS_MOUNT}/{}", crescent_auth::CLIENT_TOKEN_FILE),
            ];
            let name = self.store_name(i);
            let mount = self.tokens_mount();
            self.run(&name, &ip, &["-v", &mount], &cmd)?;
        }
        Ok(())
    }
}

impl Deployment for ContainerDeployment {
    fn mode(&self) -> Mode {
        Mode::Containers
    }
    fn network_control(&self) -> bool {
        true
    }
    fn master_ids(&self) -> Vec<u64> {
        MASTER_IDS.to_vec()
    }
    fn master_addr(&self, id: u64) -> String {
        format!("{}:50051", self.ip(20 + id as u32))
    }
    fn master_http(&self, id: u64) -> String {
        format!("{}:9003", self.ip(20 + id as u32))
    }
    fn client_token_file(&self) -> Option<PathBuf> {
        Some(self.tokens.path().join(crescent_auth::CLIENT_TOKEN_FILE))
    }
    fn kill_master(&mut self, id: u64) -> anyhow::Result<()> {
        docker(&["kill", &self.master_name(id)]).map(drop)
    }
    fn start_master(&mut self, id: u64) -> anyhow::Result<()> {
        docker(&["start", &self.master_name(id)]).map(drop)
    }
    fn pause_master(&mut self, id: u64) -> anyhow::Result<()> {
        docker(&["kill", "--signal", "SIGSTOP", &self.master_name(id)]).map(drop)
    }
    fn resume_master(&mut self, id: u64) -> anyhow::Result<()> {
        docker(&["kill", "--signal", "SIGCONT", &self.master_name(id)]).map(drop)
    }
    fn isolate_master(&mut self, id: u64) -> anyhow::Result<()> {
        docker(&[
            "network",
            "disconnect",
            &self.network,
            &self.master_name(id),
        ])
        .map(drop)
    }
    fn heal_master(&mut self, id: u64) -> anyhow::Result<()> {
        let ip = self.ip(20 + id as u32);
        docker(&[
            "network",
            "connect",
            "--ip",
            &ip,
            &self.network,
            &self.master_name(id),
        ])
        .map(drop)
    }
    fn kill_store(&mut self, idx: usize) -> anyhow::Result<()> {
        docker(&["kill", &self.store_name(idx)]).map(drop)
    }
    fn start_store(&mut self, idx: usize) -> anyhow::Result<()> {
        docker(&["start", &self.store_name(idx)]).map(drop)
    }
    fn etcd_members(&self) -> usize {
        3
    }
    fn kill_etcd(&mut self, i: usize) -> anyhow::Result<()> {
        docker(&["kill", &self.etcd_name(i)]).map(drop)
    }
    fn start_etcd(&mut self, i: usize) -> anyhow::Result<()> {
        docker(&["start", &self.etcd_name(i)]).map(drop)
    }
    fn start_workers(&mut self, plan: &WorkerPlan) -> anyhow::Result<()> {
        let mount = format!("{}:/chaos", plan.dir.display());
        for i in 0..plan.workers {
            let name = format!("{}-worker-{i}", self.prefix);
            let ip = self.ip(40 + i);
            let mut cmd = vec!["crescent-chaos".to_string()];
            let token = Path::new(TOKENS_MOUNT).join(crescent_auth::CLIENT_TOKEN_FILE);
            cmd.extend(worker_args(
                plan,
                i,
                &self.masters_arg(),
                "/chaos",
                Some(&token),
            ));
            let tokens = self.tokens_mount();
            self.run(&name, &ip, &["-v", &mount, "-v", &tokens], &cmd)?;
            self.workers.push(name);
        }
        Ok(())
    }
    fn stop_workers(
        &mut self,
        plan: &WorkerPlan,
        timeout: Duration,
    ) -> anyhow::Result<Vec<WorkerExit>> {
        let running = |w: &str| docker(&["inspect", "-f", "{{.State.Running}}", w]);
        let early: Vec<bool> = self
            .workers
            .iter()
            .map(|w| running(w).is_ok_and(|r| r != "true"))
            .collect();
        std::fs::write(stop_file(plan), b"stop")?;
        let deadline = Instant::now() + timeout;
        let mut exits = Vec::new();
        for (i, w) in self.workers.iter().enumerate() {
            let mut killed = false;
            while running(w)? == "true" {
                if Instant::now() > deadline {
                    let _ = docker(&["kill", w]);
                    killed = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            let code = docker(&["inspect", "-f", "{{.State.ExitCode}}", w])
                .ok()
                .and_then(|c| c.parse::<i32>().ok())
                .filter(|_| !killed);
            let log = Command::new("docker")
                .args(["logs", "--tail", &LOG_TAIL_LINES.to_string(), w])
                .output()
                .map(|o| {
                    let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
                    text.push_str(&String::from_utf8_lossy(&o.stderr));
                    text
                })
                .unwrap_or_default();
            exits.push(WorkerExit::new(i, code, early[i], &log));
        }
        Ok(exits)
    }
    fn collect_logs(&self, dir: &Path) {
        for c in &self.containers {
            if let Ok(out) = Command::new("docker").args(["logs", c]).output() {
                let mut text = out.stdout;
                text.extend_from_slice(&out.stderr);
                let _ = std::fs::write(dir.join(format!("{c}.log")), text);
            }
        }
    }
    fn teardown(&mut self) {
        for c in &self.containers {
            let _ = docker(&["rm", "-f", "-v", c]);
        }
        self.containers.clear();
        let _ = docker(&["network", "rm", &self.network]);
    }
}

impl Drop for ContainerDeployment {
    fn drop(&mut self) {
        self.teardown();
    }
}
