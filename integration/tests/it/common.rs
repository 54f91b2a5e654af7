//! Helpers the test modules share: test values, replica configs, and
//! samples of a master's `/metrics`.

use std::time::Duration;

use crescent_client::{Client, ClientConfig, ReplicateConfig};
use crescent_integration::{metric, LocalCluster};
use crescent_proto::pb;

/// A client of `cluster`'s masters with every other option at its default.
pub async fn connect_client(cluster: &LocalCluster) -> Client {
    Client::connect(ClientConfig {
        master: cluster.masters_arg(),
        ..Default::default()
    })
    .await
    .expect("a client of the test cluster")
}

/// `len` bytes, different for every `seed` and with no short period, so a
/// value that was mixed up, shifted or torn never passes for another.
pub fn patterned(len: usize, seed: usize) -> Vec<u8> {
    let mut x = (0x9E37_79B9_7F4A_7C15u64 ^ (seed as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9)) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

/// A 4 KiB test value.
pub fn value(seed: usize) -> Vec<u8> {
    patterned(4096, seed)
}

/// `n` replicas, every other option at its default.
pub fn replicas(n: u32) -> ReplicateConfig {
    ReplicateConfig {
        replica_num: n,
        ..Default::default()
    }
}

pub fn one_replica() -> ReplicateConfig {
    replicas(1)
}

/// [`replicas`] as it goes on the wire, for tests that call gRPC directly.
pub fn wire_replicas(n: u32) -> pb::ReplicateConfig {
    pb::ReplicateConfig {
        replica_num: n,
        ..Default::default()
    }
}

/// A sample of `/metrics` at `http`; panics if it does not answer or lacks
/// the sample.
pub async fn metric_at(http: &str, name: &str) -> f64 {
    metric(http, name)
        .await
        .unwrap_or_else(|| panic!("{http}/metrics lacks {name}"))
}

/// A sample of master `id`'s `/metrics`: None while it does not answer or
/// lacks the sample.
pub async fn master_metric(cluster: &LocalCluster, id: u64, name: &str) -> Option<f64> {
    let http = cluster.masters.iter().find(|m| m.id == id)?.http.clone();
    metric(&http, name).await
}

/// A sample of the current leader's `/metrics`; panics without a leader or
/// the sample.
pub async fn leader_metric(cluster: &LocalCluster, name: &str) -> f64 {
    let (id, _, _) = cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .expect("a leader");
    master_metric(cluster, id, name)
        .await
        .unwrap_or_else(|| panic!("the leader's /metrics lacks {name}"))
}
