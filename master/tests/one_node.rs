//! One master in this process, over real gRPC on loopback: a single-object
//! RPC is its batch core with one item, so what the core counts, checks and
//! switches on applies to both (issue 14: BatchExist did not count
//! `exist_requests`, only single Remove counted `remove_requests`, and
//! `--unsafe-ack-before-commit` acted on single PutEnd only).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::Parser;
use crescent_client::MasterClient;
use crescent_master::config::MasterConfig;
use crescent_master::server::RunningMaster;
use crescent_proto::pb;
use crescent_proto::ErrorCode;
use tokio::net::TcpListener;

async fn one_master(dir: &std::path::Path, extra: &[&str]) -> (RunningMaster, MasterClient) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let args = [
        "crescent-master",
        "--node-id",
        "1",
        "--insecure",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
        &dir.join("m1").display().to_string(),
        "--http",
        "127.0.0.1:0",
    ]
    .into_iter()
    .map(String::from)
    .chain(extra.iter().map(|s| s.to_string()))
    .collect::<Vec<_>>();
    let master = RunningMaster::start(MasterConfig::parse_from(args), listener)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !master.node.is_leader() {
        assert!(Instant::now() < deadline, "a lone master did not lead");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let client = MasterClient::new(&master.addr.to_string()).unwrap();
    client
        .mount_segment(
            pb::SegmentSpec {
                name: "seg".into(),
                endpoint: "127.0.0.1:1".into(),
                capacity: 1 << 30,
                ..Default::default()
            },
            &crescent_auth::capability::SegmentKey::generate(),
        )
        .await
        .unwrap();
    (master, client)
}

fn one_replica() -> pb::ReplicateConfig {
    pb::ReplicateConfig {
        replica_num: 1,
        ..Default::default()
    }
}

fn start_items(keys: &[&str]) -> Vec<pb::PutStartItem> {
    keys.iter()
        .map(|k| pb::PutStartItem {
            key: k.to_string(),
            size: 64,
            put_id: 0,
        })
        .collect()
}

fn end_items(keys: &[&str]) -> Vec<pb::PutEndItem> {
    keys.iter()
        .map(|k| pb::PutEndItem {
            key: k.to_string(),
            checksum: 7,
            put_id: 0,
        })
        .collect()
}

fn owned(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_and_batch_rpcs_are_counted_alike() {
    let dir = tempfile::TempDir::new().unwrap();
    let (master, client) = one_master(dir.path(), &[]).await;
    let counters = &master.node.counters;
    let count = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);

    client.put_start("a", 64, one_replica()).await.unwrap();
    client.put_end("a", 7).await.unwrap();
    client
        .batch_put_start(start_items(&["b", "c", "d"]), one_replica())
        .await
        .unwrap();
    client
        .batch_put_end(end_items(&["b", "c", "d"]))
        .await
        .unwrap();
    assert_eq!(count(&counters.put_start_requests), 4);
    assert_eq!(count(&counters.put_end_requests), 4);

    assert!(client.exists("a").await.unwrap());
    let found = client.batch_exists(owned(&["b", "c", "x"])).await.unwrap();
    assert_eq!(
        found.iter().map(|r| r.exists).collect::<Vec<_>>(),
        [true, true, false]
    );
    assert_eq!(count(&counters.exist_requests), 4);

    client.get_replica_list("a").await.unwrap();
    client
        .batch_get_replica_list(owned(&["b", "c"]))
        .await
        .unwrap();
    // Exist is its own count, not a lookup's.
    assert_eq!(count(&counters.get_replica_list_requests), 3);

    client.remove("a", true).await.unwrap();
    client.batch_remove(owned(&["b", "c"]), true).await.unwrap();
    assert_eq!(count(&counters.remove_requests), 3);

    // A single key's error names no item; a batch's names the item.
    let long = "k".repeat(master.node.config.max_key_len + 1);
    let single = client.remove(&long, true).await.unwrap_err().to_string();
    assert!(single.contains("exceeds the limit"), "{single}");
    assert!(!single.contains("item 0"), "{single}");
    let batch = client
        .batch_remove(vec!["d".into(), long], true)
        .await
        .unwrap_err()
        .to_string();
    assert!(batch.contains("item 1: "), "{batch}");
    // The refused batch removed nothing, not even its valid key.
    assert!(client.exists("d").await.unwrap());
}

/// The test-only switch acknowledges a PutEnd before its entry is even
/// proposed, so a PutEnd of a put that never started is answered OK; the
/// batch form is the same core and is switched the same way. Without the
/// switch both are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unsafe_early_ack_switch_acts_on_batches_too() {
    let dir = tempfile::TempDir::new().unwrap();
    let (_safe_master, safe) = one_master(&dir.path().join("safe"), &[]).await;
    let refused = safe.put_end("never-started", 7).await.unwrap_err();
    assert_ne!(refused.code(), ErrorCode::RpcFail, "{refused}");
    let statuses = safe
        .batch_put_end(end_items(&["never-1", "never-2"]))
        .await
        .unwrap();
    assert!(statuses.iter().all(|s| !s.is_ok()), "{statuses:?}");

    let (_unsafe_master, unsafe_client) =
        one_master(&dir.path().join("unsafe"), &["--unsafe-ack-before-commit"]).await;
    unsafe_client.put_end("never-started", 7).await.unwrap();
    let statuses = unsafe_client
        .batch_put_end(end_items(&["never-1", "never-2"]))
        .await
        .unwrap();
    assert!(statuses.iter().all(|s| s.is_ok()), "{statuses:?}");
}
