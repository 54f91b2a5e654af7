//! Store liveness against real processes: a store that stops heartbeating
//! has its segment expired, is told NEED_REMOUNT when it comes back and
//! mounts again; a segment whose store never comes back is removed once its
//! grace (`--expired-segment-grace`) has passed; only a segment's owner may
//! unmount it. Needs `cargo build --bins` first (`make test` does it).

use crescent_auth::capability::SegmentKey;
use std::time::{Duration, Instant};

use crescent_client::MasterClient;
use crescent_integration::{http_request, LocalCluster};
use crescent_proto::pb;
use crescent_proto::ErrorCode;

use crate::common::{connect_client, one_replica};

/// Live segments as the current leader counts them, or None while there is
/// no leader to ask.
async fn live_segments(mc: &MasterClient) -> Option<u64> {
    let leader = mc.get_leader().await.ok()?;
    Some(
        mc.node_status(&leader.leader_addr)
            .await
            .ok()?
            .segment_count,
    )
}

/// Polls until the leader counts `n` live segments.
async fn wait_live_segments(mc: &MasterClient, n: u64, within: Duration, why: &str) {
    let deadline = Instant::now() + within;
    loop {
        let live = live_segments(mc).await;
        if live == Some(n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{why}: leader counts {live:?} live segments, not {n}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every segment the leader holds (live or expired), from its `/segments`.
async fn listed_segments(cluster: &LocalCluster) -> Vec<serde_json::Value> {
    let Ok((leader, _, _)) = cluster.wait_for_leader(Duration::from_secs(15)).await else {
        return Vec::new();
    };
    let http = cluster
        .masters
        .iter()
        .find(|m| m.id == leader)
        .map(|m| m.http.clone())
        .unwrap_or_default();
    let Ok((200, body)) = http_request(&http, "GET", "/segments", &[]).await else {
        return Vec::new();
    };
    serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["segments"].as_array().cloned())
        .unwrap_or_default()
}

fn log_of(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A store that stops heartbeating (SIGSTOP, so it keeps its socket and
/// memory) past the client TTL has its segment expired; when it resumes, its
/// next heartbeat is answered NEED_REMOUNT, it mounts again and serves puts.
///
/// Regression test for dadcdba (found by the chaos suite): the segment is
/// expired, not unmounted, so the objects it holds survive the outage: while
/// expired a get answers REPLICAS_UNAVAILABLE, and after the re-mount it
/// returns the bytes. Before, the leader unmounted the segment and the
/// acknowledged object was gone (OBJECT_NOT_FOUND) though its store was alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_missed_its_heartbeats_is_told_to_remount_and_does() {
    let mut cluster = LocalCluster::start(3, &["--client-ttl".into(), "2s".into()]).unwrap();
    cluster.with_mounted_store("64mb").await.unwrap();
    let mc = MasterClient::new(&cluster.masters_arg()).unwrap();
    let before = listed_segments(&cluster).await;
    assert_eq!(before.len(), 1, "{before:?}");
    let client = connect_client(&cluster).await;
    let cfg = one_replica();
    let kept: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    client.put("kept", &kept, &cfg).await.unwrap();

    cluster.stores[0].pause().unwrap();
    wait_live_segments(
        &mc,
        0,
        Duration::from_secs(30),
        "a paused store's segment never expired",
    )
    .await;
    let e = client.get("kept").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::ReplicasUnavailable, "{e}");
    cluster.stores[0].resume().unwrap();
    wait_live_segments(
        &mc,
        1,
        Duration::from_secs(30),
        "the resumed store never mounted again",
    )
    .await;
    let log = log_of(&cluster.stores[0].log_path);
    assert!(
        log.contains("master asked for a re-mount"),
        "the store re-mounted without being told NEED_REMOUNT:\n{log}"
    );
    // Still one segment under the store's name, live again.
    let after = listed_segments(&cluster).await;
    let live: Vec<_> = after
        .iter()
        .filter(|s| s["expired_ms"].as_u64().unwrap_or(0) == 0)
        .collect();
    assert_eq!(live.len(), 1, "{after:?}");
    assert_eq!(live[0]["name"], before[0]["name"], "{after:?}");

    // The object acknowledged before the outage is back, bytes intact...
    assert_eq!(client.get("kept").await.unwrap(), kept);
    // ...and the store takes new objects again.
    client.put("after-remount", b"fresh", &cfg).await.unwrap();
    assert_eq!(client.get("after-remount").await.unwrap(), b"fresh");
}

/// A store that dies and never comes back: its segment expires after the
/// client TTL (still listed, no longer live, so its replicas are not
/// offered), then is removed for good once the grace has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_segment_is_removed_after_its_grace() {
    let mut cluster = LocalCluster::start(
        3,
        &[
            "--client-ttl".into(),
            "2s".into(),
            // Long enough that "expired but still listed" is seen reliably
            // after the expiry is noticed (polled every 100 ms).
            "--expired-segment-grace".into(),
            "15s".into(),
        ],
    )
    .unwrap();
    cluster.with_mounted_store("64mb").await.unwrap();
    let mc = MasterClient::new(&cluster.masters_arg()).unwrap();
    let name = listed_segments(&cluster).await[0]["name"].clone();

    cluster.stores[0].kill();
    wait_live_segments(
        &mc,
        0,
        Duration::from_secs(30),
        "a dead store's segment never expired",
    )
    .await;
    let listed = listed_segments(&cluster).await;
    assert!(
        listed
            .iter()
            .any(|s| s["name"] == name && s["expired_ms"].as_u64().unwrap_or(0) > 0),
        "an expired segment is kept (marked expired) during its grace: {listed:?}"
    );

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = listed_segments(&cluster).await;
        if !listed.iter().any(|s| s["name"] == name) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the expired segment was never removed: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (leader, _, _) = cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let log = cluster.log_tail(leader, 400);
    assert!(
        log.contains("expired segment not re-mounted within its grace; removed"),
        "{log}"
    );
}

/// Only the client that mounted a segment may unmount it: another client
/// is refused with PERMISSION_DENIED without naming the owner, and nothing
/// changes; so is the owner itself without the key it mounted with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_may_unmount_a_segment() {
    let cluster = LocalCluster::start(3, &[]).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let owner = MasterClient::new(&cluster.masters_arg()).unwrap();
    let other = MasterClient::new(&cluster.masters_arg()).unwrap();
    assert_ne!(owner.client_id(), other.client_id());
    let key = SegmentKey::generate();
    let spec = pb::SegmentSpec {
        name: "owned".into(),
        endpoint: "127.0.0.1:1".into(),
        capacity: 1 << 30,
        ..Default::default()
    };
    let id = owner.mount_segment(spec.clone(), &key).await.unwrap();

    // Another client, even with the right key, and the owner's id with
    // another key: refused, and the refusal does not name the owner.
    for (who, err) in [
        (
            "another client",
            other.unmount_segment(id, &key).await.unwrap_err(),
        ),
        (
            "another key",
            owner
                .unmount_segment(id, &SegmentKey::generate())
                .await
                .unwrap_err(),
        ),
        (
            "a re-mount with another key",
            owner
                .mount_segment(spec.clone(), &SegmentKey::generate())
                .await
                .unwrap_err(),
        ),
    ] {
        assert_eq!(err.code(), ErrorCode::PermissionDenied, "{who}: {err}");
        assert!(
            !err.to_string().contains(owner.client_id()),
            "{who}: the refusal names the owner: {err}"
        );
    }
    // Polled, not read once: right after start-up the node named leader may
    // still change, and a single read of a stale one failed this test once.
    wait_live_segments(
        &owner,
        1,
        Duration::from_secs(10),
        "a refused unmount changed nothing",
    )
    .await;
    let err = other.unmount_segment(id + 1000, &key).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::SegmentNotFound, "{err}");

    // The owner's re-mount with its key is idempotent; its unmount works.
    assert_eq!(owner.mount_segment(spec, &key).await.unwrap(), id);
    owner.unmount_segment(id, &key).await.unwrap();
    wait_live_segments(&owner, 0, Duration::from_secs(10), "the owner's unmount").await;
}
