//! The library an inference engine links to reach Crescent, the store agent,
//! and the `crescentctl` / `crescent-store` binaries.
//!
//! Owns the client API ([`Client`]: put/get of real bytes, batches, zero-copy
//! variants, checksums and replica fallback), its configuration (Mooncake's
//! names), the agent that registers a memory segment with the masters
//! ([`agent`]), the leader-following master client ([`master::MasterClient`]: finds the
//! leader, follows NOT_LEADER hints, retries with jittered backoff under a
//! deadline, stamps every write with a (client_id, request_seq) so a retry is
//! applied once), and helpers to run local master processes for benchmarks and
//! demos ([`local`]). It must not hold authoritative metadata (the masters do) nor implement
//! transports (they are `crescent-store`'s).

pub mod agent;
pub mod client;
pub mod config;
pub mod discovery;
pub mod local;
pub mod local_cache;
pub mod master;
pub mod mooncake;

pub use client::{Client, ClientCore, Error, ReplicateConfig, Stored};
pub use config::{ClientConfig, Protocol};
pub use master::{ClientError, MasterClient, RetryPolicy};
