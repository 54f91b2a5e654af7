//! `crescent-chaos`: run a chaos schedule against a real cluster and check it.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use crescent_chaos::run::{ModeChoice, RunConfig};
use crescent_chaos::schedule::ScheduleKind;
use crescent_chaos::workload::{run_worker, WorkerConfig};
use crescent_proto::units::parse_duration;

#[derive(Parser)]
#[command(
    name = "crescent-chaos",
    version,
    about = "Fault injection with a checked history against a real Crescent cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

#[derive(Subcommand)]
enum Cmd {
    /// Deploy a cluster, run the workload and the fault schedule, check the
    /// history, print the summary and write report.json. Exits 1 on any violation.
    Run {
        /// containers (a Docker engine and `make images` needed), processes, or auto.
        #[arg(long, env = "CRESCENT_CHAOS_MODE", value_enum, default_value = "auto")]
        mode: ModeChoice,
        /// ci: the fixed short mix; soak: random faults until --duration;
        /// stalled-writers: only stalled writers across failovers;
        /// disk-restarts: only store restarts with the disk tier;
        /// late-writes: only late writes after revokes;
        /// clock-steps: only late writes across steps of the leader's wall clock;
        /// rolling-restarts: only rolling restarts until --duration.
        #[arg(
            long,
            env = "CRESCENT_CHAOS_SCHEDULE",
            value_enum,
            default_value = "ci"
        )]
        schedule: ScheduleKind,
        /// How long a soak or rolling-restarts run injects faults (the other
        /// schedules have a fixed length).
        #[arg(long, env = "CRESCENT_CHAOS_DURATION", default_value = "5m", value_parser = duration)]
        duration: Duration,
        /// Seed of the schedule and the workload; random when omitted (and printed).
        #[arg(long, env = "CRESCENT_CHAOS_SEED")]
        seed: Option<u64>,
        /// Parent directory: each run writes its histories, logs and
        /// report.json into a fresh `<time>-<schedule>-seed<seed>` directory
        /// in it, and `latest` points there.
        #[arg(long, env = "CRESCENT_CHAOS_OUT", default_value = "target/chaos")]
        out: PathBuf,
        /// Image for container mode (built by `make images`).
        #[arg(long, env = "CRESCENT_CHAOS_IMAGE", default_value = "crescent:latest")]
        image: String,
        /// Workload processes (containers in container mode).
        #[arg(long, default_value_t = 2)]
        workers: u32,
        /// More workers whose clients keep a descriptor cache and go
        /// degraded when no master answers; their reads are judged by what
        /// they promise (bounded staleness, real bytes). Default: 1 in a
        /// soak or a degraded-periods run, else 0.
        #[arg(long)]
        cache_and_degrade_workers: Option<u32>,
        /// Logical clients per worker, each with one operation in flight
        /// (process ids are 100 × worker + task, so at most 99).
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..100))]
        tasks: u32,
        /// The masters' --put-mode (one-commit, their default, or
        /// two-commit). Two-commit puts are placed by best fit over the
        /// whole segment, so a freed range goes to the next put of its size;
        /// one-commit puts go into reservations that fill and rotate.
        #[arg(long, value_parser = ["one-commit", "two-commit"])]
        put_mode: Option<String>,
        /// Pass a run whose linearizability search gave up on some keys
        /// (they are still listed); without it such a run fails.
        #[arg(long)]
        allow_inconclusive: bool,
        /// TEST ONLY: start masters with --unsafe-ack-before-commit, which
        /// breaks durability on purpose; the run must then fail.
        #[arg(long, hide = true)]
        unsafe_ack_before_commit: bool,
        /// TEST ONLY: start masters with --unsafe-forget-leases, which breaks
        /// the read-lease guarantee on purpose; the run must then fail.
        #[arg(long, hide = true)]
        unsafe_forget_leases: bool,
        /// TEST ONLY: start masters with --unsafe-adopt-foreign-reservations:
        /// a new leader places puts in the ranges an earlier term's leader
        /// reserved, where that leader's writers may still write; the run
        /// must then fail (use --schedule stalled-writers).
        #[arg(long, hide = true)]
        unsafe_adopt_foreign_reservations: bool,
        /// TEST ONLY: start masters with --unsafe-reuse-revoked-ranges: a
        /// leader places a revoked put's range again while bytes sent under
        /// its grants may still land; the run must then fail (use
        /// --schedule late-writes).
        #[arg(long, hide = true)]
        unsafe_reuse_revoked_ranges: bool,
        /// TEST ONLY: start stores with --unsafe-forget-disk-on-restart: a
        /// restarted store deletes its disk segment, so its disk objects are
        /// lost; the run must then fail (use --schedule disk-restarts).
        #[arg(long, hide = true)]
        unsafe_forget_disk_on_restart: bool,
        /// TEST ONLY: start masters with --unsafe-exclusive-promotion: a
        /// promotion releases the object's disk replica, so a store restart
        /// loses objects read from its disk; the run must then fail (use
        /// --schedule disk-restarts).
        #[arg(long, hide = true)]
        unsafe_exclusive_promotion: bool,
        /// TEST ONLY: start masters with --unsafe-evict-on-failed-copy: a
        /// demotion the target disk failed evicts the object rather than
        /// move it to another disk; the run must then fail (use
        /// --schedule failing-disks).
        #[arg(long, hide = true)]
        unsafe_evict_on_failed_copy: bool,
        /// TEST ONLY: start masters with --unsafe-resume-leadership: a
        /// restarted leader leads again in its old term without an election,
        /// and serves reads before it has applied what it acknowledged; the
        /// run must then fail (use --schedule rolling-restarts).
        #[arg(long, hide = true)]
        unsafe_resume_leadership: bool,
        /// TEST ONLY: start masters and stores with --unsafe-wall-clock:
        /// they read the wall clock for fences and grants, and stores do
        /// not compare theirs with the leader's, so a step of the leader's
        /// wall clock frees ranges still writable, and a store whose clock
        /// is behind honours expired grants; the run must then fail (use
        /// --schedule clock-steps or store-skews, processes mode).
        #[arg(long, hide = true)]
        unsafe_wall_clock: bool,
    },
    /// Re-check a recorded run directory.
    Check { dir: PathBuf },
    /// (internal) One workload process; started by `run`.
    #[command(hide = true)]
    Worker(WorkerArgs),
}

#[derive(clap::Args)]
struct WorkerArgs {
    #[arg(long)]
    master: String,
    #[arg(long)]
    worker: u32,
    #[arg(long, default_value_t = 4)]
    tasks: u32,
    #[arg(long)]
    seed: u64,
    #[arg(long)]
    out: PathBuf,
    #[arg(long)]
    stop_file: PathBuf,
    #[arg(long)]
    focus_file: PathBuf,
    #[arg(long, default_value = "1h", value_parser = duration)]
    max_duration: Duration,
    /// Keep a descriptor cache and go degraded without masters, as an
    /// engine may: reads are then judged by what they promise.
    #[arg(long)]
    cache_and_degrade: bool,
    /// The client token's file (token-mode clusters).
    #[arg(long)]
    token_file: Option<PathBuf>,
}

impl From<WorkerArgs> for WorkerConfig {
    fn from(a: WorkerArgs) -> Self {
        WorkerConfig {
            master: a.master,
            worker: a.worker,
            tasks: a.tasks,
            seed: a.seed,
            out: a.out,
            stop_file: a.stop_file,
            focus_file: a.focus_file,
            max_duration: a.max_duration,
            token_file: a.token_file,
            op_timeout: Duration::from_secs(10),
            replicas: 2,
            cache_and_degrade: a.cache_and_degrade,
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    crescent_runtime::init_tool_logging("warn");
    match real_main(Cli::parse()).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("crescent-chaos: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn real_main(cli: Cli) -> anyhow::Result<std::process::ExitCode> {
    match cli.command {
        Cmd::Run {
            mode,
            schedule,
            duration,
            seed,
            out,
            image,
            workers,
            cache_and_degrade_workers,
            tasks,
            allow_inconclusive,
            put_mode,
            unsafe_ack_before_commit,
            unsafe_forget_leases,
            unsafe_adopt_foreign_reservations,
            unsafe_reuse_revoked_ranges,
            unsafe_forget_disk_on_restart,
            unsafe_exclusive_promotion,
            unsafe_evict_on_failed_copy,
            unsafe_resume_leadership,
            unsafe_wall_clock,
        } => {
            let seed = seed.unwrap_or_else(rand::random);
            // Short put timeouts: with the defaults (30 s, 600 s) an earlier
            // term's reservations wait ten minutes to be retired, so under a
            // failover every few seconds segments would soon hold their 16
            // reservations and puts would fall back to two commits; these
            // keep the one-commit path, and the retiring, in play.
            //
            // The memory watermark: 2 % (about 10 MiB of the 512 MiB the
            // two stores' memory segments offer). The workload alone holds
            // about 1 MiB, and a long soak's never-removed shared keys a
            // few more, so it never demotes by itself; a store restart with
            // the disk tier puts fillers past it to make the leader demote
            // (see `crescent_chaos::disk`). At the default 0.90 that would
            // take 460 MiB of fillers.
            //
            // The expired-segment grace: 10 s instead of 60 s. A killed
            // store's old memory segment stays listed, expired, for the
            // grace, and a demotion meanwhile may copy from its replica,
            // fail and evict the object although its other replica is
            // intact; the fillers wait until no such segment is listed.
            //
            // Promotion up to 1.5 % memory usage (the default 0.85 is above
            // the watermark, which would cap it at 2 %): objects read twice
            // from disk, the disk check's among them, come back to memory
            // without pushing memory past the watermark, so promotion
            // never makes the leader demote outside the disk check.
            let mut master_flags: Vec<String> = [
                "--client-ttl",
                "3s",
                "--put-start-discard-timeout",
                "10s",
                "--put-start-release-timeout",
                "30s",
                "--eviction-high-watermark",
                "0.02",
                "--expired-segment-grace",
                "10s",
                "--promotion-max-memory-usage",
                "0.015",
            ]
            .map(String::from)
            .to_vec();

            if unsafe_ack_before_commit {
                master_flags.push("--unsafe-ack-before-commit".into());
            }
            if unsafe_forget_leases {
                master_flags.push("--unsafe-forget-leases".into());
                // One-commit puts go into reservations carved whole from
                // free space, so a removed object's few KiB are reused only
                // by two-commit puts: with one commit the broken run rarely
                // hands a leased object's space to a new put and passes.
                // Two commits reuse it at once, as the bug class needs.
            }
            let put_mode = put_mode.or(unsafe_forget_leases.then(|| "two-commit".to_string()));
            if let Some(mode) = put_mode {
                master_flags.extend(["--put-mode".to_string(), mode]);
            }
            if unsafe_adopt_foreign_reservations {
                master_flags.push("--unsafe-adopt-foreign-reservations".into());
            }
            if unsafe_reuse_revoked_ranges {
                master_flags.push("--unsafe-reuse-revoked-ranges".into());
            }
            if unsafe_exclusive_promotion {
                master_flags.push("--unsafe-exclusive-promotion".into());
            }
            if unsafe_evict_on_failed_copy {
                master_flags.push("--unsafe-evict-on-failed-copy".into());
            }
            if unsafe_resume_leadership {
                master_flags.push("--unsafe-resume-leadership".into());
            }
            let mut store_flags = Vec::new();
            if unsafe_forget_disk_on_restart {
                store_flags.push("--unsafe-forget-disk-on-restart".to_string());
            }
            if unsafe_wall_clock {
                master_flags.push("--unsafe-wall-clock".into());
                store_flags.push("--unsafe-wall-clock".to_string());
            }
            let report = crescent_chaos::run::run(RunConfig {
                mode,
                schedule,
                duration,
                seed,
                out: out.clone(),
                image,
                workers,
                cache_and_degrade_workers: cache_and_degrade_workers
                    .unwrap_or(schedule.runs_cache_and_degrade_worker() as u32),
                tasks,
                allow_inconclusive,
                master_flags,
                store_flags,
            })
            .await?;
            let verdict = format!(
                "chaos: {} ({:.0} s, mode {:?}, seed {}; report: {})",
                report.verdict(),
                report.duration_s,
                report.mode,
                report.seed,
                report.out_dir.join("report.json").display()
            );
            println!("{verdict}");
            println!("{}", report.table());
            println!("{verdict}");
            Ok(if report.passed {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::from(1)
            })
        }
        Cmd::Check { dir } => {
            let r = crescent_chaos::run::recheck(dir).await?;
            println!(
                "{} keys checked, {} violations, {} inconclusive",
                r.keys_checked,
                r.violations.len(),
                r.inconclusive_keys.len()
            );
            println!(
                "{} disk objects checked across store restarts ({} removed meanwhile)",
                r.disk_objects_checked, r.disk_objects_removed_meanwhile
            );
            println!("{}", r.leadership.summary());
            for v in &r.violations {
                println!(
                    "  {:?} {}: {}",
                    v.kind,
                    v.key.as_deref().unwrap_or("-"),
                    v.detail
                );
            }
            // Inconclusive keys are not proven, as in `run`'s verdict.
            Ok(
                if r.violations.is_empty() && r.inconclusive_keys.is_empty() {
                    std::process::ExitCode::SUCCESS
                } else {
                    std::process::ExitCode::from(1)
                },
            )
        }
        Cmd::Worker(args) => {
            run_worker(args.into()).await?;
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}
