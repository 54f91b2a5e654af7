//! The library an inference engine links to reach Crescent.
//!
//! Owns the client API ([`Client`]: put/get of real bytes, batches, zero-copy
//! variants, checksums and replica fallback, degraded local-only mode), its
//! configuration (Mooncake's names), the agent that contributes a memory
//! segment and registers it with the masters ([`agent`]), and the
//! leader-following master client ([`master::MasterClient`]: finds the
//! leader, follows NOT_LEADER hints, retries with jittered backoff under a
//! deadline, stamps every write with a (client_id, request_seq) so a retry is
//! applied once).
//!
//! It must not hold authoritative metadata (the masters do), implement
//! transports (they are `crescent-store`'s), or carry a CLI, server, HTTP
//! router, benchmark or test harness: those live in `cmd/` and
//! `integration/`, so an engine links only what it runs.

pub mod agent;
pub mod client;
pub mod config;
pub mod discovery;
pub mod local_cache;
pub mod master;
pub mod mooncake;

pub use client::{Client, ClientCore, Error, ReplicateConfig, Stored};
pub use config::{ClientConfig, Protocol};
pub use master::{MasterClient, MasterRpcError, RetryPolicy};
