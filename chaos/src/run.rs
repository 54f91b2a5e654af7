//! The orchestrator: deploy, start the workload, inject the seeded faults
//! one after another (each healed and recovered from before the next),
//! sample every master's term and role throughout, then check the history.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crescent_client::MasterClient;
use crescent_proto::pb;

use crate::checker::{self, CheckResult};
use crate::deploy::{
    container_mode_blocker, focus_file, ContainerDeployment, Deployment, Mode, ProcessDeployment,
    WorkerExit, WorkerPlan, CLOCKED_STORE,
};
use crate::disk::{failing_disk, restart_store_with_disk, DiskChecker, DISK_CHECKS};
use crate::history::{now_us, read_lines, DiskCheck, Op, Recorder, RoleSample};
use crate::report::{self, Report};
use crate::schedule::{
    ci_schedule, clock_step_schedule, degraded_period_schedule, disk_restart_schedule,
    failing_disk_schedule, late_write_schedule, leader_kill_schedule, rolling_restart_schedule,
    soak_schedule, stalled_writer_schedule, store_skew_schedule, Fault, FaultKind, FaultRecord,
    ScheduleKind,
};
use crate::stall::{StalledWriter, FAULT_HISTORY, WORKERS_PUT_FOR};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeChoice {
    /// Containers when a Docker engine answers and the image exists, else processes.
    Auto,
    Containers,
    Processes,
}

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub mode: ModeChoice,
    pub schedule: ScheduleKind,
    pub duration: Duration,
    pub seed: u64,
    pub out: PathBuf,
    pub image: String,
    pub workers: u32,
    /// Workers beyond `workers` whose clients keep a descriptor cache and
    /// go degraded without masters (see [`crate::workload::WorkerConfig`]).
    pub cache_and_degrade_workers: u32,
    pub tasks: u32,
    /// Pass despite keys the linearizability search could not decide.
    pub allow_inconclusive: bool,
    /// Extra master flags (the test-only unsafe switch goes here).
    pub master_flags: Vec<String>,
    /// Extra store flags (the stores' test-only unsafe switch).
    pub store_flags: Vec<String>,
}

impl RunConfig {
    fn all_workers(&self) -> u32 {
        self.workers + self.cache_and_degrade_workers
    }
}

const RECOVERY_LIMIT: Duration = Duration::from_secs(60);

/// Makes a fresh directory for this run inside `parent`,
/// `<UTC time>-<schedule>-seed<seed>`, and points `parent/latest` at it.
/// A run never reuses an earlier run's stop file or histories: a stale stop
/// file once ended every worker of a 30-minute soak at once.
pub fn fresh_run_dir(parent: &Path, schedule: ScheduleKind, seed: u64) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(parent)?;
    // Absolute: container mode bind-mounts it into the workers.
    let parent = std::fs::canonicalize(parent)?;
    let stamp = chrono_like_utc(now_us() / 1_000_000);
    let base = format!("{stamp}-{}-seed{seed}", schedule.name());
    for n in 0..100 {
        let name = if n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        let dir = parent.join(&name);
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                let latest = parent.join("latest");
                let _ = std::fs::remove_file(&latest);
                std::os::unix::fs::symlink(&name, &latest)?;
                return Ok(dir);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(anyhow::anyhow!("creating {}: {e}", dir.display())),
        }
    }
    anyhow::bail!("no free run directory name under {}", parent.display())
}

/// `YYYYmmddTHHMMSSZ` for Unix seconds (civil-from-days, no time zone crate).
fn chrono_like_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Runs one chaos run in a fresh directory under `cfg.out` (see
/// [`fresh_run_dir`]); the report says which.
pub async fn run(mut cfg: RunConfig) -> anyhow::Result<Report> {
    cfg.out = fresh_run_dir(&cfg.out, cfg.schedule, cfg.seed)?;
    println!("chaos: output = {}", cfg.out.display());
    let (mode, reason) = choose_mode(&cfg).await;
    println!("chaos: mode = {mode:?} ({reason})");
    println!(
        "chaos: seed = {} (reproduce with --seed {}), schedule = {:?}",
        cfg.seed, cfg.seed, cfg.schedule
    );
    let started = now_us();
    let mut dep: Box<dyn Deployment> = match mode {
        Mode::Containers => Box::new(ContainerDeployment::start(
            &cfg.image,
            &cfg.master_flags,
            &cfg.store_flags,
        )?),
        Mode::Processes => Box::new(ProcessDeployment::start(
            &cfg.master_flags,
            &cfg.store_flags,
        )?),
    };
    let result = drive(&cfg, dep.as_mut()).await;
    dep.collect_logs(&cfg.out);
    dep.teardown();
    let driven = result?;
    let mut ops: Vec<Op> = Vec::new();
    for i in 0..cfg.all_workers() {
        let path = cfg.out.join(format!("history-{i}.jsonl"));
        ops.extend(read_lines::<Op>(&path)?);
    }
    // The stalled writer's and the disk check's operations (`recheck` reads
    // every history-*).
    for name in [FAULT_HISTORY, crate::disk::DISK_HISTORY] {
        let path = cfg.out.join(name);
        if path.exists() {
            ops.extend(read_lines::<Op>(&path)?);
        }
    }
    let disk_checks = read_disk_checks(&cfg.out)?;
    let mut rec = Recorder::create(&cfg.out.join("roles.jsonl"))?;
    for s in &driven.samples {
        rec.record(s)?;
    }
    let (check, ops) = check_in_thread(ops, driven.samples, disk_checks).await?;
    let report = report::build(report::Inputs {
        mode,
        mode_reason: reason,
        seed: cfg.seed,
        schedule: cfg.schedule,
        out_dir: cfg.out.clone(),
        started_us: started,
        ended_us: now_us(),
        workers: cfg.all_workers(),
        workload_started_us: driven.workload_started_us,
        workload_stopped_us: driven.workload_stopped_us,
        worker_exits: driven.worker_exits,
        faults: driven.faults,
        ops: &ops,
        check,
        allow_inconclusive: cfg.allow_inconclusive,
        evicted_keys: driven.evicted_keys,
        disk_keys: driven.disk_keys,
        stopped_early: driven.stopped_early,
    });
    std::fs::write(
        cfg.out.join("report.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    Ok(report)
}

/// Re-checks a recorded run directory (histories and role samples).
pub async fn recheck(dir: PathBuf) -> anyhow::Result<CheckResult> {
    let mut ops = Vec::new();
    for e in std::fs::read_dir(&dir)? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with("history-") && name.ends_with(".jsonl") {
            ops.extend(read_lines::<Op>(&p)?);
        }
    }
    let samples = read_lines::<RoleSample>(&dir.join("roles.jsonl")).unwrap_or_default();
    let disk_checks = read_disk_checks(&dir)?;
    Ok(check_in_thread(ops, samples, disk_checks).await?.0)
}

/// The disk objects checked across store restarts (none in a run without
/// that fault, or recorded before it existed).
fn read_disk_checks(dir: &Path) -> anyhow::Result<Vec<DiskCheck>> {
    let path = dir.join(DISK_CHECKS);
    if path.exists() {
        read_lines::<DiskCheck>(&path)
    } else {
        Ok(Vec::new())
    }
}

/// Checks on a thread with a deep stack (the search recurses once per
/// operation of a key) and hands the history back for the report.
async fn check_in_thread(
    ops: Vec<Op>,
    samples: Vec<RoleSample>,
    disk_checks: Vec<DiskCheck>,
) -> anyhow::Result<(CheckResult, Vec<Op>)> {
    let handle = std::thread::Builder::new()
        .name("checker".into())
        .stack_size(512 << 20)
        .spawn(move || {
            let result = checker::check(&ops, &samples, &disk_checks, checker::DEFAULT_BUDGET);
            (result, ops)
        })?;
    tokio::task::spawn_blocking(move || handle.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the checker panicked"))
}

async fn choose_mode(cfg: &RunConfig) -> (Mode, String) {
    match cfg.mode {
        ModeChoice::Processes => (
            Mode::Processes,
            "asked for processes; partitions are skipped".into(),
        ),
        ModeChoice::Containers => (
            Mode::Containers,
            format!("asked for containers, image {}", cfg.image),
        ),
        ModeChoice::Auto => match container_mode_blocker(&cfg.image).await {
            None => (
                Mode::Containers,
                format!("a Docker engine answered and image {} exists", cfg.image),
            ),
            Some(why) => (Mode::Processes, format!("{why}; partitions are skipped")),
        },
    }
}

/// What the fault-injection phase hands to the report.
struct Driven {
    faults: Vec<FaultRecord>,
    samples: Vec<RoleSample>,
    evicted_keys: Option<u64>,
    /// Objects with a disk replica at the end (the leader's gauge).
    disk_keys: Option<u64>,
    workload_started_us: u64,
    /// When the stop file was written: fault windows end here, not when the
    /// report is made (teardown and checking are not time without writes).
    workload_stopped_us: u64,
    worker_exits: Vec<WorkerExit>,
    /// Why the schedule stopped before its end, if it did.
    stopped_early: Option<String>,
}

async fn drive(cfg: &RunConfig, dep: &mut dyn Deployment) -> anyhow::Result<Driven> {
    let addrs: Vec<(u64, String)> = dep
        .master_ids()
        .into_iter()
        .map(|id| (id, dep.master_addr(id)))
        .collect();
    let probe = Prober::new(&addrs, dep.client_token_file().as_deref())?;
    // Both stores' memory and disk segments: a store whose disk tier did
    // not come up would leave demotion, and the disk checks, untested.
    probe
        .wait_ready(4, Duration::from_secs(90))
        .await
        .map_err(|e| anyhow::anyhow!("cluster did not come up: {e}"))?;
    println!("chaos: cluster up (3 etcd members, 3 masters, 2 stores with a disk tier each)");

    let masters = addrs
        .iter()
        .map(|(_, a)| a.clone())
        .collect::<Vec<_>>()
        .join(",");
    let stall = StalledWriter::new(
        &masters,
        dep.client_token_file().as_deref(),
        &cfg.out.join(FAULT_HISTORY),
    )?;
    let disk = DiskChecker::new(
        addrs
            .iter()
            .map(|(id, a)| (a.clone(), dep.master_http(*id)))
            .collect(),
        dep.client_token_file().as_deref(),
        &cfg.out,
    )
    .await?;

    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = tokio::spawn(sample_roles(probe.clone(), samples.clone()));

    let plan = WorkerPlan {
        workers: cfg.all_workers(),
        cache_and_degrade_from: cfg.workers,
        tasks: cfg.tasks,
        seed: cfg.seed,
        dir: cfg.out.clone(),
        // A safety net only; the stop file ends them.
        max_duration: cfg.duration + Duration::from_secs(600),
    };
    let workload_started_us = now_us();
    dep.start_workers(&plan)?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let network = dep.network_control();
    let faults: Box<dyn Iterator<Item = Fault>> = match cfg.schedule {
        ScheduleKind::Ci => Box::new(ci_schedule(cfg.seed, network).into_iter()),
        ScheduleKind::Soak => Box::new(soak_schedule(cfg.seed, network)),
        ScheduleKind::LeaderKills => Box::new(leader_kill_schedule(cfg.seed).into_iter()),
        ScheduleKind::StalledWriters => Box::new(stalled_writer_schedule(cfg.seed).into_iter()),
        ScheduleKind::DiskRestarts => Box::new(disk_restart_schedule(cfg.seed).into_iter()),
        ScheduleKind::LateWrites => Box::new(late_write_schedule(cfg.seed).into_iter()),
        ScheduleKind::ClockSteps => Box::new(clock_step_schedule(cfg.seed).into_iter()),
        ScheduleKind::StoreSkews => Box::new(store_skew_schedule(cfg.seed).into_iter()),
        ScheduleKind::DegradedPeriods => Box::new(degraded_period_schedule(cfg.seed).into_iter()),
        ScheduleKind::FailingDisks => Box::new(failing_disk_schedule(cfg.seed).into_iter()),
        ScheduleKind::RollingRestarts => Box::new(rolling_restart_schedule(cfg.seed)),
    };
    let deadline = Instant::now() + cfg.duration;
    let mut records = Vec::new();
    let mut outcome = Ok(());
    let mut stopped_early = None;
    let timed = cfg.schedule.runs_until_duration();
    for (n, fault) in faults.enumerate() {
        if timed && Instant::now() >= deadline {
            break;
        }
        match inject(dep, &probe, &stall, &disk, &fault, &cfg.out).await {
            Ok(rec) => {
                println!(
                    "chaos: #{:<3} {:<20} {:<12} held {:>5} ms, recovered {}",
                    n + 1,
                    fault.kind.name(),
                    rec.target,
                    fault.hold.as_millis(),
                    match rec.recovered_us {
                        Some(r) => format!("{} ms after the fault", (r - rec.start_us) / 1000),
                        None => "NOT within 60 s".into(),
                    }
                );
                let stuck = rec.recovered_us.is_none();
                records.push(rec);
                if stuck {
                    // What ran up to here is still checked and reported.
                    println!("chaos: the cluster did not recover; stopping");
                    stopped_early = Some(format!(
                        "the cluster did not recover within 60 s of fault #{} ({})",
                        n + 1,
                        fault.kind.name()
                    ));
                    break;
                }
            }
            Err(e) => {
                outcome = Err(e.context(format!("injecting {}", fault.kind.name())));
                break;
            }
        }
        tokio::time::sleep(fault.settle).await;
    }
    // Let the workload run on a healthy cluster for a moment: reads after
    // the last fault are what expose a lost write.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let workload_stopped_us = now_us();
    let stopped = dep.stop_workers(&plan, Duration::from_secs(60));
    sampler.abort();
    let evicted_keys = probe.leader_metric(dep, "master_evicted_key_count").await;
    let disk_keys = probe.leader_metric(dep, "master_disk_key_count").await;
    outcome?;
    let worker_exits = stopped?;
    let samples = samples.lock().expect("lock poisoned").clone();
    Ok(Driven {
        faults: records,
        samples,
        evicted_keys,
        disk_keys,
        workload_started_us,
        workload_stopped_us,
        worker_exits,
        stopped_early,
    })
}

async fn inject(
    dep: &mut dyn Deployment,
    probe: &Prober,
    stall: &StalledWriter,
    disk: &DiskChecker,
    fault: &Fault,
    dir: &Path,
) -> anyhow::Result<FaultRecord> {
    let ids = dep.master_ids();
    let pick_master = |p: u64| ids[(p % ids.len() as u64) as usize];
    // The leader for an even pick, any master for an odd one.
    let leader_every_other_time = async |pick: u64| -> anyhow::Result<u64> {
        if pick.is_multiple_of(2) {
            probe.leader(Duration::from_secs(20)).await
        } else {
            Ok(pick_master(pick / 2))
        }
    };
    let start_us = now_us();
    let target;
    match fault.kind {
        FaultKind::KillLeaderAmidRemoves => {
            // The workers watch the focus file (see `workload`).
            let focus = focus_file(dir);
            std::fs::write(&focus, b"focus")?;
            tokio::time::sleep(Duration::from_millis(800)).await;
            let killed = async {
                let id = probe.leader(Duration::from_secs(20)).await?;
                dep.kill_master(id)?;
                tokio::time::sleep(fault.hold).await;
                dep.start_master(id)?;
                // Keep the hot keys busy through the takeover and beyond.
                probe.wait_recovered(RECOVERY_LIMIT).await?;
                tokio::time::sleep(Duration::from_secs(1)).await;
                anyhow::Ok(id)
            }
            .await;
            let _ = std::fs::remove_file(&focus);
            target = format!("master {}", killed?);
        }
        FaultKind::StalledWriterAcrossFailover => {
            // The workers put hot values (the stalled puts' size) throughout.
            let focus = focus_file(dir);
            std::fs::write(&focus, b"focus")?;
            let killed = stalled_writer_across_failover(dep, probe, stall, fault).await;
            let _ = std::fs::remove_file(&focus);
            target = format!("master {}", killed?);
        }
        FaultKind::LateWriteAfterRevoke | FaultKind::LateWriteAcrossClockStep => {
            // The workers put hot values (the late puts' size) throughout.
            let focus = focus_file(dir);
            std::fs::write(&focus, b"focus")?;
            let step = fault.kind == FaultKind::LateWriteAcrossClockStep;
            let leader = late_write_after_revoke(dep, probe, stall, step).await;
            let _ = std::fs::remove_file(&focus);
            target = format!("master {}", leader?);
        }
        FaultKind::LateRequestToSkewedStore => {
            // Without the workers' focus: their hot values have the late
            // requests' size and would take the freed ranges before the
            // victims, and remove them before they are read back.
            late_request_to_skewed_store(dep, stall, disk).await?;
            target = format!("store {CLOCKED_STORE}");
        }
        FaultKind::AddAndRemoveMaster => {
            target = crate::membership::add_and_remove_master(dep, fault.hold).await?;
        }
        FaultKind::KillLeader | FaultKind::KillRandomMaster => {
            let id = if fault.kind == FaultKind::KillLeader {
                probe.leader(Duration::from_secs(20)).await?
            } else {
                pick_master(fault.pick)
            };
            target = format!("master {id}");
            dep.kill_master(id)?;
            tokio::time::sleep(fault.hold).await;
            dep.start_master(id)?;
        }
        FaultKind::TearMasterLog => {
            let id = leader_every_other_time(fault.pick).await?;
            target = format!("master {id}");
            dep.kill_master(id)?;
            let torn = match dep.master_data_dir(id) {
                Some(data_dir) => tear_log_tail(&data_dir, fault.pick)?,
                None => "not torn (its data dir is not reachable in this mode)".to_string(),
            };
            println!("chaos:      master {id}'s log: {torn}");
            tokio::time::sleep(fault.hold).await;
            dep.start_master(id)?;
        }
        FaultKind::PauseAllMasters => {
            target = "every master".into();
            let mut paused = Vec::new();
            let mut failed = None;
            for id in &ids {
                match dep.pause_master(*id) {
                    Ok(()) => paused.push(*id),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            if failed.is_none() {
                tokio::time::sleep(fault.hold).await;
            }
            // Every paused master is resumed, whatever failed.
            for id in paused {
                if let Err(e) = dep.resume_master(id) {
                    failed.get_or_insert(e);
                }
            }
            if let Some(e) = failed {
                return Err(e);
            }
        }
        FaultKind::PauseMaster => {
            let id = leader_every_other_time(fault.pick).await?;
            target = format!("master {id}");
            dep.pause_master(id)?;
            tokio::time::sleep(fault.hold).await;
            dep.resume_master(id)?;
        }
        FaultKind::PartitionLeader | FaultKind::PartitionFollower => {
            let leader = probe.leader(Duration::from_secs(20)).await?;
            let id = if fault.kind == FaultKind::PartitionLeader {
                leader
            } else {
                let followers: Vec<u64> = ids.iter().copied().filter(|i| *i != leader).collect();
                followers[(fault.pick % followers.len() as u64) as usize]
            };
            target = format!("master {id}");
            dep.isolate_master(id)?;
            tokio::time::sleep(fault.hold).await;
            dep.heal_master(id)?;
        }
        FaultKind::PauseStore => {
            // The workers put hot values (one size) throughout, so writes
            // stalled in the paused store's kernel and the puts that follow
            // them elsewhere are the same size.
            target = "store 1".into();
            let focus = focus_file(dir);
            std::fs::write(&focus, b"focus")?;
            let paused = dep.pause_store(1);
            if paused.is_ok() {
                tokio::time::sleep(fault.hold).await;
            }
            let resumed = dep.resume_store(1);
            // Time for the bytes it had queued to land, and be read over.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let _ = std::fs::remove_file(&focus);
            paused?;
            resumed?;
        }
        FaultKind::PartitionStore => {
            // As PauseStore, with the bytes held in the senders' kernels:
            // they arrive when TCP retransmits them after the heal.
            target = "store 1".into();
            let focus = focus_file(dir);
            std::fs::write(&focus, b"focus")?;
            let cut = dep.cut_store(1, true);
            if matches!(cut, Ok(true)) {
                tokio::time::sleep(fault.hold).await;
            } else {
                println!(
                    "chaos:      store 1 not cut off (processes mode as root, with iptables, only)"
                );
            }
            let healed = dep.cut_store(1, false);
            // Retransmissions back off exponentially: the next one after
            // the heal may come about as long after it as the cut lasted.
            tokio::time::sleep(fault.hold.max(Duration::from_secs(4))).await;
            let _ = std::fs::remove_file(&focus);
            cut?;
            healed?;
        }
        FaultKind::KillStore => {
            // Only the second store: every object keeps a replica on the
            // first (see docs/guarantees.md: a store's memory is its data).
            target = "store 1".into();
            dep.kill_store(1)?;
            tokio::time::sleep(fault.hold).await;
            dep.start_store(1)?;
        }
        FaultKind::RestartStoreWithDisk => {
            // The second store, as KillStore: every memory object keeps its
            // replica on the first (killing both in turn would lose memory
            // objects written between the kills, which is no guarantee).
            target = "store 1".into();
            let memory = crescent_proto::units::parse_size(crate::deploy::MEMORY_SEGMENT)?;
            let summary = restart_store_with_disk(dep, disk, 1, fault.hold, 2 * memory).await?;
            println!("chaos:      store 1's {summary}");
        }
        FaultKind::FailingDisk => {
            target = "store 1's disk".into();
            let memory = crescent_proto::units::parse_size(crate::deploy::MEMORY_SEGMENT)?;
            let summary = failing_disk(dep, disk, 1, fault.hold, 2 * memory).await?;
            println!("chaos:      store 1's {summary}");
        }
        FaultKind::KillEtcdMember => {
            let i = (fault.pick % dep.etcd_members() as u64) as usize;
            target = format!("etcd {i}");
            dep.kill_etcd(i)?;
            tokio::time::sleep(fault.hold).await;
            dep.start_etcd(i)?;
        }
        FaultKind::RollingRestart => {
            target = "everything".into();
            for i in 0..dep.etcd_members() {
                dep.kill_etcd(i)?;
                dep.start_etcd(i)?;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            // Followers first, the leader last: one election, not three.
            let leader = probe.leader(Duration::from_secs(20)).await?;
            let mut order: Vec<u64> = ids.iter().copied().filter(|i| *i != leader).collect();
            order.push(leader);
            for id in order {
                dep.kill_master(id)?;
                dep.start_master(id)?;
                probe.wait_recovered(RECOVERY_LIMIT).await?;
            }
            dep.kill_store(1)?;
            dep.start_store(1)?;
        }
        FaultKind::BigBatch => {
            let (committed, failed) = probe.big_batches(fault.hold, start_us).await;
            println!("chaos:      big batches: {committed} committed, {failed} failed");
            anyhow::ensure!(committed > 0, "no big batch committed ({failed} failed)");
            target = "leader".into();
        }
        FaultKind::ConnectionFlood => {
            let leader = probe.leader(Duration::from_secs(20)).await?;
            let mut targets = vec![dep.master_addr(leader), dep.master_http(leader)];
            targets.extend(probe.store_endpoints().await?);
            let held = flood(&targets, fault.hold).await;
            println!("chaos:      flood: {held} connections held to {targets:?}");
            target = format!("master {leader}");
        }
    }
    let healed_us = now_us();
    let recovered_us = probe
        .wait_recovered(RECOVERY_LIMIT)
        .await
        .ok()
        .map(|_| now_us());
    Ok(FaultRecord {
        kind: fault.kind,
        target,
        start_us,
        healed_us,
        recovered_us,
    })
}

/// Leaves what a crash in the middle of a write leaves past the end of a
/// stopped master's Raft log: random bytes where its next batch would have
/// gone. Nothing synced is touched.
fn tear_log_tail(data_dir: &Path, seed: u64) -> anyhow::Result<String> {
    use rand::{Rng, SeedableRng};
    use std::os::unix::fs::FileExt;
    let end = crescent_raft::journal::valid_end(data_dir)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let len = rng.random_range(64..4096usize);
    let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(data_dir.join(crescent_raft::journal::FILE_NAME))?;
    file.write_all_at(&bytes, end)?;
    file.sync_all()?;
    Ok(format!(
        "{len} random bytes at offset {end}, past its last synced batch"
    ))
}

/// [`FaultKind::StalledWriterAcrossFailover`]: stalled puts placed by the
/// leader, the leader SIGKILLed (restarted after `hold`, as a leader kill),
/// the workers and a few victim puts served by the new leader for
/// [`WORKERS_PUT_FOR`], then the stalled bytes and PutEnds, and every
/// replica of the keys involved read back. Returns the killed master.
async fn stalled_writer_across_failover(
    dep: &mut dyn Deployment,
    probe: &Prober,
    stall: &StalledWriter,
    fault: &Fault,
) -> anyhow::Result<u64> {
    probe.leader(Duration::from_secs(20)).await?;
    let mut round = stall.round();
    let placed = round.place_stalled().await;
    // The leader that placed them (unless leadership moved meanwhile: then
    // the one that leads now; the stalled puts still outlive a failover).
    let (id, term) = probe.leader_term(Duration::from_secs(20)).await?;
    dep.kill_master(id)?;
    let killed = Instant::now();
    // One step after another, never a Deployment call (which may block this
    // thread on the container engine) beside requests in flight.
    let new = probe.leader_after(term, RECOVERY_LIMIT).await;
    let answered = Instant::now();
    if new.is_ok() {
        round.put_victims(WORKERS_PUT_FOR).await;
    }
    // Restarted after the hold, as a leader kill is (later only if the
    // victims took longer).
    tokio::time::sleep(fault.hold.saturating_sub(killed.elapsed())).await;
    dep.start_master(id)?;
    let new = new?;
    tokio::time::sleep(WORKERS_PUT_FOR.saturating_sub(answered.elapsed())).await;
    round.finish_stalled(placed).await;
    round.read_back().await;
    println!(
        "chaos:      stalled writer (leader {id} of term {term}, then {} of term {}): {}",
        new.0, new.1, round.summary
    );
    // The workers' own reads of the hot keys, after the stalled writes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(id)
}

/// [`FaultKind::LateWriteAfterRevoke`]: puts placed by the leader, each
/// replica's write held halfway on a connection of its own, the puts
/// revoked, the workers and a few victim puts of the same size served for
/// [`WORKERS_PUT_FOR`], then the held halves delivered (their grants still
/// valid), and every replica of the keys involved read back. Returns the
/// leader the puts were placed by.
///
/// With `clock_step` ([`FaultKind::LateWriteAcrossClockStep`]), the leader's
/// wall clock steps an hour forward right after the revokes, and back when
/// the late halves are delivered: a master that fenced on its wall clock
/// frees the revoked ranges at its next upkeep.
async fn late_write_after_revoke(
    dep: &mut dyn Deployment,
    probe: &Prober,
    stall: &StalledWriter,
    clock_step: bool,
) -> anyhow::Result<u64> {
    let (id, term) = probe.leader_term(Duration::from_secs(20)).await?;
    let mut round = stall.round();
    let placed = round.place_stalled().await;
    let late = round.start_late_writes(&placed).await;
    round.revoke_placed(placed).await;
    let revoked = Instant::now();
    let stepped = clock_step && dep.step_master_clock(id, 3_600)?;
    if stepped {
        // The step reaches the leader within 1.5 s; its upkeep runs each second.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
    }
    round.put_victims(WORKERS_PUT_FOR).await;
    tokio::time::sleep(WORKERS_PUT_FOR.saturating_sub(revoked.elapsed())).await;
    round.deliver_late(late).await;
    if stepped {
        // Nothing between the steps returns early, so the clock comes back.
        dep.step_master_clock(id, 0)?;
    }
    round.read_back().await;
    let clock = match (clock_step, stepped) {
        (false, _) => "",
        (true, true) => ", its wall clock an hour ahead from the revokes to the late halves",
        (true, false) => ", its wall clock not stepped (no libfaketime, or containers)",
    };
    println!(
        "chaos:      late writes (leader {id} of term {term}{clock}): {} replica writes held, {} landed late; {}",
        round.summary.late_writes, round.summary.late_landed, round.summary
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(id)
}

/// How far behind the true time [`FaultKind::LateRequestToSkewedStore`]
/// sets the wall clock of store [`CLOCKED_STORE`] (the second: as for the
/// store faults, every object keeps a replica on the first).
const STORE_SKEW_SECS: i64 = -3_600;

/// [`FaultKind::LateRequestToSkewedStore`]: store [`CLOCKED_STORE`]
/// restarted with its wall clock an hour behind; puts placed by the leader,
/// each replica's whole write request built and held, the puts revoked;
/// once every revoked range is past its write fence (grant expiry plus
/// margin, and an upkeep), victims of the same size put, then the held
/// requests delivered under their expired grants and every replica of the
/// keys involved read back; the store restarted with a true clock, also
/// when a step failed. A store that judged grants by its own clock, an
/// hour behind, writes the late requests over the victims.
async fn late_request_to_skewed_store(
    dep: &mut dyn Deployment,
    stall: &StalledWriter,
    disk: &DiskChecker,
) -> anyhow::Result<()> {
    let skewed = dep.set_store_clock(CLOCKED_STORE, STORE_SKEW_SECS)?;
    if !skewed {
        // Unskewed, it would test only that a store refuses an expired
        // grant, which the store's own tests cover: not worth a minute.
        println!("chaos:      store {CLOCKED_STORE}'s clock cannot be set in this mode; not run");
        return Ok(());
    }
    let memory = crescent_proto::units::parse_size(crate::deploy::MEMORY_SEGMENT)?;
    let played = async {
        dep.kill_store(CLOCKED_STORE)?;
        dep.start_store(CLOCKED_STORE)?;
        let http = dep.store_http(CLOCKED_STORE);
        // Placements must name its new segment, not the killed one's.
        let back = disk.store_back(&http, 2 * memory).await;
        // Its first heartbeat answer carries the leader's clock.
        let loud = crescent_integration::metric_reaches(
            &http,
            "store_clock_off",
            1.0,
            Duration::from_secs(8),
        )
        .await;
        let mut round = stall.round();
        let placed = round.place_stalled().await;
        let (held, expiry_ms) = round.hold_requests(&placed);
        round.revoke_placed(placed).await;
        // Past every revoked range's fence, and the leader's next upkeep.
        let fenced_until_ms = expiry_ms
            .saturating_add(crescent_raft::state::WRITE_FENCE_MARGIN_MS)
            .saturating_add(1_500);
        let wait_ms = fenced_until_ms.saturating_sub(now_us() / 1_000).min(60_000);
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        round.put_victims(Duration::from_secs(4)).await;
        round.deliver_held(held).await;
        round.read_back().await;
        anyhow::Ok((back, loud, wait_ms, round.summary))
    }
    .await;
    dep.set_store_clock(CLOCKED_STORE, 0)?;
    dep.kill_store(CLOCKED_STORE)?;
    dep.start_store(CLOCKED_STORE)?;
    let (back, loud, wait_ms, summary) = played?;
    let clock = if loud {
        "an hour behind, reported off (store_clock_off 1)"
    } else {
        "an hour behind, NOT reported off"
    };
    let back = if back {
        ""
    } else {
        " (its old segment was still listed)"
    };
    println!(
        "chaos:      late requests (store {CLOCKED_STORE}'s clock {clock}{back}, {wait_ms} ms past the revokes): \
         {} replica requests held, {} landed late; {summary}",
        summary.late_writes, summary.late_landed
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(())
}

async fn sample_roles(probe: Prober, out: Arc<Mutex<Vec<RoleSample>>>) {
    loop {
        let view = probe.poll().await;
        {
            let mut out = out.lock().expect("lock poisoned");
            for (id, s) in view {
                if let Some(s) = s {
                    out.push(RoleSample {
                        node: id,
                        term: s.term,
                        leader: s.role == pb::Role::Leader as i32,
                        at_us: now_us(),
                        applied_index: s.applied,
                        applied_term: s.applied_term,
                        applied_leader: s.applied_leader,
                    });
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// Polls masters' GetStatus directly (no leader following).
#[derive(Clone)]
struct Prober {
    client: Arc<MasterClient>,
    addrs: Vec<(u64, String)>,
}

impl Prober {
    fn new(addrs: &[(u64, String)], token_file: Option<&std::path::Path>) -> anyhow::Result<Self> {
        let token = crescent_auth::BearerToken::from_optional_file(token_file)?;
        let list = addrs
            .iter()
            .map(|(_, a)| a.clone())
            .collect::<Vec<_>>()
            .join(",");
        Ok(Self {
            client: Arc::new(MasterClient::new(&list)?.with_token(token)),
            addrs: addrs.to_vec(),
        })
    }

    async fn poll(&self) -> Vec<(u64, Option<pb::GetStatusResponse>)> {
        let calls = self.addrs.iter().map(|(id, addr)| async move {
            let r = tokio::time::timeout(Duration::from_millis(500), self.client.node_status(addr))
                .await;
            (*id, r.ok().and_then(Result::ok))
        });
        futures::future::join_all(calls).await
    }

    /// The leader of the highest term among the masters that answer.
    async fn leader(&self, within: Duration) -> anyhow::Result<u64> {
        Ok(self.leader_term(within).await?.0)
    }

    /// The leader of the highest term among the masters that answer, and that term.
    async fn leader_term(&self, within: Duration) -> anyhow::Result<(u64, u64)> {
        self.leader_after(0, within).await
    }

    /// A leader of a term after `term` (and that term), once one answers.
    async fn leader_after(&self, term: u64, within: Duration) -> anyhow::Result<(u64, u64)> {
        let deadline = Instant::now() + within;
        loop {
            let view = self.poll().await;
            if let Some(s) = view
                .iter()
                .filter_map(|(_, s)| s.as_ref())
                .filter(|s| s.role == pb::Role::Leader as i32 && s.term > term)
                .max_by_key(|s| s.term)
            {
                return Ok((s.id, s.term));
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "no leader of a term after {term} within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every master answers, agrees on one leader and term, and the leader
    /// sees at least `segments` mounted segments.
    async fn wait_ready(&self, segments: u64, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let view = self.poll().await;
            let all: Vec<&pb::GetStatusResponse> =
                view.iter().filter_map(|(_, s)| s.as_ref()).collect();
            let leader = all.iter().find(|s| s.role == pb::Role::Leader as i32);
            if let Some(l) = leader {
                let agreed = all.len() == self.addrs.len()
                    && all.iter().all(|s| s.term == l.term && s.leader_id == l.id)
                    && all.iter().all(|s| s.applied + 1000 >= l.committed);
                if agreed && l.segment_count >= segments {
                    return Ok(());
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "not ready within {within:?} ({} of {} masters answer, leader {:?})",
                all.len(),
                self.addrs.len(),
                leader.map(|l| l.id)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_recovered(&self, within: Duration) -> anyhow::Result<()> {
        self.wait_ready(1, within).await
    }

    /// Starts, commits and force-removes the largest batches a master
    /// accepts until `hold` has passed (at most 20); returns how many
    /// committed and how many failed. Keys are the checker's business only
    /// if a worker wrote them: these are `chaos-big-…`, 1 byte each.
    async fn big_batches(&self, hold: Duration, tag: u64) -> (u32, u32) {
        let n = crescent_proto::MAX_BATCH_ITEMS;
        let len = crescent_proto::MAX_BATCH_KEY_BYTES / n;
        let one = pb::ReplicateConfig {
            replica_num: 1,
            ..Default::default()
        };
        let deadline = Instant::now() + hold;
        // A batch that fails while the cluster is still settling from the
        // previous fault is retried past `hold`, for at most a minute: the
        // fault asks that the largest batches commit, not that the first does.
        let give_up = Instant::now() + hold.max(Duration::from_secs(60));
        let (mut committed, mut failed) = (0, 0);
        for round in 0..20 {
            let now = Instant::now();
            if round > 0 && (now >= give_up || (now >= deadline && committed > 0)) {
                break;
            }
            let keys: Vec<String> = (0..n)
                .map(|i| {
                    let k = format!("chaos-big-{tag}-{round}-{i}-");
                    format!("{k}{}", "x".repeat(len.saturating_sub(k.len())))
                })
                .collect();
            let put_ids: Vec<u64> = keys.iter().map(|_| self.client.new_put_id()).collect();
            let items = keys
                .iter()
                .zip(&put_ids)
                .map(|(k, id)| pb::PutStartItem {
                    key: k.clone(),
                    size: 1,
                    put_id: *id,
                })
                .collect();
            let ends = keys
                .iter()
                .zip(&put_ids)
                .map(|(k, id)| pb::PutEndItem {
                    key: k.clone(),
                    checksum: 0,
                    put_id: *id,
                    ..Default::default()
                })
                .collect();
            let outcome = async {
                self.client.batch_put_start(items, one.clone()).await?;
                self.client.batch_put_end(ends).await?;
                self.client.batch_remove(keys.clone(), true).await
            }
            .await;
            match outcome {
                Ok(_) => committed += 1,
                Err(e) => {
                    failed += 1;
                    println!("chaos:      big batch {round} failed: {e}");
                    // A failed round must not leave its puts counting
                    // against the prober's quota of unfinished puts for ten
                    // minutes: revoke what did not commit, remove what did.
                    let revokes = keys.iter().cloned().zip(put_ids).collect();
                    let _ = self.client.batch_put_revoke(revokes).await;
                    let _ = self.client.batch_remove(keys, true).await;
                    let pause = give_up.saturating_duration_since(Instant::now());
                    tokio::time::sleep(pause.min(Duration::from_millis(500))).await;
                }
            }
        }
        (committed, failed)
    }

    /// The data endpoints of the stores, as a put is told them (a probe put
    /// with a replica on each store, then revoked).
    async fn store_endpoints(&self) -> anyhow::Result<Vec<String>> {
        // Retried for a while: the probe put may land on a leader that is
        // still settling from the previous fault.
        let deadline = Instant::now() + Duration::from_secs(30);
        let replicas = loop {
            let key = format!("chaos-endpoints-{}", now_us());
            let config = pb::ReplicateConfig {
                replica_num: 2,
                ..Default::default()
            };
            match self.client.put_start(&key, 64, config).await {
                Ok(replicas) => {
                    let _ = self.client.put_revoke(&key).await;
                    break replicas;
                }
                Err(e) if Instant::now() < deadline => {
                    println!("chaos:      probe put for store endpoints failed, retrying: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(anyhow::anyhow!("probe put for store endpoints: {e}")),
            }
        };
        let mut endpoints: Vec<String> = replicas.into_iter().map(|r| r.endpoint).collect();
        endpoints.sort();
        endpoints.dedup();
        Ok(endpoints)
    }

    /// Metric `name` (e.g. `master_evicted_key_count`) from the leader's
    /// /metrics.
    async fn leader_metric(&self, dep: &dyn Deployment, name: &str) -> Option<u64> {
        let leader = self.leader(Duration::from_secs(10)).await.ok()?;
        let (status, body) =
            crescent_integration::http_request(&dep.master_http(leader), "GET", "/metrics", &[])
                .await
                .ok()?;
        if status != 200 {
            return None;
        }
        body.lines()
            .find(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with(' ')))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map(|v| v as u64)
    }
}

/// Connections a flood opens to each target: half the store's default cap
/// of 4,096, so the flood presses on every listener without locking real
/// clients out of a store.
const FLOOD_PER_TARGET: usize = 2_000;

/// Opens up to [`FLOOD_PER_TARGET`] connections to each of `targets` (every
/// other one sends the first bytes of a frame and stops), holds them for
/// `hold`, closes them all; returns how many were open. Connecting stops
/// early at a target that refuses or after 20 s in all.
async fn flood(targets: &[String], hold: Duration) -> usize {
    use tokio::io::AsyncWriteExt;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut held = Vec::new();
    for addr in targets {
        for i in 0..FLOOD_PER_TARGET {
            if Instant::now() >= deadline {
                break;
            }
            let Ok(Ok(mut conn)) = tokio::time::timeout(
                Duration::from_secs(1),
                tokio::net::TcpStream::connect(addr.as_str()),
            )
            .await
            else {
                break;
            };
            if i % 2 == 1 {
                let _ = conn.write_all(&[0, 0, 0x10, 0x01]).await;
            }
            held.push(conn);
        }
    }
    let n = held.len();
    tokio::time::sleep(hold).await;
    drop(held);
    n
}
