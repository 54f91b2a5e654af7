//! The run's summary: a table per fault kind (faults, the longest window
//! without a successful write, ops ok/failed/unknown) and the violations,
//! printed and written as JSON.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::checker::{outcome_counts, CheckResult, ViolationKind};
use crate::deploy::{Mode, WorkerExit};
use crate::history::{Op, OpKind, Outcome, ReadPromise};
use crate::schedule::{FaultKind, FaultRecord, ScheduleKind};

pub struct Inputs<'a> {
    pub mode: Mode,
    pub mode_reason: String,
    pub seed: u64,
    pub schedule: ScheduleKind,
    pub out_dir: std::path::PathBuf,
    pub started_us: u64,
    pub ended_us: u64,
    /// How many workers ran; a worker's processes are numbered 100·w + task.
    pub workers: u32,
    pub workload_started_us: u64,
    pub workload_stopped_us: u64,
    pub worker_exits: Vec<WorkerExit>,
    pub faults: Vec<FaultRecord>,
    pub ops: &'a [Op],
    pub check: CheckResult,
    pub allow_inconclusive: bool,
    pub evicted_keys: Option<u64>,
    /// Objects with a disk replica at the end (the leader's
    /// `master_disk_key_count`): shows that demotion ran.
    pub disk_keys: Option<u64>,
    /// Why the fault schedule stopped before its end (a fault the cluster
    /// did not recover from): the run fails, and what ran is still checked.
    pub stopped_early: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct KindSummary {
    pub kind: FaultKind,
    pub faults: usize,
    pub unrecovered: usize,
    /// Longest stretch without a successful write, per fault (ms).
    pub no_write_ms_p50: u64,
    pub no_write_ms_p99: u64,
    pub no_write_ms_max: u64,
    pub ops_ok: u64,
    pub ops_failed: u64,
    pub ops_unknown: u64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: Mode,
    pub mode_reason: String,
    pub seed: u64,
    pub schedule: ScheduleKind,
    /// This run's own directory (histories, logs, this report).
    pub out_dir: std::path::PathBuf,
    pub duration_s: f64,
    pub ops_total: usize,
    pub ops_ok: u64,
    pub ops_failed: u64,
    pub ops_unknown: u64,
    pub acknowledged_writes: u64,
    pub keys_checked: usize,
    /// Gets that found a value under a weaker promise than linearizability
    /// (a `cache_and_degrade` worker's), by promise.
    pub relaxed_reads: RelaxedReads,
    pub by_kind: Vec<KindSummary>,
    pub faults: Vec<FaultRecord>,
    pub violations: Vec<crate::checker::Violation>,
    pub violation_counts: BTreeMap<String, usize>,
    pub inconclusive_keys: Vec<String>,
    pub evicted_keys: Option<u64>,
    /// Objects with a disk replica when the workload stopped.
    pub disk_keys: Option<u64>,
    /// Disk objects read before and after a restart of their store (0: the
    /// run proved nothing about the disk tier across restarts).
    pub disk_objects_checked: usize,
    /// ... of which a remove of the key may have run in between (not judged).
    pub disk_objects_removed_meanwhile: usize,
    /// What the masters' samples showed of leadership.
    pub leadership: crate::checker::LeadershipSeen,
    pub worker_exits: Vec<WorkerExit>,
    /// Why the run failed, one reason a line; empty when it passed.
    pub failure_reasons: Vec<String>,
    pub passed: bool,
}

/// A worker must record at least this many operations per second of workload.
const MIN_OPS_PER_WORKER_PER_S: u64 = 1;
/// ... and keep recording until this close to the stop.
const MAX_WORKER_SILENCE_AT_END_US: u64 = 30_000_000;

/// Workers that recorded nothing, far too little, or stopped recording long
/// before the run asked them to stop; and workers that exited badly.
fn workload_problems(i: &Inputs<'_>) -> Vec<String> {
    let span_us = i.workload_stopped_us.saturating_sub(i.workload_started_us);
    let span_s = span_us / 1_000_000;
    let mut per_worker: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for op in i.ops {
        let e = per_worker.entry(op.process / 100).or_default();
        e.0 += 1;
        e.1 = e.1.max(op.invoke_us);
    }
    let mut problems = Vec::new();
    for w in 0..i.workers {
        let (count, last_us) = per_worker.get(&w).copied().unwrap_or_default();
        if count == 0 {
            problems.push(format!("worker {w} recorded no operation"));
            continue;
        }
        if count < span_s * MIN_OPS_PER_WORKER_PER_S {
            problems.push(format!(
                "worker {w} recorded only {count} operations in {span_s} s of workload"
            ));
        }
        let silent_us = i.workload_stopped_us.saturating_sub(last_us);
        if silent_us > MAX_WORKER_SILENCE_AT_END_US {
            problems.push(format!(
                "worker {w} recorded nothing in the last {} s before the stop",
                silent_us / 1_000_000
            ));
        }
    }
    for x in i.worker_exits.iter().filter(|x| x.ended_badly()) {
        let status = x
            .code
            .map(|c| format!("status {c}"))
            .unwrap_or_else(|| "no status (killed)".into());
        let when = if x.exited_early {
            "before it was asked to stop"
        } else {
            "when stopped"
        };
        problems.push(format!("worker {} exited {when} with {status}", x.worker));
    }
    problems
}

fn is_ok_write(op: &Op) -> bool {
    matches!(op.kind, OpKind::Put { .. } | OpKind::Remove { .. }) && op.outcome == Outcome::Ok
}

/// The longest gap between successful write completions inside [from, to),
/// counting from `from`.
fn longest_no_write(ok_writes: &[u64], from: u64, to: u64) -> u64 {
    let mut last = from;
    let mut longest = 0;
    for &t in ok_writes.iter().filter(|t| **t >= from && **t < to) {
        longest = longest.max(t - last);
        last = t;
    }
    longest.max(to.saturating_sub(last))
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

pub fn build(i: Inputs<'_>) -> Report {
    let mut ok_writes: Vec<u64> = i
        .ops
        .iter()
        .filter(|o| is_ok_write(o))
        .map(|o| o.complete_us)
        .collect();
    ok_writes.sort_unstable();
    let mut by_kind: BTreeMap<FaultKind, (Vec<u64>, usize, usize, [u64; 3])> = BTreeMap::new();
    for (n, f) in i.faults.iter().enumerate() {
        // A fault's window ends at the next fault or when the workload was
        // stopped, whichever comes first (the last fault's window used to run
        // on through teardown and checking, 13 s "without writes" in a soak).
        let end = i
            .faults
            .get(n + 1)
            .map_or(i.workload_stopped_us, |next| next.start_us)
            .min(i.workload_stopped_us);
        let gap = longest_no_write(&ok_writes, f.start_us, end) / 1000;
        let e = by_kind.entry(f.kind).or_default();
        e.0.push(gap);
        e.1 += 1;
        if f.recovered_us.is_none() {
            e.2 += 1;
        }
        let c = outcome_counts(
            i.ops
                .iter()
                .filter(|o| o.invoke_us >= f.start_us && o.invoke_us < end),
        );
        for (slot, name) in ["ok", "failed", "unknown"].iter().enumerate() {
            e.3[slot] += c.get(name).copied().unwrap_or(0);
        }
    }
    let by_kind: Vec<KindSummary> = by_kind
        .into_iter()
        .map(|(kind, (mut gaps, faults, unrecovered, c))| {
            gaps.sort_unstable();
            KindSummary {
                kind,
                faults,
                unrecovered,
                no_write_ms_p50: percentile(&gaps, 0.5),
                no_write_ms_p99: percentile(&gaps, 0.99),
                no_write_ms_max: gaps.last().copied().unwrap_or(0),
                ops_ok: c[0],
                ops_failed: c[1],
                ops_unknown: c[2],
            }
        })
        .collect();
    let totals = outcome_counts(i.ops);
    let relaxed_reads = RelaxedReads::count(i.ops);
    let mut violation_counts = BTreeMap::new();
    for v in &i.check.violations {
        *violation_counts
            .entry(
                serde_json::to_value(v.kind)
                    .ok()
                    .and_then(|x| x.as_str().map(str::to_string))
                    .unwrap_or_default(),
            )
            .or_insert(0) += 1;
    }
    let unrecovered = i.faults.iter().filter(|f| f.recovered_us.is_none()).count();
    let acknowledged_writes = i
        .ops
        .iter()
        .filter(|o| matches!(o.kind, OpKind::Put { .. }) && o.outcome == Outcome::Ok)
        .count() as u64;
    let mut failure_reasons = workload_problems(&i);
    if !i.check.violations.is_empty() {
        let counts: Vec<String> = violation_counts
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        failure_reasons.insert(
            0,
            format!(
                "{} violations ({})",
                i.check.violations.len(),
                counts.join(", ")
            ),
        );
    }
    if unrecovered > 0 {
        failure_reasons.push(format!(
            "{unrecovered} faults after which the cluster did not recover"
        ));
    }
    if !i.check.inconclusive_keys.is_empty() && !i.allow_inconclusive {
        failure_reasons.push(format!(
            "{} keys inconclusive (the linearizability search ran out of budget; \
             --allow-inconclusive accepts that)",
            i.check.inconclusive_keys.len()
        ));
    }
    if acknowledged_writes == 0 {
        failure_reasons.push("no put was acknowledged".into());
    }
    if let Some(why) = &i.stopped_early {
        failure_reasons.insert(0, format!("the run stopped early: {why}"));
    }
    match i.evicted_keys {
        // The checker takes a missing key as lost; only eviction excuses it.
        Some(0) => {}
        Some(n) => failure_reasons.push(format!(
            "{n} keys were evicted, so missing keys prove nothing (the pool must not fill)"
        )),
        None => failure_reasons.push(
            "the leader's eviction count could not be read, so missing keys prove nothing".into(),
        ),
    }
    let passed = failure_reasons.is_empty();
    Report {
        mode: i.mode,
        mode_reason: i.mode_reason,
        seed: i.seed,
        schedule: i.schedule,
        out_dir: i.out_dir.clone(),
        duration_s: (i.ended_us.saturating_sub(i.started_us)) as f64 / 1e6,
        ops_total: i.ops.len(),
        ops_ok: totals.get("ok").copied().unwrap_or(0),
        ops_failed: totals.get("failed").copied().unwrap_or(0),
        ops_unknown: totals.get("unknown").copied().unwrap_or(0),
        acknowledged_writes,
        keys_checked: i.check.keys_checked,
        relaxed_reads,
        disk_objects_checked: i.check.disk_objects_checked,
        disk_objects_removed_meanwhile: i.check.disk_objects_removed_meanwhile,
        leadership: i.check.leadership,
        by_kind,
        faults: i.faults,
        violations: i.check.violations,
        violation_counts,
        inconclusive_keys: i.check.inconclusive_keys,
        evicted_keys: i.evicted_keys,
        disk_keys: i.disk_keys,
        worker_exits: i.worker_exits,
        failure_reasons,
        passed,
    }
}

/// Reads judged by a weaker promise (see [`ReadPromise`]).
#[derive(Debug, Default, Serialize)]
pub struct RelaxedReads {
    /// Found a value with the descriptor cache on (at most a lease stale).
    pub stale_within_lease: usize,
    /// Found a value while the client was (or may have been) degraded.
    pub degraded: usize,
    /// Puts kept only in a degraded client's memory (recorded as unknown).
    pub local_only_puts: usize,
}

impl RelaxedReads {
    fn count(ops: &[Op]) -> Self {
        let mut r = Self::default();
        for o in ops {
            match (&o.kind, &o.outcome, o.promise) {
                (OpKind::Get, Outcome::Found { .. }, ReadPromise::Stale { .. }) => {
                    r.stale_within_lease += 1
                }
                (OpKind::Get, Outcome::Found { .. }, ReadPromise::Degraded) => r.degraded += 1,
                (OpKind::Put { .. }, Outcome::Unknown { error }, _)
                    if error == crate::workload::LOCAL_ONLY_PUT =>
                {
                    r.local_only_puts += 1
                }
                _ => {}
            }
        }
        r
    }
}

impl Report {
    /// One line: PASSED, or FAILED with every reason.
    pub fn verdict(&self) -> String {
        if self.passed {
            "PASSED".into()
        } else {
            format!("FAILED: {}", self.failure_reasons.join("; "))
        }
    }

    /// The table printed at the end of a run.
    pub fn table(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "{:<20} {:>6} {:>11} {:>11} {:>11} {:>8} {:>7} {:>8} {:>10}\n",
            "fault",
            "faults",
            "no-write50",
            "no-write99",
            "no-writeMax",
            "ops ok",
            "failed",
            "unknown",
            "violations"
        ));
        for k in &self.by_kind {
            s.push_str(&format!(
                "{:<20} {:>6} {:>9}ms {:>9}ms {:>9}ms {:>8} {:>7} {:>8} {:>10}\n",
                k.kind.name(),
                k.faults,
                k.no_write_ms_p50,
                k.no_write_ms_p99,
                k.no_write_ms_max,
                k.ops_ok,
                k.ops_failed,
                k.ops_unknown,
                "-"
            ));
        }
        s.push_str(&format!(
            "{:<20} {:>6} {:>11} {:>11} {:>11} {:>8} {:>7} {:>8} {:>10}\n",
            "total",
            self.faults.len(),
            "",
            "",
            "",
            self.ops_ok,
            self.ops_failed,
            self.ops_unknown,
            self.violations.len()
        ));
        s.push_str(&format!(
            "acknowledged puts: {}; keys checked: {}; inconclusive keys: {}; evicted keys: {}\n",
            self.acknowledged_writes,
            self.keys_checked,
            self.inconclusive_keys.len(),
            self.evicted_keys
                .map(|e| e.to_string())
                .unwrap_or_else(|| "unknown".into())
        ));
        let restarts = self
            .faults
            .iter()
            .filter(|f| f.kind == FaultKind::RestartStoreWithDisk)
            .count();
        s.push_str(&format!(
            "disk tier: {} objects on disk at the end; {} disk objects checked across {restarts} \
             store restarts ({} removed meanwhile, not judged){}\n",
            self.disk_keys
                .map(|e| e.to_string())
                .unwrap_or_else(|| "unknown".into()),
            self.disk_objects_checked,
            self.disk_objects_removed_meanwhile,
            if restarts > 0 && self.disk_objects_checked == 0 {
                " -- NONE checked: the restarts proved nothing about the disk tier"
            } else {
                ""
            }
        ));
        let periods = self
            .faults
            .iter()
            .filter(|f| f.kind == FaultKind::PauseAllMasters)
            .count();
        let r = &self.relaxed_reads;
        s.push_str(&format!(
            "relaxed reads: {} through the descriptor cache (at most a lease stale), {} in \
             degraded mode across {periods} degraded periods; {} puts kept local while degraded{}\n",
            r.stale_within_lease,
            r.degraded,
            r.local_only_puts,
            if periods > 0 && r.stale_within_lease > 0 && r.degraded == 0 {
                " -- NO degraded read: the periods proved nothing about degraded mode"
            } else {
                ""
            }
        ));
        s.push_str(&self.leadership.summary());
        s.push('\n');
        for (kind, n) in &self.violation_counts {
            s.push_str(&format!("violations of kind {kind}: {n}\n"));
        }
        for v in self.violations.iter().take(10) {
            s.push_str(&format!(
                "  {:?} {}: {}\n",
                v.kind,
                v.key.as_deref().unwrap_or("-"),
                v.detail
            ));
        }
        for x in self.worker_exits.iter().filter(|x| x.ended_badly()) {
            s.push_str(&format!(
                "worker {} ended badly (exit {:?}, early: {}); its log ends:\n{}\n",
                x.worker, x.code, x.exited_early, x.log_tail
            ));
        }
        s
    }

    pub fn has(&self, kind: ViolationKind) -> bool {
        self.violations.iter().any(|v| v.kind == kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_write_windows_count_from_the_fault() {
        let writes = [100, 200, 900, 1000];
        assert_eq!(longest_no_write(&writes, 150, 1100), 700);
        assert_eq!(longest_no_write(&writes, 0, 150), 100);
        // No write at all in the window: all of it.
        assert_eq!(longest_no_write(&writes, 1100, 5000), 3900);
    }

    const S: u64 = 1_000_000;

    fn put_ok(process: u32, at_s: u64) -> Op {
        Op {
            process,
            key: format!("k{process}-{at_s}"),
            kind: OpKind::Put { value: at_s },
            invoke_us: at_s * S,
            complete_us: at_s * S + 1000,
            outcome: Outcome::Ok,
            promise: ReadPromise::Linearizable,
        }
    }

    fn fault(kind: FaultKind, at_s: u64) -> FaultRecord {
        FaultRecord {
            kind,
            target: "master 1".into(),
            start_us: at_s * S,
            healed_us: at_s * S + S,
            recovered_us: Some(at_s * S + 2 * S),
        }
    }

    fn exit(worker: u32, code: Option<i32>, exited_early: bool) -> WorkerExit {
        WorkerExit {
            worker,
            code,
            exited_early,
            log_tail: "the end of the log".into(),
        }
    }

    /// Two workers writing once a second from 0 to 100 s; the stop at 100 s.
    fn inputs(ops: &[Op], faults: Vec<FaultRecord>, exits: Vec<WorkerExit>) -> Inputs<'_> {
        Inputs {
            mode: Mode::Processes,
            mode_reason: "test".into(),
            seed: 1,
            schedule: ScheduleKind::Ci,
            out_dir: "/tmp/x".into(),
            started_us: 0,
            // Long after the stop: teardown and checking.
            ended_us: 400 * S,
            workers: 2,
            workload_started_us: 0,
            workload_stopped_us: 100 * S,
            worker_exits: exits,
            faults,
            ops,
            check: CheckResult::default(),
            allow_inconclusive: false,
            evicted_keys: Some(0),
            disk_keys: Some(0),
            stopped_early: None,
        }
    }

    fn steady_ops() -> Vec<Op> {
        (0..100)
            .flat_map(|t| [put_ok(0, t), put_ok(101, t)])
            .collect()
    }

    #[test]
    fn a_healthy_run_passes() {
        let ops = steady_ops();
        let r = build(inputs(&ops, vec![], vec![exit(0, Some(0), false)]));
        assert!(r.passed, "{:?}", r.failure_reasons);
        assert_eq!(r.verdict(), "PASSED");
    }

    /// A run cut short by a fault the cluster did not recover from fails with
    /// that reason first, and what ran is still checked and counted.
    #[test]
    fn a_run_stopped_early_fails_with_the_reason_first() {
        let ops = steady_ops();
        let mut i = inputs(&ops, vec![fault(FaultKind::KillLeader, 50)], vec![]);
        i.stopped_early = Some("the cluster did not recover within 60 s of fault #1".into());
        let r = build(i);
        assert!(!r.passed);
        assert!(
            r.verdict()
                .starts_with("FAILED: the run stopped early: the cluster did not recover"),
            "{}",
            r.verdict()
        );
        assert_eq!(r.acknowledged_writes, 200);
    }

    /// The 13.2 s "no-write" window of the seed-777 soak was its last fault's
    /// window running on through teardown and checking.
    #[test]
    fn the_last_fault_window_ends_when_the_workload_stops() {
        let ops = steady_ops();
        let r = build(inputs(&ops, vec![fault(FaultKind::KillLeader, 98)], vec![]));
        assert_eq!(r.by_kind[0].no_write_ms_max, 1000, "{:?}", r.by_kind);
    }

    /// A run whose workers recorded nothing (e.g. a stale stop file ended
    /// them) must say why, not just FAILED with 0 operations.
    #[test]
    fn workers_that_recorded_nothing_fail_the_run_with_that_reason() {
        let r = build(inputs(&[], vec![], vec![]));
        assert!(!r.passed);
        let v = r.verdict();
        assert!(
            v.starts_with("FAILED: worker 0 recorded no operation"),
            "{v}"
        );
        assert!(v.contains("worker 1 recorded no operation"), "{v}");
        assert!(v.contains("no put was acknowledged"), "{v}");
    }

    #[test]
    fn a_worker_that_stops_early_or_exits_badly_fails_the_run() {
        // Worker 1 records only during the first 10 s.
        let ops: Vec<Op> = (0..100)
            .map(|t| put_ok(0, t))
            .chain((0..10).map(|t| put_ok(101, t)))
            .collect();
        let r = build(inputs(
            &ops,
            vec![],
            vec![exit(0, Some(0), false), exit(1, Some(2), true)],
        ));
        let v = r.verdict();
        assert!(
            v.contains("worker 1 recorded only 10 operations in 100 s"),
            "{v}"
        );
        assert!(
            v.contains("worker 1 recorded nothing in the last 91 s"),
            "{v}"
        );
        assert!(
            v.contains("worker 1 exited before it was asked to stop with status 2"),
            "{v}"
        );
        assert!(!v.contains("worker 0"), "{v}");
        assert!(r.table().contains("the end of the log"));
    }

    #[test]
    fn inconclusive_keys_and_an_unknown_eviction_count_fail_unless_allowed() {
        let ops = steady_ops();
        let mut i = inputs(&ops, vec![], vec![]);
        i.check.inconclusive_keys = vec!["k".into()];
        i.evicted_keys = None;
        let r = build(i);
        assert!(
            r.verdict().contains("1 keys inconclusive"),
            "{}",
            r.verdict()
        );
        assert!(r.verdict().contains("eviction count could not be read"));
        let mut i = inputs(&ops, vec![], vec![]);
        i.check.inconclusive_keys = vec!["k".into()];
        i.allow_inconclusive = true;
        assert!(build(i).passed);
    }
}
