//! Where a chaos run's processes live, and the faults that can be done to
//! them: local processes (kill, pause, restart) or containers on a private
//! Docker network (the same, plus partitions by disconnecting a container).
//!
//! Containers are driven through the harness's [`ContainerNet`]
//! (testcontainers for their lifecycle, bollard for the network and signals).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::faulty_disk::FaultyDisk;
use crescent_integration::containers::{self, Bind, ContainerNet};
use crescent_integration::{
    find_binary, FakeClock, LocalCluster, LocalEtcd, ManagedChild, Security,
};

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
    /// Workers from this index on run a `cache_and_degrade` client (see
    /// [`crate::workload::WorkerConfig`]).
    pub cache_and_degrade_from: u32,
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
    /// Master `id`'s data dir, where this process can write it (`None` in
    /// containers).
    fn master_data_dir(&self, _id: u64) -> Option<PathBuf> {
        None
    }
    fn pause_master(&mut self, id: u64) -> anyhow::Result<()>;
    fn resume_master(&mut self, id: u64) -> anyhow::Result<()>;
    /// Steps master `id`'s wall clock to the true time plus `secs` (0: back
    /// to true). False where wall clocks cannot be stepped (containers, or
    /// no libfaketime here).
    fn step_master_clock(&mut self, _id: u64, _secs: i64) -> anyhow::Result<bool> {
        Ok(false)
    }
    /// Sets store `idx`'s wall clock to the true time plus `secs`, from
    /// its next start (a store reads the wall clock once, at start; with
    /// the test-only `--unsafe-wall-clock` it reads it live, and sees the
    /// change within [`FakeClock::SEEN_WITHIN`]). False
    /// where it cannot be set (containers, no libfaketime, or a store
    /// started without a settable clock).
    fn set_store_clock(&mut self, _idx: usize, _secs: i64) -> anyhow::Result<bool> {
        Ok(false)
    }
    /// Starts one more master, `id` (never used before), waiting to be
    /// added to the membership; returns its address. `None` where masters
    /// cannot be added (containers).
    fn start_joining_master(&mut self, _id: u64) -> anyhow::Result<Option<String>> {
        Ok(None)
    }
    /// Stops master `id` for good and forgets it (after its removal from
    /// the membership).
    fn drop_master(&mut self, _id: u64) -> anyhow::Result<()> {
        Ok(())
    }
    /// The admin token's file in token mode, for membership changes.
    fn admin_token_file(&self) -> Option<PathBuf> {
        None
    }
    fn isolate_master(&mut self, id: u64) -> anyhow::Result<()>;
    fn heal_master(&mut self, id: u64) -> anyhow::Result<()>;
    /// Store `idx`'s HTTP (metrics and /health) address, reachable from
    /// this process.
    fn store_http(&self, idx: usize) -> String;
    fn kill_store(&mut self, idx: usize) -> anyhow::Result<()>;
    /// Drops every packet sent to store `idx`'s data ports (`cut`), or
    /// lets them through again: senders' kernels keep what they sent and
    /// retransmit it when the cut heals, as after a network partition.
    /// False where it cannot be done (containers, or no iptables).
    fn cut_store(&mut self, _idx: usize, _cut: bool) -> anyhow::Result<bool> {
        Ok(false)
    }
    /// Makes store `idx`'s disk tier answer every read, write, sync and
    /// allocation with EIO (`failing`), or work again. False where it
    /// cannot (containers, no FUSE here, or a store whose disk directory
    /// is not on a [`FaultyDisk`](crate::faulty_disk::FaultyDisk)).
    fn fail_store_disk(&mut self, _idx: usize, _failing: bool) -> anyhow::Result<bool> {
        Ok(false)
    }
    /// Whether [`fail_store_disk`](Self::fail_store_disk) can fail store
    /// `idx`'s disk.
    fn can_fail_store_disk(&self, _idx: usize) -> bool {
        false
    }
    /// SIGSTOP store `idx`: it keeps its sockets (the kernel still queues
    /// what clients send it) but runs no code.
    fn pause_store(&mut self, idx: usize) -> anyhow::Result<()>;
    fn resume_store(&mut self, idx: usize) -> anyhow::Result<()>;
    /// Starts store `idx` again with the same flags: the same disk
    /// directory, so its disk segment (and objects) come back.
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

/// Each store's memory segment. Far more than the workload holds: the
/// masters demote at a low watermark instead (see the `run` command).
pub const MEMORY_SEGMENT: &str = "256mb";
/// Each store's disk segment (a pre-allocated file). An object dropped
/// from disk at the disk watermark counts as evicted, and any eviction
/// fails a run, so this must hold all a soak demotes: the workload's
/// never-removed keys pile up there at about 110 MiB an hour over both
/// stores (a 2-hour soak filled two 64 MiB segments after 70 minutes).
pub const DISK_SEGMENT: &str = "512mb";
/// Where a store container keeps its disk segment: its own filesystem,
/// which survives a restart of the container (and goes with it at teardown).
const CONTAINER_DISK_PATH: &str = "/var/lib/crescent/disk";
/// The disk segment's data port in a store container (pinned, so the
/// address is the same after a restart).
const CONTAINER_DISK_PORT: u16 = 50062;

/// A store's disk-tier flags.
fn disk_flags(path: &str, listen: Option<String>) -> Vec<String> {
    let mut flags = vec![
        "--disk-path".to_string(),
        path.to_string(),
        "--disk-size".into(),
        DISK_SEGMENT.into(),
    ];
    if let Some(addr) = listen {
        flags.extend(["--disk-listen".to_string(), addr]);
    }
    flags
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
    let cached = (i >= plan.cache_and_degrade_from).then(|| "--cache-and-degrade".to_string());
    args.into_iter().chain(token).chain(cached).collect()
}

// ------------------------------------------------------------- processes

/// etcd (3 members), 3 masters and 2 stores as local processes on loopback,
/// in token mode (every process and worker presents its token). Each store
/// keeps its disk segment in its own directory under the cluster's
/// temporary root (`store-<n>-disk`), which a restart reuses.
pub struct ProcessDeployment {
    etcd: LocalEtcd,
    cluster: LocalCluster,
    workers: Vec<ManagedChild>,
    /// The run's flags for every master, for masters added later (without
    /// `--etcd`: the leader's etcd loop would add a member it finds there
    /// back after its removal).
    master_flags: Vec<String>,
    /// Each store's data ports (memory and disk segments), pinned so a
    /// restarted store keeps them.
    store_ports: Vec<[u16; 2]>,
    /// The firewall rules [`Deployment::cut_store`] holds now, removed at
    /// teardown at the latest.
    cuts: Vec<u16>,
    /// Each master's and the second store's wall clock, when libfaketime
    /// is here.
    clocks: Option<WallClocks>,
    /// The second store's disk directory, on a disk that fails on demand
    /// (when FUSE is here), and the directory holding it. After `cluster`,
    /// so the stores are gone before it is unmounted.
    failing_disk: Option<(FaultyDisk, tempfile::TempDir)>,
}

/// The store whose disk can be made to fail (the one the store faults
/// target).
pub const FAILING_DISK_STORE: usize = 1;

/// A disk that fails on demand, in a directory of its own; None, with a
/// word, where FUSE cannot be mounted.
fn failing_disk() -> anyhow::Result<Option<(FaultyDisk, tempfile::TempDir)>> {
    let dir = tempfile::Builder::new()
        .prefix("crescent-chaos-disk-")
        .tempdir()?;
    match FaultyDisk::mount(&dir.path().join("backing"), &dir.path().join("mnt")) {
        Ok(disk) => Ok(Some((disk, dir))),
        Err(e) => {
            println!("chaos: a store's disk cannot be made to fail here (FUSE: {e})");
            Ok(None)
        }
    }
}

/// The store whose wall clock can be set (the one the store faults target).
pub const CLOCKED_STORE: usize = 1;

/// A [`FakeClock`] per process name (`master-<id>`, `store-<idx>`), their
/// offset files in `_dir`.
struct WallClocks {
    _dir: tempfile::TempDir,
    by_name: Vec<(String, FakeClock)>,
}

impl WallClocks {
    /// None, with a word, without libfaketime.
    fn new(names: &[String]) -> anyhow::Result<Option<Self>> {
        let dir = tempfile::Builder::new()
            .prefix("crescent-chaos-clocks-")
            .tempdir()?;
        let mut by_name = Vec::new();
        for name in names {
            let sub = dir.path().join(name);
            std::fs::create_dir_all(&sub)?;
            match FakeClock::new(&sub) {
                Ok(clock) => by_name.push((name.clone(), clock)),
                Err(e) => {
                    println!("chaos: wall clocks cannot be stepped: {e}");
                    return Ok(None);
                }
            }
        }
        Ok(Some(Self { _dir: dir, by_name }))
    }

    fn get(&self, name: &str) -> Option<&FakeClock> {
        self.by_name.iter().find(|(n, _)| n == name).map(|(_, c)| c)
    }

    fn env(clocks: &Option<Self>, name: &str) -> Vec<(String, String)> {
        clocks
            .as_ref()
            .and_then(|c| c.get(name))
            .map(FakeClock::env)
            .unwrap_or_default()
    }
}

fn master_clock(id: u64) -> String {
    format!("master-{id}")
}

fn store_clock(idx: usize) -> String {
    format!("store-{idx}")
}

impl ProcessDeployment {
    /// `store_flags` are added to every store's (the test-only switches).
    pub fn start(master_flags: &[String], store_flags: &[String]) -> anyhow::Result<Self> {
        remove_stale_rules();
        let etcd = LocalEtcd::start_cluster(3)?;
        let mut names: Vec<String> = [1, 2, 3].map(master_clock).to_vec();
        names.push(store_clock(CLOCKED_STORE));
        let clocks = WallClocks::new(&names)?;
        let env = |id: u64| WallClocks::env(&clocks, &master_clock(id));
        let mut cluster = LocalCluster::start_with_etcd_env(
            3,
            &etcd.endpoints(),
            "chaos",
            master_flags,
            Security::Tokens,
            &env,
        )?;
        let mut store_ports = Vec::new();
        let failing_disk = failing_disk()?;
        for i in 0..2 {
            let dir = match &failing_disk {
                Some((disk, _)) if i == FAILING_DISK_STORE => disk.path().to_path_buf(),
                _ => cluster.root.join(format!("store-{i}-disk")),
            };
            let disk_port = crescent_integration::free_port()?;
            let mut flags = disk_flags(
                &dir.display().to_string(),
                Some(format!("127.0.0.1:{disk_port}")),
            );
            // The workers run on the stores' host: they read store 1's
            // memory through /dev/shm and its disk replicas from its file
            // (store 1 is the one the store faults kill and restart), and
            // store 0's over TCP, so both paths are under the faults.
            if i == 1 {
                flags.push("--shm".into());
            }
            flags.extend(store_flags.iter().cloned());
            let idx = cluster.start_store_env(
                MEMORY_SEGMENT,
                &flags,
                &WallClocks::env(&clocks, &store_clock(i)),
            )?;
            let data_port = cluster.stores[idx]
                .endpoint
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse().ok())
                .ok_or_else(|| anyhow::anyhow!("store {idx} has no port"))?;
            store_ports.push([data_port, disk_port]);
        }
        Ok(Self {
            etcd,
            cluster,
            workers: Vec::new(),
            master_flags: master_flags.to_vec(),
            store_ports,
            cuts: Vec::new(),
            clocks,
            failing_disk,
        })
    }
}

impl ProcessDeployment {
    fn master(&self, id: u64) -> Option<&crescent_integration::MasterProcess> {
        self.cluster.masters.iter().find(|m| m.id == id)
    }

    /// Sets the named process's wall clock; false without libfaketime.
    fn set_clock(&self, name: &str, secs: i64) -> anyhow::Result<bool> {
        match self.clocks.as_ref().and_then(|c| c.get(name)) {
            Some(clock) => {
                clock.set_offset_secs(secs)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn store(&mut self, idx: usize) -> anyhow::Result<&mut crescent_integration::StoreProcess> {
        self.cluster
            .stores
            .get_mut(idx)
            .ok_or_else(|| anyhow::anyhow!("no store {idx}"))
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
    fn master_data_dir(&self, id: u64) -> Option<PathBuf> {
        self.master(id).map(|m| m.data_dir.clone())
    }
    fn pause_master(&mut self, id: u64) -> anyhow::Result<()> {
        self.cluster.pause(id)
    }
    fn step_master_clock(&mut self, id: u64, secs: i64) -> anyhow::Result<bool> {
        self.set_clock(&master_clock(id), secs)
    }
    fn set_store_clock(&mut self, idx: usize, secs: i64) -> anyhow::Result<bool> {
        self.set_clock(&store_clock(idx), secs)
    }
    fn cut_store(&mut self, idx: usize, cut: bool) -> anyhow::Result<bool> {
        let ports = *self
            .store_ports
            .get(idx)
            .ok_or_else(|| anyhow::anyhow!("no store {idx}"))?;
        for port in ports {
            if cut {
                if let Err(e) = drop_rule("-I", port) {
                    println!("chaos: store {idx} cannot be cut off: {e}");
                    self.heal_cuts();
                    return Ok(false);
                }
                self.cuts.push(port);
            } else if let Some(at) = self.cuts.iter().position(|p| *p == port) {
                drop_rule("-D", port)?;
                self.cuts.remove(at);
            }
        }
        Ok(true)
    }
    fn can_fail_store_disk(&self, idx: usize) -> bool {
        self.failing_disk.is_some() && idx == FAILING_DISK_STORE
    }
    fn fail_store_disk(&mut self, idx: usize, failing: bool) -> anyhow::Result<bool> {
        match &self.failing_disk {
            Some((disk, _)) if idx == FAILING_DISK_STORE => {
                disk.set_failing(failing);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
    fn start_joining_master(&mut self, id: u64) -> anyhow::Result<Option<String>> {
        Ok(Some(
            self.cluster.add_joining_master(id, &self.master_flags)?,
        ))
    }
    fn drop_master(&mut self, id: u64) -> anyhow::Result<()> {
        self.cluster.kill(id)?;
        self.cluster.masters.retain(|m| m.id != id);
        Ok(())
    }
    fn admin_token_file(&self) -> Option<PathBuf> {
        self.cluster.admin_token_file()
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
    fn store_http(&self, idx: usize) -> String {
        self.cluster
            .stores
            .get(idx)
            .map(|s| s.http.clone())
            .unwrap_or_default()
    }
    fn kill_store(&mut self, idx: usize) -> anyhow::Result<()> {
        self.store(idx)?.kill();
        Ok(())
    }
    fn start_store(&mut self, idx: usize) -> anyhow::Result<()> {
        self.store(idx)?.restart()
    }
    fn pause_store(&mut self, idx: usize) -> anyhow::Result<()> {
        self.store(idx)?.pause()
    }
    fn resume_store(&mut self, idx: usize) -> anyhow::Result<()> {
        self.store(idx)?.resume()
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
        // The masters' and stores' logs, and the etcd members' (a member
        // that does not come back after a restart fails the run).
        for from in [self.cluster.root.as_path(), self.etcd.dir()] {
            let Ok(entries) = std::fs::read_dir(from) else {
                continue;
            };
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
        self.heal_cuts();
    }
}

impl ProcessDeployment {
    /// Removes every rule [`Deployment::cut_store`] added.
    fn heal_cuts(&mut self) {
        for port in std::mem::take(&mut self.cuts) {
            if let Err(e) = drop_rule("-D", port) {
                println!("chaos: the rule dropping packets to port {port} stays: {e}");
            }
        }
    }
}

impl Drop for ProcessDeployment {
    fn drop(&mut self) {
        // A run that ends early must not leave the host dropping packets to
        // a port a later process may get.
        self.heal_cuts();
    }
}

/// The comment on this process's iptables rules: a run killed before its
/// teardown leaves them, and the next run removes them by it.
const RULE_TAG: &str = "crescent-chaos-";

/// Adds (`-I`) or deletes (`-D`) the iptables rule that drops TCP packets
/// to `port` (loopback included), tagged with this process's id.
fn drop_rule(action: &str, port: u16) -> anyhow::Result<()> {
    let port = port.to_string();
    let tag = format!("{RULE_TAG}{}", std::process::id());
    let args = [
        "-p",
        "tcp",
        "--dport",
        &port,
        "-m",
        "comment",
        "--comment",
        &tag,
        "-j",
        "DROP",
    ];
    iptables(action, &args)
}

fn iptables(action: &str, rule: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new("iptables")
        .args(["-w", "5", action, "INPUT"])
        .args(rule)
        .output()
        .map_err(|e| anyhow::anyhow!("iptables: {e}"))?;
    anyhow::ensure!(
        out.status.success(),
        "iptables {action} INPUT {}: {}",
        rule.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Deletes the rules of chaos runs that are no longer running (killed
/// before their teardown). Quiet where iptables is missing.
fn remove_stale_rules() {
    let Ok(out) = std::process::Command::new("iptables")
        .args(["-w", "5", "-S", "INPUT"])
        .output()
    else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let owner = words
            .iter()
            .find_map(|w| w.strip_prefix(RULE_TAG))
            .and_then(|pid| pid.parse::<u32>().ok());
        let stale = owner.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
        if stale && words.len() > 2 && words[0] == "-A" {
            match iptables("-D", &words[2..]) {
                Ok(()) => println!("chaos: removed a dead run's rule: {line}"),
                Err(e) => println!("chaos: a dead run's rule stays: {e}"),
            }
        }
    }
}

// ------------------------------------------------------------- containers

/// Runs `fut` from the synchronous [`Deployment`] methods, which the run
/// calls on a worker of its multi-threaded runtime.
fn block<F: std::future::Future>(fut: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(fut))
}

/// Why container mode cannot run here, or None when it can.
pub async fn container_mode_blocker(image: &str) -> Option<String> {
    containers::blocker(image).await
}

/// etcd (3), masters (3), stores (2) and workers each in a container on a
/// private network with fixed addresses ([`ContainerNet`]), so a restarted
/// or reconnected container keeps its address and Raft peers stay valid.
/// Token mode: the tokens live in a host directory mounted read-only at
/// [`TOKENS_MOUNT`].
pub struct ContainerDeployment {
    tokens: tempfile::TempDir,
    prefix: String,
    net: ContainerNet,
    workers: Vec<String>,
}

const MASTER_IDS: [u64; 3] = [1, 2, 3];

/// A store container's HTTP (metrics, /health) port.
const STORE_HTTP_PORT: u16 = 9103;

/// Where the containers see the token directory.
const TOKENS_MOUNT: &str = "/crescent-tokens";

fn tokens_bind(dir: &Path) -> Bind<'_> {
    Bind {
        host: dir,
        container: TOKENS_MOUNT,
        read_only: true,
    }
}

/// What etcd logs once it serves clients (it needs its quorum for that).
const ETCD_READY: &str = "ready to serve client requests";

impl ContainerDeployment {
    /// `store_flags` are added to every store's (the test-only switches).
    pub fn start(
        image: &str,
        master_flags: &[String],
        store_flags: &[String],
    ) -> anyhow::Result<Self> {
        let prefix = format!("crescent-chaos-{}", std::process::id());
        let tokens = tempfile::Builder::new()
            .prefix("crescent-chaos-tokens-")
            .tempdir()?;
        crescent_auth::write_token_files(tokens.path(), false)?;
        let net = block(ContainerNet::create(&prefix, image))?;
        let mut d = Self {
            tokens,
            prefix,
            net,
            workers: Vec::new(),
        };
        if let Err(e) = block(d.launch(master_flags, store_flags)) {
            d.teardown();
            return Err(e);
        }
        Ok(d)
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
    /// The token directory, mounted read-only (a copy of the path, so the
    /// bind does not borrow `self` while a container is started).
    fn tokens_dir(&self) -> PathBuf {
        self.tokens.path().to_path_buf()
    }
    fn masters_arg(&self) -> String {
        MASTER_IDS
            .iter()
            .map(|id| format!("{}:50051", self.net.ip(20 + *id as u32)))
            .collect::<Vec<_>>()
            .join(",")
    }

    async fn launch(
        &mut self,
        master_flags: &[String],
        store_flags: &[String],
    ) -> anyhow::Result<()> {
        let initial: Vec<String> = (0..3)
            .map(|i| format!("etcd-{i}=http://{}:2380", self.net.ip(10 + i)))
            .collect();
        for i in 0..3usize {
            let ip = self.net.ip(10 + i as u32);
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
            self.net.run(&name, 10 + i as u32, &[], &cmd).await?;
        }
        for i in 0..3usize {
            let name = self.etcd_name(i);
            self.net
                .wait_for_log(&name, ETCD_READY, Duration::from_secs(60))
                .await?;
        }
        let etcd_endpoints: Vec<String> = (0..3)
            .map(|i| format!("{}:2379", self.net.ip(10 + i)))
            .collect();
        for id in MASTER_IDS {
            let ip = self.net.ip(20 + id as u32);
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
            let tokens = self.tokens_dir();
            let binds = [tokens_bind(&tokens)];
            self.net.run(&name, 20 + id as u32, &binds, &cmd).await?;
        }
        for i in 0..2usize {
            let ip = self.net.ip(30 + i as u32);
            let mut cmd: Vec<String> = vec![
                "crescent-store".into(),
                "--master".into(),
                self.masters_arg(),
                "--listen".into(),
                "0.0.0.0:50061".into(),
                "--advertise".into(),
                ip.clone(),
                "--segment-size".into(),
                MEMORY_SEGMENT.into(),
                "--http".into(),
                format!("0.0.0.0:{STORE_HTTP_PORT}"),
                "--token-file".into(),
                format!("{TOKENS_MOUNT}/{}", crescent_auth::CLIENT_TOKEN_FILE),
            ];
            cmd.extend(disk_flags(
                CONTAINER_DISK_PATH,
                Some(format!("0.0.0.0:{CONTAINER_DISK_PORT}")),
            ));
            cmd.extend(store_flags.iter().cloned());
            let name = self.store_name(i);
            let tokens = self.tokens_dir();
            let binds = [tokens_bind(&tokens)];
            self.net.run(&name, 30 + i as u32, &binds, &cmd).await?;
        }
        Ok(())
    }

    async fn stop_workers_async(
        &mut self,
        plan: &WorkerPlan,
        timeout: Duration,
    ) -> anyhow::Result<Vec<WorkerExit>> {
        let mut early = Vec::new();
        for w in &self.workers {
            early.push(!self.net.is_running(w).await?);
        }
        std::fs::write(stop_file(plan), b"stop")?;
        let deadline = Instant::now() + timeout;
        let mut exits = Vec::new();
        for (i, w) in self.workers.iter().enumerate() {
            let mut killed = false;
            while self.net.is_running(w).await? {
                if Instant::now() > deadline {
                    let _ = self.net.signal(w, "SIGKILL").await;
                    killed = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let code = match self.net.exit_code(w).await {
                Ok(Some(c)) if !killed => i32::try_from(c).ok(),
                _ => None,
            };
            let log = self.net.logs(w).await.unwrap_or_default();
            exits.push(WorkerExit::new(i, code, early[i], &log));
        }
        Ok(exits)
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
        format!("{}:50051", self.net.ip(20 + id as u32))
    }
    fn master_http(&self, id: u64) -> String {
        format!("{}:9003", self.net.ip(20 + id as u32))
    }
    fn client_token_file(&self) -> Option<PathBuf> {
        Some(self.tokens.path().join(crescent_auth::CLIENT_TOKEN_FILE))
    }
    fn kill_master(&mut self, id: u64) -> anyhow::Result<()> {
        block(self.net.signal(&self.master_name(id), "SIGKILL"))
    }
    fn start_master(&mut self, id: u64) -> anyhow::Result<()> {
        block(self.net.restart(&self.master_name(id)))
    }
    fn pause_master(&mut self, id: u64) -> anyhow::Result<()> {
        block(self.net.signal(&self.master_name(id), "SIGSTOP"))
    }
    fn resume_master(&mut self, id: u64) -> anyhow::Result<()> {
        block(self.net.signal(&self.master_name(id), "SIGCONT"))
    }
    fn isolate_master(&mut self, id: u64) -> anyhow::Result<()> {
        block(self.net.disconnect(&self.master_name(id)))
    }
    fn heal_master(&mut self, id: u64) -> anyhow::Result<()> {
        block(self.net.reconnect(&self.master_name(id)))
    }
    fn store_http(&self, idx: usize) -> String {
        format!("{}:{STORE_HTTP_PORT}", self.net.ip(30 + idx as u32))
    }
    fn kill_store(&mut self, idx: usize) -> anyhow::Result<()> {
        block(self.net.signal(&self.store_name(idx), "SIGKILL"))
    }
    fn start_store(&mut self, idx: usize) -> anyhow::Result<()> {
        block(self.net.restart(&self.store_name(idx)))
    }
    fn pause_store(&mut self, idx: usize) -> anyhow::Result<()> {
        block(self.net.signal(&self.store_name(idx), "SIGSTOP"))
    }
    fn resume_store(&mut self, idx: usize) -> anyhow::Result<()> {
        block(self.net.signal(&self.store_name(idx), "SIGCONT"))
    }
    fn etcd_members(&self) -> usize {
        3
    }
    fn kill_etcd(&mut self, i: usize) -> anyhow::Result<()> {
        block(self.net.signal(&self.etcd_name(i), "SIGKILL"))
    }
    fn start_etcd(&mut self, i: usize) -> anyhow::Result<()> {
        block(self.net.restart(&self.etcd_name(i)))
    }
    fn start_workers(&mut self, plan: &WorkerPlan) -> anyhow::Result<()> {
        for i in 0..plan.workers {
            let name = format!("{}-worker-{i}", self.prefix);
            let mut cmd = vec!["crescent-chaos".to_string()];
            let token = Path::new(TOKENS_MOUNT).join(crescent_auth::CLIENT_TOKEN_FILE);
            cmd.extend(worker_args(
                plan,
                i,
                &self.masters_arg(),
                "/chaos",
                Some(&token),
            ));
            let tokens = self.tokens_dir();
            let binds = [
                Bind {
                    host: &plan.dir,
                    container: "/chaos",
                    read_only: false,
                },
                tokens_bind(&tokens),
            ];
            block(self.net.run(&name, 40 + i, &binds, &cmd))?;
            self.workers.push(name);
        }
        Ok(())
    }
    fn stop_workers(
        &mut self,
        plan: &WorkerPlan,
        timeout: Duration,
    ) -> anyhow::Result<Vec<WorkerExit>> {
        block(self.stop_workers_async(plan, timeout))
    }
    fn collect_logs(&self, dir: &Path) {
        for c in self.net.names() {
            if let Ok(text) = block(self.net.logs(&c)) {
                let _ = std::fs::write(dir.join(format!("{c}.log")), text);
            }
        }
    }
    fn teardown(&mut self) {
        block(self.net.remove());
    }
}

impl Drop for ContainerDeployment {
    fn drop(&mut self) {
        // Removing needs a multi-threaded runtime to block in; a run always
        // tears down inside one (`ContainerNet`'s own drop has the same rule).
        let multi_threaded = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if multi_threaded {
            self.teardown();
        }
    }
}
