//! Limits against hostile or oversized input on real master processes
//! (issue 11): absurd segment capacities, segment quotas, and allocation
//! requests no eviction could satisfy. Each refusal changes nothing.
//! Needs `cargo build --bins` first (`make test` does it).

use std::time::Duration;

use crescent_client::MasterClient;
use crescent_integration::{http_request, LocalCluster};
use crescent_proto::pb;
use crescent_proto::ErrorCode;

fn spec(name: &str, capacity: u64) -> pb::SegmentSpec {
    pb::SegmentSpec {
        name: name.into(),
        endpoint: "127.0.0.1:1".into(),
        capacity,
        ..Default::default()
    }
}

/// The value of an unlabelled Prometheus sample on the leader.
async fn leader_metric(cluster: &LocalCluster, name: &str) -> f64 {
    let (leader, _, _) = cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let http = cluster
        .masters
        .iter()
        .find(|m| m.id == leader)
        .unwrap()
        .http
        .clone();
    let (_, body) = http_request(&http, "GET", "/metrics", &[]).await.unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("/metrics lacks {name}:\n{body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_capacities_and_segment_quotas_are_refused() {
    let cluster = LocalCluster::start(
        3,
        &[
            "--max-segments".into(),
            "3".into(),
            "--max-segments-per-client".into(),
            "2".into(),
        ],
    )
    .unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let a = MasterClient::new(&cluster.masters_arg()).unwrap();
    a.mount_segment(spec("a1", 1 << 30)).await.unwrap();

    // A capacity near 2^64 once wrapped the total capacity to 1 KiB.
    let e = a
        .mount_segment(spec("wrap", u64::MAX - (1 << 28) + 1024))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidParams, "{e}");
    assert!(e.to_string().contains("maximum"), "{e}");
    assert_eq!(
        leader_metric(&cluster, "master_total_capacity_bytes").await,
        (1u64 << 30) as f64
    );

    // Per client: two, then refused; a re-mount of an owned name still works.
    a.mount_segment(spec("a2", 1 << 30)).await.unwrap();
    let e = a.mount_segment(spec("a3", 1 << 30)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidParams, "{e}");
    assert!(e.to_string().contains("--max-segments-per-client"), "{e}");
    a.mount_segment(spec("a2", 1 << 30)).await.unwrap();

    // In all: three, then refused for anyone.
    let b = MasterClient::new(&cluster.masters_arg()).unwrap();
    b.mount_segment(spec("b1", 1 << 30)).await.unwrap();
    let c = MasterClient::new(&cluster.masters_arg()).unwrap();
    let e = c.mount_segment(spec("c1", 1 << 30)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidParams, "{e}");
    assert!(e.to_string().contains("--max-segments "), "{e}");
    assert_eq!(
        leader_metric(&cluster, "master_total_capacity_bytes").await,
        (3u64 << 30) as f64
    );
}

/// Issue 11: every failed allocation ran an eviction round, so PutStarts of
/// sizes no segment could ever hold evicted most objects of a nearly empty
/// pool. They now fail with NO_AVAILABLE_HANDLE without asking for eviction
/// (`master_alloc_failures_total` counts only failures eviction could cure),
/// and every object stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_sizes_evict_nothing() {
    let cluster = LocalCluster::start(3, &[]).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let client = MasterClient::new(&cluster.masters_arg()).unwrap();
    client.mount_segment(spec("seg", 64 << 20)).await.unwrap();
    let one = pb::ReplicateConfig {
        replica_num: 1,
        ..Default::default()
    };
    for i in 0..10u32 {
        let key = format!("kept-{i}");
        client.put_start(&key, 4096, one.clone()).await.unwrap();
        client.put_end(&key, i).await.unwrap();
    }
    for size in [1u64 << 63, u64::MAX, (64 << 20) + 1, 300 << 20] {
        for _ in 0..10 {
            let e = client
                .put_start("impossible", size, one.clone())
                .await
                .unwrap_err();
            assert_eq!(e.code(), ErrorCode::NoAvailableHandle, "{e}");
        }
    }
    assert_eq!(
        leader_metric(&cluster, "master_alloc_failures_total").await,
        0.0
    );
    assert_eq!(
        leader_metric(&cluster, "master_evicted_key_count").await,
        0.0
    );
    for i in 0..10u32 {
        assert_eq!(
            client
                .get_replica_list(&format!("kept-{i}"))
                .await
                .unwrap()
                .checksum,
            i
        );
    }
}

/// Issue 11: heartbeats from made-up client ids were all recorded in leader
/// memory and never pruned (100 k ids: +22 MB, `master_active_clients`
/// 50,617). Only clients that own a segment are recorded now: a flood of
/// strangers leaves the count at the one real store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_from_strangers_are_not_recorded() {
    let mut cluster = LocalCluster::start(3, &[]).unwrap();
    let (_, leader_addr, _) = cluster.with_mounted_store("64mb").await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while leader_metric(&cluster, "master_active_clients").await != 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the store never counted as an active client"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mc = MasterClient::new(&leader_addr).unwrap();
    let mut raw = MasterClient::master(mc.channel(&leader_addr).unwrap());
    for i in 0..2_000u32 {
        let r = raw
            .heartbeat(pb::HeartbeatRequest {
                client_id: format!("stranger-{i}"),
                segment_ids: Vec::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status.unwrap().code, ErrorCode::Ok as i32);
    }
    // A stranger claiming a segment it does not own is told to re-mount,
    // and is not recorded either.
    let r = raw
        .heartbeat(pb::HeartbeatRequest {
            client_id: "stranger-claims".into(),
            segment_ids: vec![1],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.result, pb::HeartbeatResult::NeedRemount as i32);
    assert_eq!(leader_metric(&cluster, "master_active_clients").await, 1.0);
}
