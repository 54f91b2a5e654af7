//! Attacks on the control plane, replayed against a real
//! token-mode cluster (three masters, one store, loopback): an outsider with
//! no token or a made-up one, and an engine holding only the client token,
//! try to wipe the keys, mount a fake segment, take over the membership,
//! move the leadership, forge Raft traffic and read the admin HTTP
//! endpoints. Every attempt is refused with UNAUTHENTICATED or
//! PERMISSION_DENIED (401/403 over HTTP) and changes nothing: same leader
//! and term, same members, same segments, every object still there.
//!
//! The data port's attacks (item 4) are in `data_plane_grants.rs`, and
//! segment ownership by key (item 3) in `liveness.rs`
//! (`only_the_owner_may_unmount_a_segment`).
//!
//! Needs `cargo build --bins` first (`make test` does it).

use std::time::Duration;

use crescent_client::{Client, ClientConfig, MasterClient};
use crescent_integration::{find_binary, http_request, LocalCluster};
use crescent_proto::pb;
use crescent_proto::ErrorCode;

use crate::common::{one_replica, value};

/// What an attack must leave unchanged.
#[derive(Debug, PartialEq)]
struct Snapshot {
    leader: u64,
    term: u64,
    members: Vec<(u64, bool)>,
    segments: u64,
    objects: u64,
}

async fn snapshot(cluster: &LocalCluster) -> Snapshot {
    let admin = cluster.admin_client().unwrap();
    let leader = admin.get_leader().await.unwrap();
    let status = admin.node_status(&leader.leader_addr).await.unwrap();
    Snapshot {
        leader: leader.leader_id,
        term: status.term,
        members: status.members.iter().map(|m| (m.id, m.voter)).collect(),
        segments: status.segment_count,
        objects: status.key_count,
    }
}

/// Every admin and peer call, each expected to fail with `code`.
async fn admin_and_peer_calls_fail(
    mc: &MasterClient,
    leader_addr: &str,
    code: tonic::Code,
    who: &str,
) {
    use crescent_raft::codec;
    use openraft::raft::{AppendEntriesRequest, VoteRequest};
    use openraft::Vote;

    let ch = || mc.channel(leader_addr).unwrap();
    let mut master = MasterClient::master(ch());
    let mut cluster = MasterClient::cluster(ch());
    let mut raft = pb::raft_service_client::RaftServiceClient::new(ch());
    let mut outcomes: Vec<(&str, Result<(), tonic::Status>)> = Vec::new();
    outcomes.push((
        "RemoveAll",
        master
            .remove_all(pb::RemoveAllRequest {
                header: Some(mc.header()),
                force: true,
            })
            .await
            .map(drop),
    ));
    outcomes.push((
        "RemoveByRegex",
        master
            .remove_by_regex(pb::RemoveByRegexRequest {
                header: Some(mc.header()),
                regex: ".*".into(),
                force: true,
            })
            .await
            .map(drop),
    ));
    outcomes.push((
        "AddMember",
        cluster
            .add_member(pb::AddMemberRequest {
                id: 99,
                addr: "127.0.0.1:1".into(),
                learner_only: false,
            })
            .await
            .map(drop),
    ));
    outcomes.push((
        "RemoveMember",
        cluster
            .remove_member(pb::RemoveMemberRequest { id: 2 })
            .await
            .map(drop),
    ));
    outcomes.push((
        "TransferLeader",
        cluster
            .transfer_leader(pb::TransferLeaderRequest { to: 2 })
            .await
            .map(drop),
    ));
    outcomes.push((
        "TimeoutNow",
        cluster
            .timeout_now(pb::TimeoutNowRequest {
                from: 99,
                term: 1,
                campaign_after_ms: 0,
            })
            .await
            .map(drop),
    ));
    // A heartbeat from a made-up leader 99 in a later term (it once deposed
    // the real leader on every master) and a vote request with a large term.
    let append: AppendEntriesRequest<crescent_raft::TypeConfig> = AppendEntriesRequest {
        vote: Vote::new_committed(1_000, 99),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    outcomes.push((
        "AppendEntries",
        raft.append_entries(crescent_raft::network::raft_request(
            codec::encode(&append).unwrap(),
        ))
        .await
        .map(drop),
    ));
    let vote: VoteRequest<crescent_raft::NodeId> = VoteRequest {
        vote: Vote::new(1_000, 99),
        last_log_id: None,
    };
    outcomes.push((
        "Vote",
        raft.vote(crescent_raft::network::raft_request(
            codec::encode(&vote).unwrap(),
        ))
        .await
        .map(drop),
    ));
    for (call, outcome) in outcomes {
        let status = outcome.expect_err(&format!("{who}: {call} must be refused"));
        assert_eq!(status.code(), code, "{who}: {call}: {status:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outsiders_and_clients_cannot_wipe_take_over_or_forge() {
    let mut cluster = LocalCluster::start_secured(3, &[]).unwrap();
    let (_, leader_addr, _) = cluster.with_mounted_store("128mb").await.unwrap();
    let leader = cluster
        .wait_for_leader(Duration::from_secs(10))
        .await
        .unwrap()
        .0;
    let leader_http = cluster.by_id(leader).unwrap().http.clone();
    let engine = Client::connect(ClientConfig {
        master: cluster.masters_arg(),
        token_file: cluster.client_token_file(),
        degrade_after: Duration::ZERO,
        ..Default::default()
    })
    .await
    .unwrap();
    let one = one_replica();
    for i in 0..20 {
        engine
            .put(&format!("acked-{i}"), &value(i), &one)
            .await
            .unwrap();
    }
    let before = snapshot(&cluster).await;
    assert_eq!(before.objects, 20);
    assert_eq!(before.segments, 1);

    // Outsiders: no token, and a made-up one.
    let wrong = cluster.root.join("wrong.token");
    std::fs::write(&wrong, "not-this-clusters-token-0123456789\n").unwrap();
    let nobody = cluster.client_with_token(None).unwrap();
    let stranger = cluster.client_with_token(Some(&wrong)).unwrap();
    for (who, mc) in [("no token", &nobody), ("wrong token", &stranger)] {
        admin_and_peer_calls_fail(mc, &leader_addr, tonic::Code::Unauthenticated, who).await;
        // Client calls too: a fake 1 TiB segment that would attract puts,
        // and a plain lookup.
        let mut master = MasterClient::master(mc.channel(&leader_addr).unwrap());
        let mount = master
            .mount_segment(pb::MountSegmentRequest {
                header: Some(mc.header()),
                segment: Some(pb::SegmentSpec {
                    name: "attacker".into(),
                    endpoint: "127.0.0.1:9".into(),
                    capacity: 1 << 40,
                    hostname: "attacker".into(),
                    shm_path: String::new(),
                    ..Default::default()
                }),
                segment_key: vec![7; 32],
            })
            .await
            .unwrap_err();
        assert_eq!(
            mount.code(),
            tonic::Code::Unauthenticated,
            "{who}: {mount:?}"
        );
        // Through the library: refused at once with PERMISSION_DENIED, not
        // retried until a deadline.
        let started = std::time::Instant::now();
        let err = mc
            .call_leader(|ch| async move {
                MasterClient::master(ch)
                    .exist(pb::ExistRequest {
                        key: "acked-0".into(),
                    })
                    .await
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::PermissionDenied, "{who}: {err}");
        assert!(started.elapsed() < Duration::from_secs(3), "{who}: retried");
    }
    // An engine's token does not grant administration or Raft.
    let engine_only = cluster.master_client().unwrap();
    admin_and_peer_calls_fail(
        &engine_only,
        &leader_addr,
        tonic::Code::PermissionDenied,
        "client token",
    )
    .await;

    // Admin HTTP: 401 without a token, 403 with the client token; the
    // engines' and Prometheus' endpoints stay open.
    let client_header = format!(
        "Bearer {}",
        std::fs::read_to_string(cluster.client_token_file().unwrap())
            .unwrap()
            .trim()
    );
    let admin_header = format!(
        "Bearer {}",
        std::fs::read_to_string(cluster.admin_token_file().unwrap())
            .unwrap()
            .trim()
    );
    for (method, path) in [
        ("GET", "/keys"),
        ("GET", "/segments"),
        ("GET", "/query_key?key=acked-0"),
        ("GET", "/get_all_keys"),
        ("GET", "/query_segment?segment=x"),
        ("POST", "/remove_all?force=true"),
    ] {
        let (code, _) = http_request(&leader_http, method, path, &[]).await.unwrap();
        assert_eq!(code, 401, "{method} {path} without a token");
        let (code, _) = http_request(
            &leader_http,
            method,
            path,
            &[("Authorization", &client_header)],
        )
        .await
        .unwrap();
        assert_eq!(code, 403, "{method} {path} with the client token");
    }
    for path in ["/metrics", "/health", "/get_all_segments"] {
        let (code, _) = http_request(&leader_http, "GET", path, &[]).await.unwrap();
        assert_eq!(code, 200, "{path} stays open");
    }
    let (code, body) = http_request(
        &leader_http,
        "GET",
        "/keys",
        &[("Authorization", &admin_header)],
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "the admin token reads /keys: {body}");
    assert!(body.contains("acked-0"), "{body}");

    // Nothing changed, every object is there with its bytes, and the
    // refusals were counted. (An election of its own on a loaded machine
    // may move the leader; none of the forged term 1000 may show.)
    let after = snapshot(&cluster).await;
    assert_eq!(after.members, before.members);
    assert_eq!(
        (after.segments, after.objects),
        (before.segments, before.objects)
    );
    assert!(
        after.term < 1_000 && [1, 2, 3].contains(&after.leader),
        "{after:?}"
    );
    for i in 0..20 {
        assert_eq!(engine.get(&format!("acked-{i}")).await.unwrap(), value(i));
    }
    let mut denied = 0.0;
    for m in &cluster.masters {
        let (_, metrics) = http_request(&m.http, "GET", "/metrics", &[]).await.unwrap();
        denied += metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix("master_auth_denied_total ")?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .expect("/metrics has master_auth_denied_total");
    }
    // 8 admin/peer calls, a mount and a lookup for each outsider, 8 for
    // the client token, 12 HTTP requests, summed over the masters.
    assert!(denied >= 40.0, "denied {denied}");

    // The admin token does administer: a leadership transfer goes through.
    let admin = cluster.admin_client().unwrap();
    let to = if leader == 1 { 2 } else { 1 };
    let moved = admin
        .call_leader(|ch| async move {
            MasterClient::cluster(ch)
                .transfer_leader(pb::TransferLeaderRequest { to })
                .await
        })
        .await
        .unwrap();
    assert_eq!(moved.new_leader_id, to);
}

/// A master refuses a vote request from a node outside its membership, even
/// with the cluster token: a removed master cannot depose the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vote_from_outside_the_membership_is_refused_even_with_the_cluster_token() {
    use crescent_raft::codec;
    use openraft::raft::VoteRequest;
    use openraft::Vote;

    let cluster = LocalCluster::start_secured(3, &[]).unwrap();
    let (_, leader_addr, term) = cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let peer = cluster
        .client_with_token(cluster.cluster_token_file().as_deref())
        .unwrap();
    let mut raft =
        pb::raft_service_client::RaftServiceClient::new(peer.channel(&leader_addr).unwrap());
    let vote: VoteRequest<crescent_raft::NodeId> = VoteRequest {
        vote: Vote::new(term + 1, 99),
        last_log_id: None,
    };
    let refused = raft
        .vote(crescent_raft::network::raft_request(
            codec::encode(&vote).unwrap(),
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("not a member"), "{refused:?}");
    let (_, _, term_after) = cluster
        .wait_for_leader(Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(term_after, term, "the forged vote cost the leader its term");
}

/// Without credentials a master does not start (unless told `--insecure`),
/// and the client programs say why they are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credentials_no_service() {
    let dir = tempfile::tempdir().unwrap();
    let master = find_binary("crescent-master").unwrap();
    let out = std::process::Command::new(&master)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.path().join("m"))
        .env_remove("CRESCENT_TOKEN_FILE")
        .env_remove("CRESCENT_ADMIN_TOKEN_FILE")
        .env_remove("CRESCENT_CLUSTER_TOKEN_FILE")
        .env_remove("CRESCENT_INSECURE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no credentials"), "{stderr}");

    // A token file that is too short is refused by name.
    let short = dir.path().join("short.token");
    std::fs::write(&short, "abc").unwrap();
    let out = std::process::Command::new(&master)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.path().join("m2"))
        .arg("--token-file")
        .arg(&short)
        .arg("--admin-token-file")
        .arg(&short)
        .arg("--cluster-token-file")
        .arg(&short)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("short.token") && stderr.contains("at least"),
        "{stderr}"
    );

    // crescentctl without a token against a token-mode cluster.
    let cluster = LocalCluster::start_secured(1, &[]).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let ctl = find_binary("crescentctl").unwrap();
    let out = std::process::Command::new(&ctl)
        .args(["--master", &cluster.masters_arg(), "exists", "k"])
        .env_remove("CRESCENT_TOKEN_FILE")
        .env_remove("CRESCENT_ADMIN_TOKEN_FILE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("PERMISSION_DENIED"), "{stderr}");
    // With the token it is answered: the key does not exist (exit 2).
    let out = std::process::Command::new(&ctl)
        .args([
            "--master",
            &cluster.masters_arg(),
            "exists",
            "k",
            "--token-file",
        ])
        .arg(cluster.client_token_file().unwrap())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A token rotated without downtime: the masters' file lists the new token
/// first and the old second, SIGHUP; clients move to the new token; the old
/// line goes, SIGHUP. Throughout, the store keeps its segment and a holder
/// of whichever token is valid is served; afterwards the old token is
/// refused. A broken file on SIGHUP leaves the tokens in use alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_rotates_without_downtime_on_sighup() {
    let mut cluster = LocalCluster::start_secured(3, &[]).unwrap();
    let (_, leader_addr, _) = cluster.with_mounted_store("64mb").await.unwrap();
    let shared = cluster.client_token_file().unwrap();
    let old = std::fs::read_to_string(&shared).unwrap().trim().to_string();
    let new = crescent_auth::generate_token();
    let old_file = cluster.root.join("old.token");
    let new_file = cluster.root.join("new.token");
    std::fs::write(&old_file, &old).unwrap();
    std::fs::write(&new_file, &new).unwrap();
    let old_client = cluster.client_with_token(Some(&old_file)).unwrap();
    let new_client = cluster.client_with_token(Some(&new_file)).unwrap();
    async fn lookup(mc: &MasterClient) -> Result<(), ErrorCode> {
        mc.call_leader(|ch| async move {
            MasterClient::master(ch)
                .exist(pb::ExistRequest { key: "k".into() })
                .await
        })
        .await
        .map(drop)
        .map_err(|e| e.code())
    }
    assert_eq!(lookup(&old_client).await, Ok(()));
    assert_eq!(lookup(&new_client).await, Err(ErrorCode::PermissionDenied));

    // Both accepted; the store (same file) now presents the new one.
    std::fs::write(&shared, format!("{new}\n{old}\n")).unwrap();
    cluster.hangup_all().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while lookup(&new_client).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "new token never accepted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lookup(&old_client).await, Ok(()));

    // Only the new one.
    std::fs::write(&shared, format!("{new}\n")).unwrap();
    cluster.hangup_all().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while lookup(&old_client).await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "old token still accepted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lookup(&old_client).await, Err(ErrorCode::PermissionDenied));
    assert_eq!(lookup(&new_client).await, Ok(()));

    // A broken file is refused on SIGHUP (each master says so); the new
    // token keeps working.
    std::fs::write(&shared, "short\n").unwrap();
    cluster.hangup_all().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !(1..=3).all(|id| cluster.log_tail(id, 200).contains("tokens not reloaded")) {
        assert!(
            std::time::Instant::now() < deadline,
            "no master logged the refused reload"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lookup(&new_client).await, Ok(()));
    assert!(cluster.masters.iter_mut().all(|m| m.is_running()));

    // The store heartbeated with the new token throughout: after more than
    // the client TTL (10 s) its segment is still mounted and serves a put.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let engine = Client::connect(ClientConfig {
        master: cluster.masters_arg(),
        token_file: Some(new_file.clone()),
        degrade_after: Duration::ZERO,
        ..Default::default()
    })
    .await
    .unwrap();
    let one = one_replica();
    engine.put("after-rotation", b"bytes", &one).await.unwrap();
    assert_eq!(engine.get("after-rotation").await.unwrap(), b"bytes");
    let _ = leader_addr;
}

/// A client whose token the masters refuse does not fall back to local-only
/// mode (where its puts would "succeed" in its own memory): the masters
/// answer, so the put fails with PERMISSION_DENIED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_is_an_error_not_an_outage() {
    let cluster = LocalCluster::start_secured(1, &[]).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let wrong = cluster.root.join("wrong.token");
    std::fs::write(&wrong, "not-this-clusters-token-0123456789\n").unwrap();
    let engine = Client::connect(ClientConfig {
        master: cluster.masters_arg(),
        token_file: Some(wrong),
        degrade_after: Duration::from_secs(1),
        local_buffer_size: 16 << 20,
        ..Default::default()
    })
    .await
    .unwrap();
    // Longer than degrade_after plus a probe interval.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let one = one_replica();
    let err = engine.put("refused", b"bytes", &one).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
}

/// Writing to etcd is not enough to join a token-mode cluster: a master
/// registered without a tag signed with the cluster token is never added
/// (and so never receives the cluster token in the leader's messages).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_registered_in_etcd_without_a_valid_tag_is_not_added() {
    use crescent_integration::{LocalEtcd, Security};
    let etcd = LocalEtcd::start().unwrap();
    let cluster =
        LocalCluster::start_with_etcd_as(3, &etcd.endpoint, "sec", &[], Security::Tokens).unwrap();
    let admin = cluster.admin_client().unwrap();
    let voters = |s: &pb::GetStatusResponse| s.members.iter().filter(|m| m.voter).count();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(l) = admin.get_leader().await {
            if let Ok(s) = admin.node_status(&l.leader_addr).await {
                if voters(&s) == 3 {
                    break;
                }
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "3 voters never formed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut kv = etcd_client::Client::connect([etcd.endpoint.as_str()], None)
        .await
        .unwrap();
    kv.put("/crescent/sec/masters/98", "127.0.0.1:1", None)
        .await
        .unwrap();
    kv.put(
        "/crescent/sec/masters/99",
        format!("127.0.0.1:1 {}", "0".repeat(64)),
        None,
    )
    .await
    .unwrap();
    // The leader reads the registrations every 500 ms.
    let (leader, addr, _) = cluster
        .wait_for_leader(Duration::from_secs(10))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cluster
        .log_tail(leader, 400)
        .contains("without a valid tag")
    {
        assert!(std::time::Instant::now() < deadline, "no refusal logged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = admin.node_status(&addr).await.unwrap();
    let ids: Vec<u64> = status.members.iter().map(|m| m.id).collect();
    assert_eq!(ids, [1, 2, 3], "a forged registration became a member");
}
