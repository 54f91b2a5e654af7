//! Seeded fault schedules. Pure: the same seed gives the same faults, the
//! same targets (by role: "the leader", "a random master") and durations.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    /// The fixed CI mix (10 leader kills, 2 pauses, 2 leader partitions, a paused store ...).
    Ci,
    /// Weighted random faults until --duration is up.
    Soak,
    /// Only leader kills, several of them: the short run for masters that
    /// acknowledge before the commit or forget leases (the tests of
    /// --unsafe-ack-before-commit and --unsafe-forget-leases), and a quick
    /// check of a deployment.
    LeaderKills,
    /// Only stalled writers across failovers, several of them (the test of
    /// --unsafe-adopt-foreign-reservations).
    StalledWriters,
    /// Only store restarts with the disk tier, several of them (the test of
    /// --unsafe-forget-disk-on-restart).
    DiskRestarts,
    /// Only late writes after revokes, several of them (the test of
    /// --unsafe-reuse-revoked-ranges).
    LateWrites,
    /// Only late writes across a step of the leader's wall clock, several of
    /// them (the test of --unsafe-wall-clock; processes mode).
    ClockSteps,
    /// Only late requests to a store whose clock is an hour behind (the
    /// test of the stores' --unsafe-wall-clock; processes mode).
    StoreSkews,
    /// Only rolling restarts until --duration is up (a reproducer for
    /// leaders that start with a trailing state machine).
    RollingRestarts,
    /// Only degraded periods (every master paused) with a worker whose
    /// client keeps a descriptor cache and goes degraded.
    DegradedPeriods,
    /// Only failing disks: the second store's disk answers EIO while the
    /// leader demotes (processes mode, FUSE).
    FailingDisks,
}

impl ScheduleKind {
    /// Its name on the command line and in run directories.
    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::Ci => "ci",
            ScheduleKind::Soak => "soak",
            ScheduleKind::LeaderKills => "leader-kills",
            ScheduleKind::StalledWriters => "stalled-writers",
            ScheduleKind::DiskRestarts => "disk-restarts",
            ScheduleKind::LateWrites => "late-writes",
            ScheduleKind::ClockSteps => "clock-steps",
            ScheduleKind::StoreSkews => "store-skews",
            ScheduleKind::RollingRestarts => "rolling-restarts",
            ScheduleKind::DegradedPeriods => "degraded-periods",
            ScheduleKind::FailingDisks => "failing-disks",
        }
    }

    /// Whether a run of it adds a `cache_and_degrade` worker by default.
    pub fn runs_cache_and_degrade_worker(self) -> bool {
        matches!(self, ScheduleKind::Soak | ScheduleKind::DegradedPeriods)
    }

    /// Whether it draws faults until `--duration` is up (the others have a
    /// fixed length).
    pub fn runs_until_duration(self) -> bool {
        matches!(self, ScheduleKind::Soak | ScheduleKind::RollingRestarts)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGKILL the leader, restart it after `hold`.
    KillLeader,
    /// SIGKILL a master chosen at random (leader or not).
    KillRandomMaster,
    /// SIGSTOP a master (the leader every other time) for longer than the
    /// election timeout, then SIGCONT.
    PauseMaster,
    /// Cut the leader off the network (a 1|2 split), heal after `hold`.
    PartitionLeader,
    /// Cut a follower off (the other 1|2 split).
    PartitionFollower,
    /// SIGKILL the second store (its replicas are lost), restart it empty.
    KillStore,
    /// SIGKILL one member of the 3-member etcd cluster, restart it.
    KillEtcdMember,
    /// Restart every etcd member, master and the second store, one by one.
    RollingRestart,
    /// Turn the workers to a few hot keys (puts, slow reads, removes with and
    /// without force, all of the same keys), then SIGKILL the leader while
    /// those are in flight: the window where a retried remove and a new
    /// leader's missing lease memory once lost acknowledged writes.
    KillLeaderAmidRemoves,
    /// Propose the largest batches a master accepts (16,384 keys, 1 MiB of
    /// keys) for `hold`: start, commit and remove each. Every one is a log
    /// entry of over 1 MiB that followers must receive.
    BigBatch,
    /// Hold a few thousand idle and half-written connections to the
    /// leader's gRPC and HTTP ports and to every store's data port for
    /// `hold`, then close them.
    ConnectionFlood,
    /// A client of the chaos process has the leader place a few puts of the
    /// workers' hot size (without a commit, inside the leader's
    /// reservation) and stalls; the leader is SIGKILLed (restarted after
    /// `hold`); the workers put hot values on the new leader for a while;
    /// then the stalled writer writes its bytes and sends its PutEnds. A new
    /// leader that handed out the stalled ranges lets those late bytes
    /// overwrite acknowledged objects (see [`crate::stall`]).
    StalledWriterAcrossFailover,
    /// Find acknowledged objects the leader lists on the second store's disk
    /// segment and read them; SIGKILL that store, restart it after `hold`
    /// on the same disk directory, wait until its disk segment is mounted
    /// again, and read them once more: each must hold the same bytes (see
    /// [`crate::disk`]). Its memory objects are lost, as in [`KillStore`].
    ///
    /// [`KillStore`]: FaultKind::KillStore
    RestartStoreWithDisk,
    /// SIGKILL a master (the leader every other time) and leave random bytes
    /// right past the last synced batch of its Raft log, as a crash in the
    /// middle of a write leaves them; restart it after `hold`. It must drop
    /// them and keep every synced entry (see `crescent_raft::journal`).
    /// Without access to the masters' data dirs (containers) it is a kill.
    TearMasterLog,
    /// A client of the chaos process has the leader place a few puts of
    /// the workers' hot size, sends each replica's first half, revokes
    /// the puts, lets the workers and a few victims put that size for a
    /// while, then delivers the second halves under the still-valid grants.
    /// A leader that placed the revoked ranges again lets those late bytes
    /// overwrite acknowledged objects (see [`crate::stall`]).
    LateWriteAfterRevoke,
    /// [`LateWriteAfterRevoke`], with the leader's wall clock stepped an
    /// hour forward from the revokes until the late halves are delivered
    /// (processes mode with libfaketime; elsewhere not stepped). A master
    /// that fenced ranges on its wall clock frees them at once.
    ///
    /// [`LateWriteAfterRevoke`]: FaultKind::LateWriteAfterRevoke
    LateWriteAcrossClockStep,
    /// SIGSTOP the second store for 6-10 s while the workers put values
    /// of one size, then SIGCONT. Writes to it time out and go elsewhere;
    /// their bytes, queued in its kernel, land when it resumes, in ranges
    /// that must still be fenced.
    PauseStore,
    /// Drop every packet to the second store's data ports for 6-10 s while
    /// the workers put values of one size, then let them through (iptables,
    /// processes mode; elsewhere nothing happens). Writes to it time out
    /// and go elsewhere; the clients' kernels retransmit what they had sent
    /// when the cut heals, so those bytes land late, in ranges that must
    /// still be fenced.
    PartitionStore,
    /// The second store restarted with its wall clock an hour behind; a
    /// client of the chaos process has the leader place a few puts and
    /// holds each replica's whole write request (as a partition holds a
    /// request that TCP delivers when it heals), revokes the puts, waits
    /// until their ranges are past the write fence and victims of the same
    /// size are put, then delivers the held requests under their expired
    /// grants; the store restarts with a true clock. A store that judged
    /// grants by a clock an hour behind would write them over acknowledged
    /// objects; it must refuse every grant while its clock is that far off
    /// (see [`crate::stall`]). Without a settable clock (containers) it is
    /// not run.
    LateRequestToSkewedStore,
    /// A fourth master (a new id each time) is started, added to the
    /// membership as a learner and then a voter while the workers run,
    /// kept for `hold`, then removed and stopped: two joint-consensus
    /// changes under load. Processes mode only; elsewhere nothing happens.
    AddAndRemoveMaster,
    /// A degraded period: every master SIGSTOPped for `hold` (longer than
    /// a client's `degrade_after` and the masters' etcd lease), then
    /// resumed. No master answers: a `cache_and_degrade` worker's client
    /// turns degraded (puts kept in its memory, reads from there and from
    /// descriptors under lease) and publishes what it kept once a master
    /// answers again; the plain workers' operations time out.
    PauseAllMasters,
    /// The second store's disk (a FUSE directory in processes mode)
    /// answers EIO to every read, write, sync and allocation while the
    /// leader demotes a disk check's probes and fillers, for at least
    /// `hold`; the probes are read while it fails. A leader must keep an
    /// object whose copy the disk failed and move it elsewhere, not evict
    /// it (see [`crate::disk::failing_disk`]). Where the disk cannot be
    /// made to fail (containers), nothing happens.
    FailingDisk,
}

impl FaultKind {
    pub const ALL: [FaultKind; 22] = [
        FaultKind::KillLeader,
        FaultKind::KillRandomMaster,
        FaultKind::PauseMaster,
        FaultKind::PartitionLeader,
        FaultKind::PartitionFollower,
        FaultKind::KillStore,
        FaultKind::KillEtcdMember,
        FaultKind::RollingRestart,
        FaultKind::KillLeaderAmidRemoves,
        FaultKind::BigBatch,
        FaultKind::ConnectionFlood,
        FaultKind::StalledWriterAcrossFailover,
        FaultKind::RestartStoreWithDisk,
        FaultKind::TearMasterLog,
        FaultKind::LateWriteAfterRevoke,
        FaultKind::LateWriteAcrossClockStep,
        FaultKind::PauseStore,
        FaultKind::PartitionStore,
        FaultKind::LateRequestToSkewedStore,
        FaultKind::AddAndRemoveMaster,
        FaultKind::PauseAllMasters,
        FaultKind::FailingDisk,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "kill leader",
            FaultKind::KillRandomMaster => "kill random master",
            FaultKind::PauseMaster => "pause master",
            FaultKind::PartitionLeader => "partition leader",
            FaultKind::PartitionFollower => "partition follower",
            FaultKind::KillStore => "kill store",
            FaultKind::KillEtcdMember => "kill etcd member",
            FaultKind::RollingRestart => "rolling restart",
            FaultKind::KillLeaderAmidRemoves => "kill leader amid removes",
            FaultKind::BigBatch => "big batch",
            FaultKind::ConnectionFlood => "connection flood",
            FaultKind::StalledWriterAcrossFailover => "stalled writer across failover",
            FaultKind::RestartStoreWithDisk => "restart store with disk",
            FaultKind::TearMasterLog => "kill master, tear its log",
            FaultKind::LateWriteAfterRevoke => "late write after revoke",
            FaultKind::LateWriteAcrossClockStep => "late write across clock step",
            FaultKind::PauseStore => "pause store",
            FaultKind::PartitionStore => "partition store",
            FaultKind::LateRequestToSkewedStore => "late request to a skewed store",
            FaultKind::AddAndRemoveMaster => "add and remove a master",
            FaultKind::PauseAllMasters => "pause all masters (degraded period)",
            FaultKind::FailingDisk => "failing disk",
        }
    }

    pub fn needs_network_control(self) -> bool {
        matches!(
            self,
            FaultKind::PartitionLeader | FaultKind::PartitionFollower
        )
    }
}

/// One planned fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fault {
    pub kind: FaultKind,
    /// How long the fault lasts before it is healed (restart, SIGCONT, reconnect).
    #[serde(with = "millis")]
    pub hold: Duration,
    /// Quiet time after the cluster has recovered, before the next fault.
    #[serde(with = "millis")]
    pub settle: Duration,
    /// Picks among candidates ("a random master", "which etcd member").
    pub pick: u64,
}

mod millis {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
}

fn fault(rng: &mut StdRng, kind: FaultKind) -> Fault {
    let hold_ms = match kind {
        // Longer than the 300 ms maximum election timeout, several times over.
        FaultKind::PauseMaster => rng.random_range(1_000..2_500),
        FaultKind::PauseStore | FaultKind::PartitionStore => rng.random_range(6_000..10_000),
        FaultKind::PartitionLeader | FaultKind::PartitionFollower => rng.random_range(2_000..5_000),
        FaultKind::RollingRestart | FaultKind::LateRequestToSkewedStore => 0,
        FaultKind::AddAndRemoveMaster => rng.random_range(2_000..5_000),
        FaultKind::PauseAllMasters => rng.random_range(8_000..12_000),
        FaultKind::FailingDisk => rng.random_range(4_000..8_000),
        FaultKind::BigBatch | FaultKind::ConnectionFlood => rng.random_range(2_000..5_000),
        _ => rng.random_range(500..2_500),
    };
    Fault {
        kind,
        hold: Duration::from_millis(hold_ms),
        settle: Duration::from_millis(rng.random_range(300..1_200)),
        pick: rng.random(),
    }
}

/// The short CI schedule: 10 leader kills, 2 random-master kills, 2 pauses,
/// 2 leader partitions and 1 follower partition (when the network can be
/// controlled), a store kill, an etcd member kill, a rolling restart, 2
/// leader kills amid removes, a big batch, a connection flood, a stalled
/// writer across a failover, a store restart with its disk tier, a
/// master killed with a torn write left in its log, a paused store, in a
/// seeded order, then a late write after a revoke, one across a step of
/// the leader's clock, a store cut off, a master added and removed, a
/// late request to a store whose clock is an hour behind, a degraded
/// period and a failing disk.
pub fn ci_schedule(seed: u64, network_control: bool) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut kinds = Vec::new();
    kinds.extend([FaultKind::KillLeader; 10]);
    kinds.extend([FaultKind::KillRandomMaster; 2]);
    kinds.extend([FaultKind::PauseMaster; 2]);
    if network_control {
        kinds.extend([FaultKind::PartitionLeader; 2]);
        kinds.push(FaultKind::PartitionFollower);
    }
    kinds.push(FaultKind::KillStore);
    kinds.push(FaultKind::KillEtcdMember);
    kinds.push(FaultKind::RollingRestart);
    kinds.extend([FaultKind::KillLeaderAmidRemoves; 2]);
    kinds.push(FaultKind::BigBatch);
    kinds.push(FaultKind::ConnectionFlood);
    kinds.push(FaultKind::StalledWriterAcrossFailover);
    kinds.push(FaultKind::RestartStoreWithDisk);
    kinds.push(FaultKind::TearMasterLog);
    kinds.push(FaultKind::PauseStore);
    kinds.shuffle(&mut rng);
    // Last, after the shuffle: a seed's other faults keep their order and
    // parameters.
    kinds.push(FaultKind::LateWriteAfterRevoke);
    kinds.push(FaultKind::LateWriteAcrossClockStep);
    kinds.push(FaultKind::PartitionStore);
    kinds.push(FaultKind::AddAndRemoveMaster);
    kinds.push(FaultKind::LateRequestToSkewedStore);
    kinds.push(FaultKind::PauseAllMasters);
    kinds.push(FaultKind::FailingDisk);
    kinds.into_iter().map(|k| fault(&mut rng, k)).collect()
}

/// `n` faults of one kind, with seeded parameters: the schedules that
/// each test one test-only switch.
fn repeated(seed: u64, kind: FaultKind, n: usize) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| fault(&mut rng, kind)).collect()
}

/// How many faults [`leader_kill_schedule`] has.
pub const LEADER_KILL_FAULTS: usize = 6;

/// Leader kills, [`LEADER_KILL_FAULTS`] of them, plain and amid removes
/// in turn: each is a chance for a write acknowledged before its commit to
/// be lost, and each new leader must honour its predecessor's leases while
/// forced removes run.
pub fn leader_kill_schedule(seed: u64) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..LEADER_KILL_FAULTS)
        .map(|i| {
            let kind = if i % 2 == 0 {
                FaultKind::KillLeader
            } else {
                FaultKind::KillLeaderAmidRemoves
            };
            fault(&mut rng, kind)
        })
        .collect()
}

/// How many faults [`stalled_writer_schedule`] has.
pub const STALLED_WRITER_FAULTS: usize = 8;

/// Only stalled writers across failovers, [`STALLED_WRITER_FAULTS`] of
/// them: each is a chance for a leader that hands out an earlier term's
/// reserved ranges to be caught (the test of
/// `--unsafe-adopt-foreign-reservations`).
pub fn stalled_writer_schedule(seed: u64) -> Vec<Fault> {
    repeated(
        seed,
        FaultKind::StalledWriterAcrossFailover,
        STALLED_WRITER_FAULTS,
    )
}

/// How many faults [`late_write_schedule`] has.
pub const LATE_WRITE_FAULTS: usize = 6;

/// Only late writes after revokes, [`LATE_WRITE_FAULTS`] of them: each is a
/// chance for a leader that places a revoked range again while its grants
/// are valid to be caught (the test of `--unsafe-reuse-revoked-ranges`).
pub fn late_write_schedule(seed: u64) -> Vec<Fault> {
    repeated(seed, FaultKind::LateWriteAfterRevoke, LATE_WRITE_FAULTS)
}

/// How many faults [`clock_step_schedule`] has.
pub const CLOCK_STEP_FAULTS: usize = 6;

/// Only late writes across steps of the leader's wall clock,
/// [`CLOCK_STEP_FAULTS`] of them (the test of `--unsafe-wall-clock`).
pub fn clock_step_schedule(seed: u64) -> Vec<Fault> {
    repeated(seed, FaultKind::LateWriteAcrossClockStep, CLOCK_STEP_FAULTS)
}

/// How many faults [`store_skew_schedule`] has.
pub const STORE_SKEW_FAULTS: usize = 2;

/// Only late requests to a store whose clock is an hour behind,
/// [`STORE_SKEW_FAULTS`] of them (the test of the stores'
/// `--unsafe-wall-clock`, which skips the comparison with the leader's).
pub fn store_skew_schedule(seed: u64) -> Vec<Fault> {
    repeated(seed, FaultKind::LateRequestToSkewedStore, STORE_SKEW_FAULTS)
}

/// How many faults [`disk_restart_schedule`] has.
pub const DISK_RESTART_FAULTS: usize = 4;

/// Only store restarts with the disk tier, [`DISK_RESTART_FAULTS`] of them:
/// each checks the disk objects of the restarted store (the test of the
/// stores' `--unsafe-forget-disk-on-restart`).
pub fn disk_restart_schedule(seed: u64) -> Vec<Fault> {
    repeated(seed, FaultKind::RestartStoreWithDisk, DISK_RESTART_FAULTS)
}

/// How many faults [`degraded_period_schedule`] has.
pub const DEGRADED_PERIOD_FAULTS: usize = 3;

/// Only degraded periods, [`DEGRADED_PERIOD_FAULTS`] of them: each turns
/// a `cache_and_degrade` worker's client degraded and back.
pub fn degraded_period_schedule(seed: u64) -> Vec<Fault> {
    repeated(seed, FaultKind::PauseAllMasters, DEGRADED_PERIOD_FAULTS)
}

/// How many faults [`failing_disk_schedule`] has.
pub const FAILING_DISK_FAULTS: usize = 2;

/// Only failing disks, [`FAILING_DISK_FAULTS`] of them: each has the
/// leader demote to a disk answering EIO.
pub fn failing_disk_schedule(seed: u64) -> Vec<Fault> {
    repeated(seed, FaultKind::FailingDisk, FAILING_DISK_FAULTS)
}

/// Endless rolling restarts (the runner stops drawing when its time is up):
/// every master SIGKILLed in turn, the leader last, then a store. Each one
/// elects a leader that has just restarted, the window in which a leader's
/// applied state may trail what its log holds.
pub fn rolling_restart_schedule(seed: u64) -> impl Iterator<Item = Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    std::iter::from_fn(move || Some(fault(&mut rng, FaultKind::RollingRestart)))
}

/// An endless soak schedule: faults drawn with weights (leader faults most
/// often); the runner stops drawing when its time is up.
pub fn soak_schedule(seed: u64, network_control: bool) -> impl Iterator<Item = Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let weighted: Vec<(FaultKind, u32)> = vec![
        (FaultKind::KillLeader, 8),
        (FaultKind::KillRandomMaster, 3),
        (FaultKind::PauseMaster, 3),
        (FaultKind::PartitionLeader, 3),
        (FaultKind::PartitionFollower, 1),
        (FaultKind::KillStore, 1),
        (FaultKind::KillEtcdMember, 1),
        (FaultKind::RollingRestart, 1),
        (FaultKind::KillLeaderAmidRemoves, 3),
        (FaultKind::BigBatch, 1),
        (FaultKind::ConnectionFlood, 1),
        (FaultKind::StalledWriterAcrossFailover, 2),
        // Twice a plain store kill's weight: the only fault that checks the
        // disk tier's objects across a restart.
        (FaultKind::RestartStoreWithDisk, 2),
        (FaultKind::TearMasterLog, 2),
        (FaultKind::LateWriteAfterRevoke, 2),
        (FaultKind::PauseStore, 2),
        (FaultKind::LateWriteAcrossClockStep, 2),
        (FaultKind::PartitionStore, 2),
        (FaultKind::LateRequestToSkewedStore, 1),
        (FaultKind::AddAndRemoveMaster, 2),
        (FaultKind::PauseAllMasters, 2),
        (FaultKind::FailingDisk, 1),
    ]
    .into_iter()
    .filter(|(k, _)| network_control || !k.needs_network_control())
    .collect();
    let total: u32 = weighted.iter().map(|(_, w)| w).sum();
    std::iter::from_fn(move || {
        let mut x = rng.random_range(0..total);
        let kind = weighted
            .iter()
            .find(|(_, w)| {
                if x < *w {
                    true
                } else {
                    x -= w;
                    false
                }
            })
            .map(|(k, _)| *k)
            .unwrap_or(FaultKind::KillLeader);
        Some(fault(&mut rng, kind))
    })
}

/// What happened to one injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub kind: FaultKind,
    pub target: String,
    pub start_us: u64,
    pub healed_us: u64,
    /// When a leader was known again with every master answering; None if
    /// the cluster did not recover within the limit.
    pub recovered_us: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ci_schedule_is_reproducible_and_complete() {
        let a = ci_schedule(7, true);
        assert_eq!(a, ci_schedule(7, true));
        assert_ne!(a, ci_schedule(8, true));
        let count = |k| a.iter().filter(|f| f.kind == k).count();
        assert_eq!(count(FaultKind::KillLeader), 10);
        assert_eq!(count(FaultKind::PauseMaster), 2);
        assert_eq!(count(FaultKind::PartitionLeader), 2);
        assert_eq!(count(FaultKind::KillLeaderAmidRemoves), 2);
        assert_eq!(count(FaultKind::BigBatch), 1);
        assert_eq!(count(FaultKind::ConnectionFlood), 1);
        assert_eq!(count(FaultKind::StalledWriterAcrossFailover), 1);
        assert_eq!(count(FaultKind::RestartStoreWithDisk), 1);
        assert_eq!(count(FaultKind::TearMasterLog), 1);
        assert_eq!(count(FaultKind::LateWriteAfterRevoke), 1);
        assert_eq!(count(FaultKind::PauseStore), 1);
        assert_eq!(count(FaultKind::LateWriteAcrossClockStep), 1);
        assert_eq!(count(FaultKind::LateRequestToSkewedStore), 1);
        assert_eq!(count(FaultKind::AddAndRemoveMaster), 1);
        assert_eq!(count(FaultKind::PartitionStore), 1);
        assert_eq!(count(FaultKind::PauseAllMasters), 1);
        assert_eq!(count(FaultKind::FailingDisk), 1);
        assert_eq!(a.len(), 35);
        // Kinds added after the shuffle come last, so a seed's shuffled
        // part stays as it was.
        let tail: Vec<FaultKind> = a[a.len() - 7..].iter().map(|f| f.kind).collect();
        assert_eq!(
            tail,
            [
                FaultKind::LateWriteAfterRevoke,
                FaultKind::LateWriteAcrossClockStep,
                FaultKind::PartitionStore,
                FaultKind::AddAndRemoveMaster,
                FaultKind::LateRequestToSkewedStore,
                FaultKind::PauseAllMasters,
                FaultKind::FailingDisk
            ]
        );
        // Every kind is in the CI schedule.
        for kind in FaultKind::ALL {
            assert!(count(kind) >= 1, "{kind:?} is missing from the CI schedule");
        }
        assert!(a
            .iter()
            .filter(|f| f.kind == FaultKind::PauseMaster)
            .all(|f| f.hold > Duration::from_millis(300)));
        let without = ci_schedule(7, false);
        assert!(without.iter().all(|f| !f.kind.needs_network_control()));
    }

    #[test]
    fn the_leader_kill_schedule_alternates_plain_kills_and_kills_amid_removes() {
        let s = leader_kill_schedule(3);
        assert_eq!(s.len(), LEADER_KILL_FAULTS);
        for (i, f) in s.iter().enumerate() {
            let want = if i % 2 == 0 {
                FaultKind::KillLeader
            } else {
                FaultKind::KillLeaderAmidRemoves
            };
            assert_eq!(f.kind, want, "fault {i}");
        }
        assert_eq!(s, leader_kill_schedule(3), "seeded");
    }

    #[test]
    fn each_one_kind_schedule_repeats_its_fault() {
        type Schedule = fn(u64) -> Vec<Fault>;
        let schedules: [(Schedule, usize, FaultKind); 7] = [
            (
                stalled_writer_schedule,
                STALLED_WRITER_FAULTS,
                FaultKind::StalledWriterAcrossFailover,
            ),
            (
                clock_step_schedule,
                CLOCK_STEP_FAULTS,
                FaultKind::LateWriteAcrossClockStep,
            ),
            (
                late_write_schedule,
                LATE_WRITE_FAULTS,
                FaultKind::LateWriteAfterRevoke,
            ),
            (
                disk_restart_schedule,
                DISK_RESTART_FAULTS,
                FaultKind::RestartStoreWithDisk,
            ),
            (
                failing_disk_schedule,
                FAILING_DISK_FAULTS,
                FaultKind::FailingDisk,
            ),
            (
                degraded_period_schedule,
                DEGRADED_PERIOD_FAULTS,
                FaultKind::PauseAllMasters,
            ),
            (
                store_skew_schedule,
                STORE_SKEW_FAULTS,
                FaultKind::LateRequestToSkewedStore,
            ),
        ];
        for (schedule, n, kind) in schedules {
            let a = schedule(5);
            assert_eq!(a, schedule(5), "{kind:?}");
            assert_eq!(a.len(), n, "{kind:?}");
            assert!(a.iter().all(|f| f.kind == kind), "{kind:?}");
        }
    }

    #[test]
    fn the_rolling_restart_schedule_repeats_that_fault() {
        let a: Vec<Fault> = rolling_restart_schedule(5).take(6).collect();
        assert_eq!(a, rolling_restart_schedule(5).take(6).collect::<Vec<_>>());
        assert!(a.iter().all(|f| f.kind == FaultKind::RollingRestart));
    }

    #[test]
    fn the_soak_schedule_respects_network_control() {
        let faults: Vec<Fault> = soak_schedule(3, false).take(200).collect();
        assert!(faults.iter().all(|f| !f.kind.needs_network_control()));
        let with: Vec<Fault> = soak_schedule(3, true).take(200).collect();
        assert!(with.iter().any(|f| f.kind.needs_network_control()));
    }
}
