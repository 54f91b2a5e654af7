//! The physical floor of a replicated put and a read, measured in the same
//! run as the figures it is compared with: the latency of a 4 KiB write +
//! fdatasync in the masters' data directory, and the round trip of a trivial
//! gRPC call (GetLeader, no Raft) to the leader. A replicated put cannot beat
//! one fsync plus three round trips (client to leader, leader to followers,
//! and the data write); a read cannot beat one round trip.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use crescent_client::MasterClient;
use serde_json::json;

#[derive(Clone, Copy, Debug)]
pub struct Floor {
    pub fsync_4k_p50_ms: f64,
    pub rpc_p50_ms: f64,
}

impl Floor {
    /// One fsync plus three round trips.
    pub fn put_ms(&self) -> f64 {
        self.fsync_4k_p50_ms + 3.0 * self.rpc_p50_ms
    }

    pub fn to_json(self) -> serde_json::Value {
        json!({"fsync_4k_p50_ms": self.fsync_4k_p50_ms, "grpc_round_trip_p50_ms": self.rpc_p50_ms,
               "put_floor_ms": self.put_ms(), "serial_flush_put_floor_ms": self.serial_flush_put_ms()})
    }

    /// A put's latency as a ratio of the floor, against its targets.
    pub fn put_line(&self, what: &str, p50_ms: f64, p99_ms: f64) -> String {
        format!(
            "  {what} p50 {p50_ms:.3} ms = {:.2}x floor (target 1.5x), p99 {p99_ms:.3} ms = {:.2}x floor (target 4x)",
            p50_ms / self.put_ms(),
            p99_ms / self.put_ms()
        )
    }

    /// What a replicated put can reach on openraft 0.9: two fsyncs and four
    /// round trips. Its RaftCore awaits the leader's own log flush before it
    /// sends the entry to the followers (`append_to_log` awaits the
    /// `LogFlushed` callback), so the leader's fsync and a follower's run in
    /// series, and the replication round trip comes on top of the three the
    /// floor counts. Printed beside the floor, not instead of it: the target
    /// stays against the floor.
    pub fn serial_flush_put_ms(&self) -> f64 {
        2.0 * self.fsync_4k_p50_ms + 4.0 * self.rpc_p50_ms
    }

    /// A replicated put's p50 against [`Floor::serial_flush_put_ms`].
    pub fn serial_flush_line(&self, what: &str, p50_ms: f64) -> String {
        self.serial_flush_line_of(what, p50_ms, 4, "")
    }

    /// [`serial_flush_line`](Self::serial_flush_line) for a put of
    /// `round_trips` round trips (3 when it was placed ahead: no PutStart),
    /// `why` saying so.
    pub fn serial_flush_line_of(
        &self,
        what: &str,
        p50_ms: f64,
        round_trips: u32,
        why: &str,
    ) -> String {
        let floor = 2.0 * self.fsync_4k_p50_ms + f64::from(round_trips) * self.rpc_p50_ms;
        format!(
            "  {what} p50 = {:.2}x openraft 0.9's own floor (leader flush, then replication: 2 fsyncs + {round_trips} round trips{why} = {floor:.3} ms; the floor above is {:.2}x that)",
            p50_ms / floor,
            self.put_ms() / floor
        )
    }

    /// A read's latency as a ratio of one round trip, against its target
    /// (`target` round trips).
    pub fn get_line(&self, what: &str, p50_ms: f64, target: f64) -> String {
        format!(
            "  {what} p50 {p50_ms:.3} ms = {:.2}x one gRPC round trip (target {target}x)",
            p50_ms / self.rpc_p50_ms
        )
    }

    pub fn describe(&self, dir: &Path) -> String {
        format!(
            "floor (same run): 4 KiB write + fdatasync p50 {:.3} ms in {}; gRPC round trip to the leader (GetLeader) p50 {:.3} ms; put floor = fsync + 3 round trips = {:.3} ms",
            self.fsync_4k_p50_ms,
            dir.display(),
            self.rpc_p50_ms,
            self.put_ms()
        )
    }
}

fn p50(mut v: Vec<Duration>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    v[v.len() / 2].as_secs_f64() * 1e3
}

/// p50 of `n` appends of 4 KiB each followed by fdatasync, in a scratch file
/// under `dir` (removed afterwards).
pub fn fsync_4k_p50(dir: &Path, n: usize) -> anyhow::Result<f64> {
    let path = dir.join(format!(".crescent-bench-fsync-{}", std::process::id()));
    let mut file = std::fs::File::create(&path)?;
    let block = vec![0x5au8; 4096];
    let mut lat = Vec::with_capacity(n);
    let result = (|| {
        for _ in 0..n {
            let t = Instant::now();
            file.write_all(&block)?;
            file.sync_data()?;
            lat.push(t.elapsed());
        }
        Ok::<(), std::io::Error>(())
    })();
    let _ = std::fs::remove_file(&path);
    result?;
    Ok(p50(lat))
}

/// p50 of `n` GetLeader calls (after a warm-up) to the leader the client knows.
pub async fn rpc_p50(client: &MasterClient, n: usize) -> anyhow::Result<f64> {
    for _ in 0..20 {
        client.get_leader().await?;
    }
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        client.get_leader().await?;
        lat.push(t.elapsed());
    }
    Ok(p50(lat))
}

/// Both floors: fsync in `dir`, round trips to the leader of `masters`
/// (over TLS with `tls`, so a TLS cluster's floor includes TLS).
pub async fn measure(
    dir: &Path,
    masters: &str,
    token: &crescent_auth::BearerToken,
    tls: Option<&crescent_auth::tls::TlsFiles>,
) -> anyhow::Result<Floor> {
    let dir_owned = dir.to_path_buf();
    let fsync = tokio::task::spawn_blocking(move || fsync_4k_p50(&dir_owned, 200)).await??;
    let client = crate::connect_masters(masters, tls)
        .await?
        .with_token(token.clone())
        .with_tls(tls);
    let rpc = rpc_p50(&client, 500).await?;
    Ok(Floor {
        fsync_4k_p50_ms: fsync,
        rpc_p50_ms: rpc,
    })
}
