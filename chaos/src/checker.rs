//! The checker: pure functions over a recorded history. No I/O, no clock.
//!
//! It fails a run on
//! - a get returning bytes that are not what some put of that key wrote
//!   (corrupt bytes, or another key's value);
//! - an acknowledged put whose object a later get found missing while no
//!   remove of that key could have run in between (a lost write);
//! - entries of one term committed by two different leaders, or two
//!   different entries applied at one log index (seen in the masters' last
//!   applied log ids, sampled). Two masters *leading* in one term is not a
//!   violation by itself: openraft's "advanced" leader id is (term, node),
//!   so two candidates of one term can win in turn, the later one for good,
//!   and only one of them can commit (see `leadership`);
//! - a disk object (one the leader listed on a store's disk segment, read
//!   before that store was SIGKILLed) missing, unreadable or holding other
//!   bytes once the store is back on the same disk, while no remove of that
//!   key could have run in between (a disk object lost across a restart);
//! - a read by a client with the descriptor cache that returns a value
//!   gone for longer than a read lease, or a read in degraded mode that
//!   returns a value no put of that key could have written by then; such
//!   reads promise less (see [`ReadPromise`]) and are left out of the
//!   searches below;
//! - a per-key history of put/get/exists/remove that is not linearizable
//!   against the model of a Crescent object (Wing & Gong search with
//!   memoisation, in the manner of Porcupine and Knossos).
//!
//! The object model: a key is absent or holds one value. A put of an absent
//! key stores its value; a put of a present key succeeds and changes nothing
//! (objects are immutable, "already exists" counts as success). A remove of
//! a present key makes it absent; of an absent key it answers not-found. Get
//! and exists observe. An operation whose outcome is unknown may take effect
//! at any moment after its invocation, or never.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::Serialize;

use crate::history::{DiskCheck, Op, OpKind, Outcome, ReadPromise, RoleSample};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    WrongBytes,
    LostWrite,
    /// Entries of one term committed by two different leaders.
    TwoLeadersCommitted,
    /// Two different entries applied at one log index.
    DivergedLog,
    NotLinearizable,
    /// A read that promised bounded staleness (the descriptor cache) or
    /// only real bytes (degraded mode) returned a value older, or other,
    /// than that promise allows (see [`ReadPromise`]).
    StaleRead,
    /// A disk object lost (or changed) across a restart of its store.
    DiskLost,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub kind: ViolationKind,
    pub key: Option<String>,
    pub detail: String,
}

#[derive(Debug, Default, Serialize)]
pub struct CheckResult {
    pub violations: Vec<Violation>,
    pub keys_checked: usize,
    /// Keys whose linearizability search ran out of budget (not violations,
    /// but not proven either).
    pub inconclusive_keys: Vec<String>,
    /// Disk objects checked across store restarts (a run that checked none
    /// proved nothing about the disk tier; the summary says so).
    pub disk_objects_checked: usize,
    /// ... of which a remove of the key may have run between the reads, so
    /// a missing or different object there proves nothing.
    pub disk_objects_removed_meanwhile: usize,
    /// What the masters' samples showed of leadership (see `leadership`).
    pub leadership: LeadershipSeen,
}

/// Leadership as sampled, beside the violations it may prove: a run whose
/// samples show no applied entry checked nothing here.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct LeadershipSeen {
    /// Terms in which some master reported itself leader.
    pub terms_led: usize,
    /// Terms whose entries some master was seen to have applied.
    pub terms_committed: usize,
    /// Distinct applied log indexes seen (each checked against every other
    /// sample of the same index).
    pub applied_indexes_seen: usize,
    /// Terms in which two masters reported themselves leader, as
    /// "term T: {a, b}" (allowed with advanced leader ids; at most one of
    /// them may commit, which `TwoLeadersCommitted` checks).
    pub terms_with_two_elected: Vec<String>,
}

/// Default per-key search budget (distinct search states).
pub const DEFAULT_BUDGET: usize = 2_000_000;

pub fn check(
    ops: &[Op],
    samples: &[RoleSample],
    disk_checks: &[DiskCheck],
    budget: usize,
) -> CheckResult {
    let mut result = CheckResult::default();
    let (leadership_violations, seen) = leadership(samples);
    result.violations.extend(leadership_violations);
    result.leadership = seen;
    let mut by_key: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        by_key.entry(op.key.as_str()).or_default().push(op);
    }
    result.keys_checked = by_key.len();
    let disk = disk_lost(disk_checks, &by_key);
    result.disk_objects_checked = disk_checks.len();
    result.disk_objects_removed_meanwhile = disk.removed_meanwhile;
    result.violations.extend(disk.violations);
    for (key, ops) in by_key {
        result.violations.extend(wrong_bytes(key, &ops));
        result.violations.extend(relaxed_reads(key, &ops));
        // Reads that promise less than linearizability are judged above
        // only; the rest of the key's history is judged in full.
        let ops: Vec<&Op> = ops.into_iter().filter(|o| !is_relaxed_read(o)).collect();
        result.violations.extend(lost_writes(key, &ops));
        // Reported even when a specific violation above explains it: this is
        // the general proof, and it also catches stale reads.
        match linearizable(&ops, budget) {
            Some(true) => {}
            Some(false) => {
                result.violations.push(Violation {
                    kind: ViolationKind::NotLinearizable,
                    key: Some(key.to_string()),
                    detail: format!("{} operations admit no linearization", ops.len()),
                });
            }
            None => result.inconclusive_keys.push(key.to_string()),
        }
    }
    result
}

impl LeadershipSeen {
    /// One line for a report.
    pub fn summary(&self) -> String {
        format!(
            "leadership: {} terms led, {} terms with applied entries seen, {} applied indexes \
             compared; {} terms with two elected leaders (allowed, at most one commits){}",
            self.terms_led,
            self.terms_committed,
            self.applied_indexes_seen,
            self.terms_with_two_elected.len(),
            if self.terms_with_two_elected.is_empty() {
                String::new()
            } else {
                format!(": {}", self.terms_with_two_elected.join("; "))
            }
        )
    }
}

/// Raft's safety, as far as the masters' samples show it.
///
/// With openraft's default ("advanced") leader id, a vote is (term, node)
/// and a node grants any vote greater than the last it granted, so two
/// candidates of one term can both be elected: A = (t, 1) with B's vote,
/// then C = (t, 3) with B's vote again. Only one can commit: an entry of A
/// on a quorum would sit on a node whose vote C needs, and that node refuses
/// a candidate whose log lacks it. So what must never be seen is
/// - applied entries of one term written by two different leaders, or
/// - two different log ids applied at one index (an applied entry is
///   committed, and a committed entry never changes).
///
/// The samples are taken every 150 ms, so a leader that committed only
/// briefly can be missed; the lost-write and linearizability checks do not
/// depend on them.
pub fn leadership(samples: &[RoleSample]) -> (Vec<Violation>, LeadershipSeen) {
    let mut elected: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    let mut committed_by: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    let mut at_index: BTreeMap<u64, BTreeSet<(u64, u64)>> = BTreeMap::new();
    for s in samples {
        if s.leader {
            elected.entry(s.term).or_default().insert(s.node);
        }
        if s.applied_index > 0 {
            committed_by
                .entry(s.applied_term)
                .or_default()
                .insert(s.applied_leader);
            at_index
                .entry(s.applied_index)
                .or_default()
                .insert((s.applied_term, s.applied_leader));
        }
    }
    let mut violations: Vec<Violation> = committed_by
        .iter()
        .filter(|(_, nodes)| nodes.len() > 1)
        .map(|(term, nodes)| Violation {
            kind: ViolationKind::TwoLeadersCommitted,
            key: None,
            detail: format!("entries of term {term} were applied from leaders {nodes:?}"),
        })
        .collect();
    violations.extend(
        at_index
            .iter()
            .filter(|(_, ids)| ids.len() > 1)
            .map(|(index, ids)| Violation {
                kind: ViolationKind::DivergedLog,
                key: None,
                detail: format!(
                    "log index {index} was applied as (term, leader) {ids:?} on different samples"
                ),
            }),
    );
    let seen = LeadershipSeen {
        terms_led: elected.len(),
        terms_committed: committed_by.len(),
        applied_indexes_seen: at_index.len(),
        terms_with_two_elected: elected
            .iter()
            .filter(|(_, nodes)| nodes.len() > 1)
            .map(|(term, nodes)| format!("term {term}: {nodes:?}"))
            .collect(),
    };
    (violations, seen)
}

fn wrong_bytes(key: &str, ops: &[&Op]) -> Vec<Violation> {
    let put_values: HashSet<u64> = ops
        .iter()
        .filter_map(|o| match o.kind {
            OpKind::Put { value } => Some(value),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    for op in ops {
        match &op.outcome {
            Outcome::Corrupt { detail } => out.push(Violation {
                kind: ViolationKind::WrongBytes,
                key: Some(key.to_string()),
                detail: format!("process {} read corrupt bytes: {detail}", op.process),
            }),
            Outcome::Found { value } if !put_values.contains(value) => out.push(Violation {
                kind: ViolationKind::WrongBytes,
                key: Some(key.to_string()),
                detail: format!(
                    "process {} read value {value}, never put to this key",
                    op.process
                ),
            }),
            _ => {}
        }
    }
    out
}

/// A get that found a value and promises less than linearizability.
fn is_relaxed_read(op: &Op) -> bool {
    matches!(op.outcome, Outcome::Found { .. }) && !op.promise.is_linearizable()
}

/// The client (worker process) an operation came from: its tasks share one
/// client, and so one descriptor cache.
fn client_of(op: &Op) -> u32 {
    op.process / 100
}

/// Judges the reads that promise less than linearizability (see
/// [`ReadPromise`]). The value read must come from a put of the key that
/// did not fail, invoked before the read completed. A stale read must
/// also be recent: once an operation invoked after that put finished has
/// seen the key without it (a remove, a get or an exists finding nothing,
/// or a linearizable get finding another value), the value is gone for good
/// (values are unique and objects immutable), and a read invoked more than
/// `within_us` later, or at all after its own client's remove, may not
/// return it.
fn relaxed_reads(key: &str, ops: &[&Op]) -> Vec<Violation> {
    let mut out = Vec::new();
    for read in ops.iter().filter(|o| is_relaxed_read(o)) {
        let Outcome::Found { value } = read.outcome else {
            continue;
        };
        let put = ops.iter().find(|o| {
            o.kind == OpKind::Put { value }
                && !matches!(o.outcome, Outcome::Fail { .. })
                && o.invoke_us <= read.complete_us
        });
        let Some(put) = put else {
            // A value never put to the key is `wrong_bytes`'s to report.
            if ops.iter().any(|o| o.kind == OpKind::Put { value }) {
                out.push(Violation {
                    kind: ViolationKind::StaleRead,
                    key: Some(key.to_string()),
                    detail: format!(
                        "process {} read value {value}, whose put failed or began after the read",
                        read.process
                    ),
                });
            }
            continue;
        };
        let ReadPromise::Stale { within_us } = read.promise else {
            continue;
        };
        if put.outcome != Outcome::Ok {
            // An unknown put may land at any time.
            continue;
        }
        let gone = ops.iter().find(|w| {
            let saw_absent = match (&w.kind, &w.outcome) {
                (OpKind::Remove { .. }, Outcome::Ok | Outcome::Missing) => true,
                // Found nothing: a lookup answered, whatever the promise.
                (OpKind::Get, Outcome::Missing) => true,
                (OpKind::Get, Outcome::Found { value: other }) => {
                    *other != value && w.promise.is_linearizable()
                }
                (OpKind::Exists, Outcome::Present { exists: false }) => true,
                _ => false,
            };
            let own_remove =
                matches!(w.kind, OpKind::Remove { .. }) && client_of(w) == client_of(read);
            let allowance = if own_remove { 0 } else { within_us };
            saw_absent
                && w.invoke_us > put.complete_us
                && w.complete_us.saturating_add(allowance) < read.invoke_us
        });
        if let Some(w) = gone {
            out.push(Violation {
                kind: ViolationKind::StaleRead,
                key: Some(key.to_string()),
                detail: format!(
                    "process {} read value {value} at {} us; process {} saw the key without it by {} us, \
                     more than the {within_us} us a cached read may lag (or its own client removed it)",
                    read.process, read.invoke_us, w.process, w.complete_us
                ),
            });
        }
    }
    out
}

fn lost_writes(key: &str, ops: &[&Op]) -> Vec<Violation> {
    let removes: Vec<&&Op> = ops
        .iter()
        .filter(|o| {
            matches!(o.kind, OpKind::Remove { .. })
                && matches!(o.outcome, Outcome::Ok | Outcome::Unknown { .. })
        })
        .collect();
    let mut out = Vec::new();
    for put in ops
        .iter()
        .filter(|o| matches!(o.kind, OpKind::Put { .. }) && o.outcome == Outcome::Ok)
    {
        let lost = ops.iter().find(|g| {
            g.kind == OpKind::Get
                && g.outcome == Outcome::Missing
                && g.invoke_us > put.complete_us
                && !removes.iter().any(|r| {
                    let r_end = match r.outcome {
                        Outcome::Unknown { .. } => u64::MAX,
                        _ => r.complete_us,
                    };
                    r.invoke_us < g.complete_us && r_end >= put.invoke_us
                })
        });
        if let Some(g) = lost {
            out.push(Violation {
                kind: ViolationKind::LostWrite,
                key: Some(key.to_string()),
                detail: format!(
                    "put by process {} acknowledged at {} us; get by process {} at {} us found nothing, with no remove in between",
                    put.process, put.complete_us, g.process, g.invoke_us
                ),
            });
        }
    }
    out
}

/// What [`disk_lost`] found.
struct DiskVerdict {
    violations: Vec<Violation>,
    removed_meanwhile: usize,
}

/// Whether a remove of the key (acknowledged, or of unknown outcome, which
/// may land any time later) may have run in `[from_us, to_us]`.
fn removed_between(ops: &[&Op], from_us: u64, to_us: u64) -> bool {
    ops.iter().any(|r| {
        matches!(r.kind, OpKind::Remove { .. })
            && matches!(r.outcome, Outcome::Ok | Outcome::Unknown { .. })
            && r.invoke_us <= to_us
            && match r.outcome {
                Outcome::Unknown { .. } => true,
                _ => r.complete_us >= from_us,
            }
    })
}

/// Disk objects lost across a store restart: every checked object must read
/// back, after its store came back on the same disk, as the value it held
/// before the kill. Missing (not found), unreadable (its replicas still
/// unavailable after the store is back, or unreadable from the store), of
/// unknown outcome or other bytes are all a loss, unless a remove of the key
/// may have run between the two reads (a worker may remove the key, and put
/// it again, while its store is down).
fn disk_lost(checks: &[DiskCheck], by_key: &BTreeMap<&str, Vec<&Op>>) -> DiskVerdict {
    let mut verdict = DiskVerdict {
        violations: Vec::new(),
        removed_meanwhile: 0,
    };
    for c in checks {
        if c.after == (Outcome::Found { value: c.value }) {
            continue;
        }
        let ops = by_key.get(c.key.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        if removed_between(ops, c.before_us, c.after_complete_us) {
            verdict.removed_meanwhile += 1;
            continue;
        }
        let found = match &c.after {
            Outcome::Found { value } => format!("value {value}"),
            Outcome::Missing => "no object (not found)".to_string(),
            Outcome::Corrupt { detail } => format!("corrupt bytes ({detail})"),
            Outcome::Fail { error } | Outcome::Unknown { error } => {
                format!("no readable replica ({error})")
            }
            other => format!("{other:?}"),
        };
        let back = match c.back_us {
            Some(us) => format!("the store had a disk segment mounted again at {us} us"),
            None => "the store had no disk segment mounted again in time".to_string(),
        };
        verdict.violations.push(Violation {
            kind: ViolationKind::DiskLost,
            key: Some(c.key.clone()),
            detail: format!(
                "held value {} on disk segment {} of store {} (read at {} us); store SIGKILLed \
                 at {} us and restarted on the same disk; {back}; the read at {} us found {found}, \
                 with no remove in between",
                c.value, c.segment, c.store, c.before_us, c.killed_us, c.after_invoke_us
            ),
        });
    }
    verdict
}

/// The model's state: absent, or present with a value id.
type State = Option<u64>;

struct Entry {
    invoke: u64,
    complete: u64,
    kind: OpKind,
    outcome: Outcome,
}

/// The model's transition, or None when `e`'s outcome is impossible from `s`.
fn step(s: State, e: &Entry) -> Option<State> {
    match (&e.kind, &e.outcome) {
        (OpKind::Put { value }, _) => Some(s.or(Some(*value))),
        (OpKind::Get, Outcome::Found { value }) => (s == Some(*value)).then_some(s),
        (OpKind::Get, Outcome::Missing) => s.is_none().then_some(s),
        (OpKind::Exists, Outcome::Present { exists }) => (s.is_some() == *exists).then_some(s),
        (OpKind::Remove { .. }, Outcome::Ok) => s.is_some().then_some(None),
        (OpKind::Remove { .. }, Outcome::Missing) => s.is_none().then_some(s),
        (OpKind::Remove { .. }, Outcome::Unknown { .. }) => Some(None),
        _ => Some(s),
    }
}

/// Stands for every value no get ever returned: states holding such values
/// are indistinguishable to the model's observations, so they are one state
/// (workload value ids are far below it).
const UNREAD_VALUE: u64 = u64::MAX;

/// Entries that constrain the search: failures had no effect and failed
/// reads tell nothing, so both are left out; unknown writes never complete.
fn entries(ops: &[&Op]) -> Vec<Entry> {
    let read: HashSet<u64> = ops
        .iter()
        .filter_map(|o| match o.outcome {
            Outcome::Found { value } => Some(value),
            _ => None,
        })
        .collect();
    let mut v: Vec<Entry> = ops
        .iter()
        .filter_map(|o| {
            let keep = !matches!(
                (&o.kind, &o.outcome),
                (_, Outcome::Fail { .. } | Outcome::Corrupt { .. })
                    | (OpKind::Get | OpKind::Exists, Outcome::Unknown { .. })
            );
            keep.then(|| Entry {
                invoke: o.invoke_us,
                complete: match o.outcome {
                    Outcome::Unknown { .. } => u64::MAX,
                    _ => o.complete_us.max(o.invoke_us),
                },
                kind: match o.kind {
                    OpKind::Put { value } if !read.contains(&value) => OpKind::Put {
                        value: UNREAD_VALUE,
                    },
                    ref k => k.clone(),
                },
                outcome: o.outcome.clone(),
            })
        })
        .collect();
    v.sort_by_key(|e| (e.invoke, e.complete));
    v
}

/// Is there an order of the key's operations, each at a point between its
/// invocation and completion, that the model accepts? None when the search
/// exceeded `budget` states.
pub fn linearizable(ops: &[&Op], budget: usize) -> Option<bool> {
    let entries = entries(ops);
    let mut search = Search {
        done: vec![0u64; entries.len().div_ceil(64)],
        definite_remaining: entries.iter().filter(|e| !e.is_unknown()).count(),
        seen: HashSet::new(),
        budget,
        gave_up: false,
        entries: &entries,
    };
    let ok = search.dfs(None);
    if ok {
        Some(true)
    } else if search.gave_up {
        None
    } else {
        Some(false)
    }
}

impl Entry {
    fn is_unknown(&self) -> bool {
        self.complete == u64::MAX
    }
}

/// The search over orders. Three reductions keep writes of unknown outcome
/// (which stay pending forever) from multiplying the states, all sound
/// because such a write may take effect at any moment after its invocation
/// or never:
/// - the search succeeds once every definite operation is placed: the
///   unknown ones left over never took effect;
/// - an unknown write is placed only where it changes the state (placing a
///   no-op is the same as never placing it);
/// - of the unknown writes pending at one point, only one per resulting
///   state is tried: both are already invoked and never complete, and equal
///   effects from one state mean equal effects from every state (removes,
///   or puts of one value), so the searches below them are the same.
struct Search<'a> {
    entries: &'a [Entry],
    done: Vec<u64>,
    definite_remaining: usize,
    seen: HashSet<(Vec<u64>, State)>,
    budget: usize,
    gave_up: bool,
}

impl Search<'_> {
    fn is_done(&self, i: usize) -> bool {
        self.done[i / 64] & (1 << (i % 64)) != 0
    }

    fn flip(&mut self, i: usize) {
        self.done[i / 64] ^= 1 << (i % 64);
    }

    fn dfs(&mut self, state: State) -> bool {
        if self.definite_remaining == 0 {
            return true;
        }
        if self.gave_up || !self.seen.insert((self.done.clone(), state)) {
            return false;
        }
        if self.seen.len() > self.budget {
            self.gave_up = true;
            return false;
        }
        // Whatever is linearized next must have been invoked before every
        // pending operation completed.
        let min_complete = (0..self.entries.len())
            .filter(|&i| !self.is_done(i))
            .map(|i| self.entries[i].complete)
            .min()
            .unwrap_or(u64::MAX);
        let mut unknown_effects_tried: Vec<State> = Vec::new();
        for i in 0..self.entries.len() {
            let e = &self.entries[i];
            if e.invoke > min_complete {
                break;
            }
            if self.is_done(i) {
                continue;
            }
            let Some(next) = step(state, e) else {
                continue;
            };
            let unknown = e.is_unknown();
            if unknown {
                if next == state || unknown_effects_tried.contains(&next) {
                    continue;
                }
                unknown_effects_tried.push(next);
            }
            self.flip(i);
            if !unknown {
                self.definite_remaining -= 1;
            }
            if self.dfs(next) {
                return true;
            }
            self.flip(i);
            if !unknown {
                self.definite_remaining += 1;
            }
        }
        false
    }
}

/// Counts of outcomes by kind, for the summary.
pub fn outcome_counts<'a>(ops: impl IntoIterator<Item = &'a Op>) -> HashMap<&'static str, u64> {
    let mut m = HashMap::new();
    for op in ops {
        let k = match op.outcome {
            Outcome::Ok | Outcome::Found { .. } | Outcome::Missing | Outcome::Present { .. } => {
                "ok"
            }
            Outcome::Fail { .. } | Outcome::Corrupt { .. } => "failed",
            Outcome::Unknown { .. } => "unknown",
        };
        *m.entry(k).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(process: u32, kind: OpKind, invoke: u64, complete: u64, outcome: Outcome) -> Op {
        Op {
            process,
            key: "k".into(),
            kind,
            invoke_us: invoke,
            complete_us: complete,
            outcome,
            promise: ReadPromise::Linearizable,
        }
    }
    fn put(p: u32, v: u64, i: u64, c: u64, o: Outcome) -> Op {
        op(p, OpKind::Put { value: v }, i, c, o)
    }
    fn get(p: u32, i: u64, c: u64, o: Outcome) -> Op {
        op(p, OpKind::Get, i, c, o)
    }
    fn unknown() -> Outcome {
        Outcome::Unknown {
            error: "timeout".into(),
        }
    }
    fn kinds(ops: &[Op]) -> Vec<ViolationKind> {
        check(ops, &[], &[], DEFAULT_BUDGET)
            .violations
            .into_iter()
            .map(|v| v.kind)
            .collect()
    }

    #[test]
    fn a_sequential_history_passes() {
        let h = vec![
            get(1, 0, 1, Outcome::Missing),
            put(1, 7, 2, 3, Outcome::Ok),
            get(2, 4, 5, Outcome::Found { value: 7 }),
            put(2, 8, 6, 7, Outcome::Ok), // already exists: no change
            get(1, 8, 9, Outcome::Found { value: 7 }),
            op(1, OpKind::Remove { force: false }, 10, 11, Outcome::Ok),
            op(
                2,
                OpKind::Exists,
                12,
                13,
                Outcome::Present { exists: false },
            ),
        ];
        assert!(kinds(&h).is_empty());
    }

    fn promised(mut o: Op, promise: ReadPromise) -> Op {
        o.promise = promise;
        o
    }
    fn force_remove(p: u32, i: u64, c: u64) -> Op {
        op(p, OpKind::Remove { force: true }, i, c, Outcome::Ok)
    }

    #[test]
    fn a_cached_read_may_lag_by_one_lease_and_no_more() {
        let lease = ReadPromise::Stale { within_us: 100 };
        let cached_read = |i, c| promised(get(201, i, c, Outcome::Found { value: 7 }), lease);
        let history = |read: Op| {
            vec![
                put(101, 7, 0, 10, Outcome::Ok),
                force_remove(102, 20, 30),
                get(103, 40, 50, Outcome::Missing),
                read,
            ]
        };
        // Stale, but within a lease of the remove: not linearizable, allowed.
        assert!(kinds(&history(cached_read(120, 125))).is_empty());
        let k = kinds(&history(cached_read(200, 205)));
        assert_eq!(
            k,
            vec![ViolationKind::StaleRead],
            "a lease and more after the remove"
        );
        // The same read with no promise is a plain stale read.
        let k = kinds(&history(get(201, 120, 125, Outcome::Found { value: 7 })));
        assert_eq!(k, vec![ViolationKind::NotLinearizable]);
    }

    #[test]
    fn a_cached_read_may_not_return_a_value_replaced_a_lease_ago() {
        let lease = ReadPromise::Stale { within_us: 100 };
        // A remove of unknown outcome (no proof by itself), a put of 8,
        // and a plain read that found 8 at 40-50: 7 was gone by then.
        let h = |read_at| {
            vec![
                put(101, 7, 0, 10, Outcome::Ok),
                op(
                    102,
                    OpKind::Remove { force: true },
                    20,
                    u64::MAX - 1,
                    unknown(),
                ),
                put(102, 8, 30, 35, Outcome::Ok),
                get(103, 40, 50, Outcome::Found { value: 8 }),
                promised(
                    get(201, read_at, read_at + 5, Outcome::Found { value: 7 }),
                    lease,
                ),
            ]
        };
        assert!(kinds(&h(120)).is_empty(), "within a lease of the read of 8");
        assert_eq!(kinds(&h(200)), vec![ViolationKind::StaleRead]);
    }

    #[test]
    fn a_cached_read_never_lags_its_own_clients_remove() {
        let lease = ReadPromise::Stale { within_us: 100 };
        let h = vec![
            put(101, 7, 0, 10, Outcome::Ok),
            // Another task of the reader's client (worker 2).
            force_remove(202, 20, 30),
            promised(get(201, 40, 45, Outcome::Found { value: 7 }), lease),
        ];
        assert_eq!(kinds(&h), vec![ViolationKind::StaleRead]);
    }

    #[test]
    fn a_degraded_read_promises_only_bytes_some_put_wrote() {
        // Its own local-only put (recorded as unknown), which others never see.
        let own = vec![
            put(201, 7, 0, 10, unknown()),
            promised(
                get(202, 20, 30, Outcome::Found { value: 7 }),
                ReadPromise::Degraded,
            ),
            get(101, 40, 50, Outcome::Missing),
        ];
        assert!(kinds(&own).is_empty());
        // A value whose put began after the read ended.
        let early = vec![
            promised(
                get(202, 20, 30, Outcome::Found { value: 7 }),
                ReadPromise::Degraded,
            ),
            put(201, 7, 40, 50, Outcome::Ok),
        ];
        assert_eq!(kinds(&early), vec![ViolationKind::StaleRead]);
        // A value never put to the key.
        let forged = vec![promised(
            get(202, 20, 30, Outcome::Found { value: 9 }),
            ReadPromise::Degraded,
        )];
        assert_eq!(kinds(&forged), vec![ViolationKind::WrongBytes]);
    }

    #[test]
    fn a_lost_acknowledged_put_is_caught() {
        let h = vec![
            put(1, 7, 0, 10, Outcome::Ok),
            get(2, 20, 30, Outcome::Missing),
        ];
        let k = kinds(&h);
        assert!(k.contains(&ViolationKind::LostWrite), "{k:?}");
        assert!(k.contains(&ViolationKind::NotLinearizable), "{k:?}");
    }

    #[test]
    fn a_concurrent_remove_explains_a_missing_read() {
        let h = vec![
            put(1, 7, 0, 10, Outcome::Ok),
            op(
                3,
                OpKind::Remove { force: false },
                15,
                u64::MAX - 1,
                unknown(),
            ),
            get(2, 20, 30, Outcome::Missing),
        ];
        assert!(kinds(&h).is_empty());
    }

    #[test]
    fn an_unknown_put_may_land_late_or_never() {
        let late = vec![
            put(1, 7, 0, 5, unknown()),
            get(2, 10, 11, Outcome::Missing),
            get(2, 12, 13, Outcome::Found { value: 7 }),
        ];
        assert!(kinds(&late).is_empty());
        let never = vec![put(1, 7, 0, 5, unknown()), get(2, 10, 11, Outcome::Missing)];
        assert!(kinds(&never).is_empty());
        // ... but once seen it cannot disappear without a remove.
        let flicker = vec![
            put(1, 7, 0, 5, unknown()),
            get(2, 10, 11, Outcome::Found { value: 7 }),
            get(2, 12, 13, Outcome::Missing),
        ];
        assert!(kinds(&flicker).contains(&ViolationKind::NotLinearizable));
    }

    #[test]
    fn overlapping_operations_may_take_either_order() {
        let h = vec![
            put(1, 7, 0, 100, Outcome::Ok),
            get(2, 10, 20, Outcome::Missing),
            get(3, 30, 40, Outcome::Found { value: 7 }),
        ];
        assert!(kinds(&h).is_empty());
    }

    #[test]
    fn a_stale_read_after_a_newer_value_is_not_linearizable() {
        // 7 is put, removed, 8 put; a later read of 7 is stale.
        let h = vec![
            put(1, 7, 0, 1, Outcome::Ok),
            op(1, OpKind::Remove { force: false }, 2, 3, Outcome::Ok),
            put(1, 8, 4, 5, Outcome::Ok),
            get(2, 6, 7, Outcome::Found { value: 7 }),
        ];
        assert_eq!(kinds(&h), vec![ViolationKind::NotLinearizable]);
    }

    #[test]
    fn foreign_or_corrupt_bytes_are_caught() {
        let h = vec![
            put(1, 7, 0, 1, Outcome::Ok),
            get(2, 2, 3, Outcome::Found { value: 9 }),
        ];
        assert!(kinds(&h).contains(&ViolationKind::WrongBytes));
        let h = vec![
            put(1, 7, 0, 1, Outcome::Ok),
            get(2, 2, 3, Outcome::Corrupt { detail: "x".into() }),
        ];
        assert!(kinds(&h).contains(&ViolationKind::WrongBytes));
    }

    fn disk_check(after: Outcome) -> DiskCheck {
        DiskCheck {
            key: "k".into(),
            store: 1,
            segment: "s1-disk".into(),
            value: 7,
            before_us: 20,
            killed_us: 30,
            back_us: Some(40),
            after_invoke_us: 50,
            after_complete_us: 60,
            after,
        }
    }

    fn disk_kinds(ops: &[Op], checks: &[DiskCheck]) -> (Vec<ViolationKind>, CheckResult) {
        let r = check(ops, &[], checks, DEFAULT_BUDGET);
        (r.violations.iter().map(|v| v.kind).collect(), r)
    }

    #[test]
    fn a_disk_object_read_back_after_its_store_restart_passes() {
        let h = vec![put(1, 7, 0, 10, Outcome::Ok)];
        let (k, r) = disk_kinds(&h, &[disk_check(Outcome::Found { value: 7 })]);
        assert!(k.is_empty(), "{k:?}");
        assert_eq!(r.disk_objects_checked, 1);
        assert_eq!(r.disk_objects_removed_meanwhile, 0);
    }

    #[test]
    fn a_disk_object_missing_unreadable_or_changed_after_its_store_restart_is_lost() {
        let h = vec![put(1, 7, 0, 10, Outcome::Ok)];
        for after in [
            Outcome::Missing,
            Outcome::Fail {
                error: "REPLICAS_UNAVAILABLE".into(),
            },
            Outcome::Unknown {
                error: "timeout".into(),
            },
            Outcome::Found { value: 8 },
            Outcome::Corrupt {
                detail: "zeros".into(),
            },
        ] {
            let (k, r) = disk_kinds(&h, &[disk_check(after.clone())]);
            assert_eq!(k, vec![ViolationKind::DiskLost], "{after:?}");
            assert!(
                r.violations[0].detail.contains("s1-disk"),
                "{:?}",
                r.violations
            );
        }
        // A remove that failed for sure, or ended before the first read,
        // excuses nothing.
        let mut h = h.clone();
        h.push(op(2, OpKind::Remove { force: true }, 11, 12, Outcome::Ok));
        h.push(put(2, 7, 13, 14, Outcome::Ok));
        h.push(op(
            3,
            OpKind::Remove { force: false },
            25,
            26,
            Outcome::Fail {
                error: "OBJECT_HAS_LEASE".into(),
            },
        ));
        let (k, _) = disk_kinds(&h, &[disk_check(Outcome::Missing)]);
        assert_eq!(k, vec![ViolationKind::DiskLost]);
    }

    #[test]
    fn a_remove_between_the_reads_excuses_a_missing_disk_object() {
        for remove in [
            op(2, OpKind::Remove { force: true }, 35, 36, Outcome::Ok),
            // Of unknown outcome before the first read: it may land later.
            op(
                2,
                OpKind::Remove { force: true },
                5,
                6,
                Outcome::Unknown {
                    error: "timeout".into(),
                },
            ),
        ] {
            let h = vec![put(1, 7, 0, 10, Outcome::Ok), remove];
            let (k, r) = disk_kinds(&h, &[disk_check(Outcome::Missing)]);
            assert!(
                !k.contains(&ViolationKind::DiskLost),
                "{k:?}: {:?}",
                r.violations
            );
            assert_eq!(r.disk_objects_removed_meanwhile, 1);
        }
    }

    fn sample(node: u64, term: u64, leader: bool, applied: (u64, u64, u64)) -> RoleSample {
        RoleSample {
            node,
            term,
            leader,
            at_us: 0,
            applied_index: applied.0,
            applied_term: applied.1,
            applied_leader: applied.2,
        }
    }

    /// The one leadership violation `samples` show (fails unless exactly one).
    fn only_leadership_violation(samples: &[RoleSample]) -> Violation {
        let (mut violations, _) = leadership(samples);
        assert_eq!(violations.len(), 1, "{violations:?}");
        violations.remove(0)
    }

    #[test]
    fn two_elected_leaders_of_one_term_pass_while_only_one_commits() {
        // Term 5: node 1 elected first, node 3 later with node 2's vote
        // again; only node 3's entries were ever applied.
        let samples = [
            sample(1, 5, true, (10, 4, 2)),
            sample(3, 5, true, (11, 5, 3)),
            sample(2, 5, false, (11, 5, 3)),
            sample(1, 5, false, (12, 5, 3)),
        ];
        let (violations, seen) = leadership(&samples);
        assert!(violations.is_empty(), "{violations:?}");
        assert_eq!(seen.terms_with_two_elected, vec!["term 5: {1, 3}"]);
        assert_eq!((seen.terms_led, seen.terms_committed), (1, 2));
        assert_eq!(seen.applied_indexes_seen, 3);
    }

    #[test]
    fn two_leaders_committing_in_one_term_are_caught() {
        let samples = [
            sample(1, 5, true, (11, 5, 1)),
            sample(3, 5, true, (12, 5, 3)),
        ];
        let found = only_leadership_violation(&samples);
        assert_eq!(found.kind, ViolationKind::TwoLeadersCommitted);
        assert!(found.detail.contains("term 5"), "{found:?}");
    }

    #[test]
    fn two_entries_applied_at_one_index_are_caught() {
        // Different terms, so no term has two committers: only the index
        // shows the divergence.
        let samples = [
            sample(1, 6, false, (11, 5, 1)),
            sample(2, 6, true, (11, 6, 2)),
        ];
        let found = only_leadership_violation(&samples);
        assert_eq!(found.kind, ViolationKind::DivergedLog);
        assert!(found.detail.contains("index 11"), "{found:?}");
    }

    #[test]
    fn samples_recorded_before_applied_ids_existed_check_nothing() {
        let old: RoleSample =
            serde_json::from_str(r#"{"node":1,"term":3,"leader":true,"at_us":0}"#).unwrap();
        let (violations, seen) = leadership(&[old.clone(), RoleSample { node: 2, ..old }]);
        assert!(violations.is_empty());
        assert_eq!((seen.terms_committed, seen.applied_indexes_seen), (0, 0));
        assert_eq!(seen.terms_with_two_elected.len(), 1);
    }

    #[test]
    fn many_concurrent_unknowns_stay_within_budget() {
        let mut h = Vec::new();
        for i in 0..40u64 {
            h.push(put(i as u32, i, i * 10, i * 10 + 5, unknown()));
            h.push(get(
                100,
                i * 10 + 6,
                i * 10 + 7,
                Outcome::Found { value: 0 },
            ));
        }
        let refs: Vec<&Op> = h.iter().collect();
        assert_eq!(linearizable(&refs, DEFAULT_BUDGET), Some(true));
    }

    /// Many writes of unknown outcome, none of whose values anyone read:
    /// without treating them as optional and interchangeable, the search
    /// enumerates subsets of them and gives up (as a 30-minute soak's key
    /// with 144 operations once did).
    fn unread_unknown_writes(n: u64) -> Vec<Op> {
        let mut h = Vec::new();
        for i in 0..n {
            h.push(put(i as u32, i, i * 10, i * 10 + 5, unknown()));
            h.push(op(
                i as u32 + 200,
                OpKind::Remove { force: true },
                i * 10 + 1,
                i * 10 + 6,
                unknown(),
            ));
            h.push(get(100, i * 10 + 7, i * 10 + 8, Outcome::Missing));
        }
        let t = n * 10;
        h.push(put(100, 1000, t, t + 1, Outcome::Ok));
        h.push(get(100, t + 2, t + 3, Outcome::Found { value: 1000 }));
        h
    }

    #[test]
    fn unknown_writes_nobody_read_are_optional_and_interchangeable() {
        let h = unread_unknown_writes(40);
        let refs: Vec<&Op> = h.iter().collect();
        assert_eq!(linearizable(&refs, 20_000), Some(true));
        // The same history ending in a read of 1000 after 2000 replaced it
        // has no linearization, and the search must prove that in budget:
        // every order of the unknown writes before it is a dead end.
        let mut bad = unread_unknown_writes(40);
        let t = 40 * 10;
        bad.push(op(
            100,
            OpKind::Remove { force: true },
            t + 4,
            t + 5,
            Outcome::Ok,
        ));
        bad.push(put(100, 2000, t + 6, t + 7, Outcome::Ok));
        bad.push(get(100, t + 8, t + 9, Outcome::Found { value: 2000 }));
        bad.push(get(100, t + 10, t + 11, Outcome::Found { value: 1000 }));
        let refs: Vec<&Op> = bad.iter().collect();
        assert_eq!(linearizable(&refs, 20_000), Some(false));
    }
}
