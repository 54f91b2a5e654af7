//! The Crescent master.
//!
//! Owns one master replica: its Raft node (through `crescent-raft`), the gRPC
//! `MasterService` (object and segment metadata) and `ClusterService`
//! (leadership and membership), and the leader-only memory and background
//! work (read leases, heartbeats, eviction, liveness, reclaim).
//!
//! The gRPC and HTTP layers (`service`, `cluster`, `http`) only validate and
//! convert, then call `node::MasterNode`, whose fields are private: the
//! lease, heartbeat and doom bookkeeping and the leadership transfer are its
//! methods (or `node::LeaderMemory`'s), so no handler takes its locks.
//!
//! It must not decide metadata outside Raft: every change goes through a
//! committed log entry. It touches object bytes only to copy them between
//! tiers, memory to disk and back (`tier_move`: the leader copies them over
//! the stores' data port); every other byte moves between stores and clients. It
//! keeps no wall-clock time or randomness out of the commands it proposes.

pub mod auth_layer;
pub mod cluster;
pub mod config;
pub mod etcd;
pub mod http;
pub mod leader;
pub mod node;
pub mod server;
pub mod service;
pub mod tier_move;

pub use crescent_raft::NodeId;
