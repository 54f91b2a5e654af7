//! The run's summary: a table per fault kind (faults, the longest window
//! without a successful write, ops ok/failed/unknown) and the violations,
//! printed and written as JSON.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::checker::{outcome_counts, CheckResult, ViolationKind};
use crate::deploy::Mode;
use crate::history::{Op, OpKind, Outcome};
use crate::run::{FaultRecord, ScheduleKind};
use crate::schedule::FaultKind;

pub struct Inputs<'a> {
    pub mode: Mode,
    pub mode_reason: String,
    pub seed: u64,
    pub schedule: ScheduleKind,
    pub started_us: u64,
    pub ended_us: u64,
    pub faults: Vec<FaultRecord>,
    pub ops: &'a [Op],
    pub check: CheckResult,
    pub evicted_keys: Option<u64>,
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
    pub duration_s: f64,
    pub ops_total: usize,
    pub ops_ok: u64,
    pub ops_failed: u64,
    pub ops_unknown: u64,
    pub acknowledged_writes: u64,
    pub keys_checked: usize,
    pub by_kind: Vec<KindSummary>,
    pub faults: Vec<FaultRecord>,
    pub violations: Vec<crate::checker::Violation>,
    pub violation_counts: BTreeMap<String, usize>,
    pub inconclusive_keys: Vec<String>,
    pub evicted_keys: Option<u64>,
    pub passed: bool,
}

fn is_ok_write(op: &Op) -> bool {
    matches!(op.kind, OpKind::Put { .. } | OpKind::Remove) && op.outcome == Outcome::Ok
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
        let end = i
            .faults
            .get(n + 1)
            .map(|next| next.start_us)
            .unwrap_or(i.ended_us);
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
    let passed = i.check.violations.is_empty()
        && unrecovered == 0
        && acknowledged_writes > 0
        && i.evicted_keys.unwrap_or(0) == 0;
    Report {
        mode: i.mode,
        mode_reason: i.mode_reason,
        seed: i.seed,
        schedule: i.schedule,
        duration_s: (i.ended_us.saturating_sub(i.started_us)) as f64 / 1e6,
        ops_total: i.ops.len(),
        ops_ok: totals.get("ok").copied().unwrap_or(0),
        ops_failed: totals.get("failed").copied().unwrap_or(0),
        ops_unknown: totals.get("unknown").copied().unwrap_or(0),
        acknowledged_writes,
        keys_checked: i.check.keys_checked,
        by_kind,
        faults: i.faults,
        violations: i.check.violations,
        violation_counts,
        inconclusive_keys: i.check.inconclusive_keys,
        evicted_keys: i.evicted_keys,
        passed,
    }
}

impl Report {
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
}
