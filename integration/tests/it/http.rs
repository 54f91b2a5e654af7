//! The masters' admin/metrics HTTP: Prometheus names operators already graph,
//! health, leader, admin reads and the guarded remove_all.

use crescent_client::ReplicateConfig;
use crescent_integration::{http_request, LocalCluster};

use crate::common::connect_client;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_health_and_admin_endpoints() {
    let mut cluster = LocalCluster::start(3, &["--admin-token".into(), "s3cret".into()]).unwrap();
    let (leader, _, _) = cluster.with_mounted_store("64mb").await.unwrap();
    let client = connect_client(&cluster).await;
    for i in 0..5 {
        client
            .put(&format!("web/{i}"), b"hello", &ReplicateConfig::default())
            .await
            .unwrap();
    }
    client.get("web/0").await.unwrap();
    let http = cluster.by_id(leader).unwrap().http.clone();

    let (code, body) = http_request(&http, "GET", "/metrics", &[]).await.unwrap();
    assert_eq!(code, 200);
    for name in [
        "master_key_count 5",
        "master_allocated_bytes",
        "master_total_capacity_bytes",
        "master_active_clients",
        "master_put_start_requests_total 5",
        "master_get_replica_list_requests_total",
        "master_evicted_key_count 0",
        "segment_allocated_bytes{segment=",
        "raft_term",
        "raft_role{role=\"leader\"} 1",
        "raft_follower_lag{follower=",
        "raft_commit_index",
        "raft_proposal_seconds_bucket",
    ] {
        assert!(body.contains(name), "/metrics lacks {name}:\n{body}");
    }

    let (code, body) = http_request(&http, "GET", "/health", &[]).await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("\"role\":\"leader\"") && body.contains("\"quorum\":true"),
        "{body}"
    );
    let follower = cluster
        .masters
        .iter()
        .find(|m| m.id != leader)
        .unwrap()
        .http
        .clone();
    let (code, body) = http_request(&follower, "GET", "/leader", &[])
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert!(body.contains(&format!("\"leader_id\":{leader}")), "{body}");

    let (code, body) = http_request(&http, "GET", "/query_key?key=web/1", &[])
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert!(
        body.contains("\"size\":5") && body.contains("\"complete\":true"),
        "{body}"
    );
    let (code, _) = http_request(&http, "GET", "/query_key?key=nope", &[])
        .await
        .unwrap();
    assert_eq!(code, 404);
    let (code, body) = http_request(&http, "GET", "/segments", &[]).await.unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("\"capacity\""), "{body}");
    // Mooncake's names and plain-text formats.
    let (code, body) = http_request(&http, "GET", "/get_all_segments", &[])
        .await
        .unwrap();
    assert_eq!(code, 200);
    let segment = body.lines().next().unwrap_or_default().to_string();
    assert_eq!(body.lines().count(), 1, "one mounted segment: {body:?}");
    assert!(!segment.is_empty(), "{body:?}");
    let (code, body) = http_request(&http, "GET", "/get_all_keys", &[])
        .await
        .unwrap();
    assert_eq!(code, 200);
    let mut listed: Vec<&str> = body.lines().collect();
    listed.sort();
    assert_eq!(listed, ["web/0", "web/1", "web/2", "web/3", "web/4"]);
    let (code, body) = http_request(
        &http,
        "GET",
        &format!("/query_segment?segment={segment}"),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(code, 200);
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(lines[0], segment, "{body}");
    assert!(
        lines[1].starts_with("Used(bytes): ") && lines[1] != "Used(bytes): 0",
        "{body}"
    );
    assert_eq!(lines[2], format!("Capacity(bytes): {}", 64 << 20), "{body}");
    let (code, _) = http_request(&http, "GET", "/query_segment?segment=nope", &[])
        .await
        .unwrap();
    assert_eq!(code, 404);

    let (code, body) = http_request(&http, "GET", "/keys?prefix=web/&limit=2", &[])
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert!(
        body.contains("web/0") && body.contains("web/1") && body.contains("\"next\":\"web/1\""),
        "{body}"
    );
    let (_, body) = http_request(&http, "GET", "/keys?prefix=web/&limit=2&after=web/1", &[])
        .await
        .unwrap();
    assert!(
        body.contains("web/2") && !body.contains("web/1\""),
        "{body}"
    );

    let (code, _) = http_request(&http, "POST", "/remove_all?force=true", &[])
        .await
        .unwrap();
    assert_eq!(code, 401, "remove_all must need the admin token");
    assert!(client.exists("web/3").await.unwrap());
    let (code, body) = http_request(
        &http,
        "POST",
        "/remove_all?force=true",
        &[("Authorization", "Bearer s3cret")],
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"removed\":5"), "{body}");
    assert!(!client.exists("web/3").await.unwrap());

    // The store's own metrics.
    let store_http = cluster.stores[0].http.clone();
    let (code, body) = http_request(&store_http, "GET", "/metrics", &[])
        .await
        .unwrap();
    assert_eq!(code, 200);
    for name in [
        "store_bytes_read_total",
        "store_bytes_written_total",
        "store_segment_mounted 1",
        "store_transfer_seconds_count",
    ] {
        assert!(body.contains(name), "store /metrics lacks {name}:\n{body}");
    }
    let (code, body) = http_request(&store_http, "GET", "/health", &[])
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("\"mounted\":true"), "{body}");
}

/// `/health` on a follower: 200 while it follows a leader (the Kubernetes
/// readiness probe and the PodDisruptionBudget count on it), 503
/// `no_quorum` once it has lost its leader and cannot elect one, and 200
/// again when a quorum is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_health_follows_the_quorum() {
    let mut cluster = LocalCluster::start(3, &[]).unwrap();
    let (leader, _, _) = cluster
        .wait_for_leader(std::time::Duration::from_secs(15))
        .await
        .unwrap();
    let followers: Vec<(u64, String)> = cluster
        .masters
        .iter()
        .filter(|m| m.id != leader)
        .map(|m| (m.id, m.http.clone()))
        .collect();
    for (id, http) in &followers {
        let body = wait_health(http, 200, |b| {
            b["role"] == "follower" && b["leader_id"] == leader && b["quorum"] == true
        })
        .await;
        assert_eq!(body["id"], *id, "{body}");
        assert_eq!(body["status"], "serving", "{body}");
    }

    // Only one master left: it cannot elect anyone.
    let (survivor, survivor_http) = followers[0].clone();
    cluster.kill(leader).unwrap();
    cluster.kill(followers[1].0).unwrap();
    let body = wait_health(&survivor_http, 503, |b| b["status"] == "no_quorum").await;
    assert_eq!(body["quorum"], false, "{body}");

    // A second master back: a quorum, a leader, and health again.
    cluster.restart(followers[1].0).unwrap();
    let body = wait_health(&survivor_http, 200, |b| b["status"] == "serving").await;
    assert_eq!(body["id"], survivor, "{body}");
}

/// Polls `/health` at `http` until it answers `code` with a body that
/// satisfies `ok`; returns that body.
async fn wait_health(
    http: &str,
    code: u16,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut last = None;
    loop {
        if let Ok((c, body)) = http_request(http, "GET", "/health", &[]).await {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if c == code && ok(&v) {
                return v;
            }
            last = Some((c, body));
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{http}/health never answered {code} as expected; last: {last:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
