//! Helpers for tests that start real Crescent processes.
//!
//! Owns nothing but test plumbing: locating the built binaries and running
//! `crescentctl`. Process control itself (free ports, temp dirs, SIGKILL,
//! restart) lives in `crescent_client::local`, which benchmarks share. It must
//! never be linked into a production binary.

use std::process::Command;

pub use crescent_client::local::{find_binary, LocalCluster};

/// Runs `crescentctl` with `args`; returns (exit success, stdout, stderr).
pub fn crescentctl(args: &[&str]) -> anyhow::Result<(bool, String, String)> {
    let bin = find_binary("crescentctl")?;
    let out = Command::new(bin).args(args).output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}
