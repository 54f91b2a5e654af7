//! The library an inference engine links to reach Crescent, and the operator CLI.
//!
//! Owns the leader-following master client ([`master::MasterClient`]: finds the
//! leader, follows NOT_LEADER hints, retries with jittered backoff under a
//! deadline, stamps every write with a (client_id, request_seq) so a retry is
//! applied once), and helpers to run local master processes for benchmarks and
//! demos ([`local`]). It must not hold authoritative metadata: the masters do.

pub mod local;
pub mod master;

pub use master::{ClientError, MasterClient, RetryPolicy};
