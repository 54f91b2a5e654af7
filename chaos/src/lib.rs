//! Crescent's chaos suite: deploy etcd, three masters and two stores with a
//! disk tier each (as local processes, or as containers on a private Docker
//! network), run a workload of several clients that records every
//! operation, inject a seeded schedule of faults (kills, pauses, partitions,
//! store and etcd member loss, store restarts on their disk, a disk that
//! fails, rolling restarts, degraded periods), and check the history: nothing acknowledged lost, no wrong
//! bytes, one leader per term, every key's history linearizable, and no
//! disk object lost across a restart of its store.
//!
//! Owns the harness-level orchestration and the checker. Must not reach into
//! the master's or store's internals: it sees the cluster only through the
//! client library, the masters' status RPC and /metrics, and process or
//! container control. The checker (`checker`, `history`) is pure and does no
//! I/O so it can be tested on hand-written histories.

pub mod checker;
pub mod deploy;
pub mod disk;
pub mod faulty_disk;
pub mod history;
pub mod membership;
pub mod report;
pub mod run;
pub mod schedule;
pub mod stall;
pub mod workload;
