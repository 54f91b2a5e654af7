//! Crescent's replicated metadata layer.
//!
//! Owns the openraft type configuration, the pure and deterministic metadata
//! state machine ([`state`]), the segment allocator ([`alloc`]), the eviction
//! policy ([`eviction`]), the durable log and snapshot storage ([`store`],
//! in an append-only file, [`journal`]), the tonic Raft transport ([`network`]), the leader's read
//! lease bookkeeping ([`lease`]), the rules for
//! which terms a node accepts ([`terms`]) and how big entries and
//! replication messages may be ([`sizing`]).
//!
//! It must not touch the master's leader-only memory (read leases, heartbeats),
//! wall clocks or randomness inside `apply`, nor the data plane: the state
//! machine only describes where bytes live, it never moves them.

use std::io::Cursor;

pub mod alloc;
pub mod codec;
pub mod eviction;
pub mod journal;
pub mod lease;
pub mod network;
pub mod sizing;
pub mod state;
pub mod store;
mod tagged;
pub mod terms;

pub use state::{Command, MetaError, MetaState, Op, Response};

pub type NodeId = u64;

openraft::declare_raft_types!(
    /// Crescent's openraft types: commands in, responses out, `BasicNode { addr }` per master.
    pub TypeConfig:
        D = Command,
        R = Response,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub use openraft::BasicNode;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tier_tests;
