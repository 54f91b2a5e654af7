//! The test harness for every test that starts more than one real Crescent
//! process: free loopback ports, temp dirs, etcd (one member or a cluster),
//! N masters, stores, readiness waits, SIGKILL, SIGSTOP/SIGCONT pauses,
//! restarts and log tails, plus `crescentctl` and a tiny HTTP client.
//!
//! The process control is in [`harness`]; its types are re-exported here so
//! tests, `crescent-bench` and the chaos suite have one place to import
//! from. Test and benchmark plumbing only: no production binary links it.

use std::process::Command;
use std::time::Duration;

pub mod containers;
pub mod harness;

pub use harness::{
    find_binary, free_port, security_flags, tls_flags, wait_listening, write_certs, FakeClock,
    LocalCluster, LocalEtcd, ManagedChild, MasterProcess, Security, StoreProcess,
};

/// Whether every test must run (`CI` set to anything but "", "false" or "0",
/// or `CRESCENT_REQUIRE_ALL=1`, which `.ci/run` sets): then a missing tool
/// fails a test instead of skipping it. `scripts/require-all` is the same
/// rule for the Makefile and the shell scripts.
pub fn require_all() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false" && v != "0")
        || std::env::var("CRESCENT_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

/// Call when `test` cannot run here because `missing` is absent. Under
/// [`require_all`] it panics (the test fails and says why); otherwise it
/// prints a SKIPPED line on stderr and appends it to `$CRESCENT_SKIP_LOG`,
/// which `make test` lists at the end, so a skip is never silent.
pub fn skip_or_fail(test: &str, missing: &str) {
    let line = format!("SKIPPED {test}: {missing}");
    if require_all() {
        panic!("{line} (required: CI or CRESCENT_REQUIRE_ALL=1 is set)");
    }
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("CRESCENT_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

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

/// A minimal HTTP/1.1 request (no dependency on an HTTP client crate):
/// returns the status code and body.
pub async fn http_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("bad HTTP answer: {head}"))?;
    // Bodies may be chunked; tests only look for substrings, so strip chunk sizes loosely.
    Ok((status, body.to_string()))
}

/// One sample of the Prometheus text at `http`'s `/metrics`, if it answers
/// and has it (see [`sample`] for labelled names).
pub async fn metric(http: &str, name: &str) -> Option<f64> {
    let (_, body) = http_request(http, "GET", "/metrics", &[]).await.ok()?;
    sample(&body, name)
}

/// The sample `name` (with its labels, if any, as printed) in the
/// Prometheus text `body`.
pub fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Whether [`metric`] `name` at `http` reads `want` within `within`
/// (polled every 200 ms).
pub async fn metric_reaches(http: &str, name: &str, want: f64, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if metric(http, name).await == Some(want) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}
