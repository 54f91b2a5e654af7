//! Three masters in one process, talking real gRPC on loopback: elect, write,
//! stop the leader, check the new leader holds every committed object, restart
//! the old leader and check it catches up.

use std::time::{Duration, Instant};

use clap::Parser;
use crescent_client::MasterClient;
use crescent_master::config::MasterConfig;
use crescent_master::server::RunningMaster;
use crescent_proto::pb;
use tokio::net::TcpListener;

fn config(id: u64, port: u16, peers: &str, dir: &std::path::Path) -> MasterConfig {
    MasterConfig::parse_from([
        "crescent-master".to_string(),
        "--node-id".into(),
        id.to_string(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--data-dir".into(),
        dir.join(format!("m{id}")).display().to_string(),
        "--peers".into(),
        peers.to_string(),
        // Small, so the master that comes back must receive a snapshot.
        "--snapshot-logs".into(),
        "40".into(),
        "--http".into(),
        "127.0.0.1:0".into(),
    ])
}

async fn leader_of(nodes: &[Option<RunningMaster>], timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        for (i, n) in nodes.iter().enumerate() {
            if let Some(n) = n {
                if n.node.is_leader() {
                    return i;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader elected within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_write_fail_over_and_catch_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let ports: Vec<u16> = listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    let peers = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut nodes: Vec<Option<RunningMaster>> = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let cfg = config(i as u64 + 1, ports[i], &peers, dir.path());
        nodes.push(Some(RunningMaster::start(cfg, l).await.unwrap()));
    }
    let leader = leader_of(&nodes, Duration::from_secs(10)).await;

    let all = ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let client = MasterClient::new(&all).unwrap();
    let seg = client
        .mount_segment(pb::SegmentSpec {
            name: "seg".into(),
            endpoint: "127.0.0.1:1".into(),
            capacity: 1 << 30,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut acked = Vec::new();
    for i in 0..200 {
        let key = format!("key-{i}");
        client
            .put_start(
                &key,
                4096,
                pb::ReplicateConfig {
                    replica_num: 1,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        client.put_end(&key, i).await.unwrap();
        acked.push(key);
    }

    // Stop the leader; a new one must hold every acknowledged object.
    let old = nodes[leader].take().unwrap();
    let old_id = old.node.id;
    old.stop().await;
    let new_leader = leader_of(&nodes, Duration::from_secs(10)).await;
    assert_ne!(new_leader, leader);
    for (i, key) in acked.iter().enumerate() {
        let r = client.get_replica_list(key).await.unwrap();
        assert_eq!(r.replicas.len(), 1, "{key}");
        assert_eq!(r.checksum, i as u32);
        assert_eq!(r.replicas[0].segment_id, seg);
    }
    // More writes while the old leader is away.
    for i in 200..260 {
        let key = format!("key-{i}");
        client
            .put_start(
                &key,
                4096,
                pb::ReplicateConfig {
                    replica_num: 1,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        client.put_end(&key, i).await.unwrap();
    }

    // The old leader rejoins from its data dir and catches up.
    let listener = TcpListener::bind(("127.0.0.1", ports[leader]))
        .await
        .unwrap();
    let cfg = config(old_id, ports[leader], &peers, dir.path());
    nodes[leader] = Some(RunningMaster::start(cfg, listener).await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rejoined = nodes[leader].as_ref().unwrap();
        let count = rejoined.node.shared.sm.read().unwrap().state.objects.len();
        if count == 260 && !rejoined.node.is_leader() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "old leader did not catch up: {count} objects"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The leader purged the log it missed, so it was sent a snapshot.
    let m = nodes[leader].as_ref().unwrap().node.metrics();
    assert!(
        m.snapshot.is_some_and(|s| s.index > 100),
        "no snapshot installed: {:?}",
        m.snapshot
    );
    // Every node holds the same state.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let states: Vec<_> = nodes
            .iter()
            .map(|n| {
                n.as_ref()
                    .unwrap()
                    .node
                    .shared
                    .sm
                    .read()
                    .unwrap()
                    .state
                    .clone()
            })
            .collect();
        if states.windows(2).all(|w| w[0] == w[1]) {
            break;
        }
        assert!(Instant::now() < deadline, "replicas diverge");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}
