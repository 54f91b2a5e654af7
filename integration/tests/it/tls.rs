//! Mutual TLS against real processes: three masters, a
//! store and the clients all speak TLS with certificates `crescentctl certs
//! init` wrote. Raft, mounts, puts and gets work; a client in clear text, a
//! client without a certificate, a client whose certificate another CA
//! signed and a client that trusts another CA are all turned away at the
//! handshake, and the cluster is unchanged afterwards. The admin HTTP port
//! serves HTTPS. etcd over TLS for masters, stores, engines and crescentctl.
//! A certificate rotation to a new CA by SIGHUP, with the
//! cluster serving throughout. The stores' data ports (and a client's
//! embedded segment) speak only mutual TLS: bytes move over it, clear text
//! and strangers get nothing.
//!
//! Needs `cargo build --bins` first (`make test` does it).

use std::time::Duration;

use crescent_auth::tls::{TlsFiles, CA_CERT_FILE};
use crescent_client::{Client, ClientConfig, MasterClient, ReplicateConfig};
use crescent_integration::{
    find_binary, tls_flags, write_certs, LocalCluster, LocalEtcd, Security,
};
use crescent_proto::{pb, ErrorCode};
use crescent_store::protocol::{Grant, Op, Request};
use crescent_store::{TcpTransport, TransferError};

use crate::common::value;

/// A master client that gives up after 5 s: a refusal at the handshake must
/// come back at once as PERMISSION_DENIED, not as "no master reachable"
/// when the deadline passes (that would send an engine local-only).
/// An engine's configuration for `masters`: presenting `token` and the
/// TLS files `tls` (all three), never local-only, data-port TLS as
/// `data_tls` says.
fn engine_config(
    masters: String,
    token: Option<std::path::PathBuf>,
    tls: &TlsFiles,
    data_tls: bool,
) -> ClientConfig {
    ClientConfig {
        master: masters,
        token_file: token,
        tls_cert: Some(tls.cert.clone()),
        tls_key: Some(tls.key.clone()),
        tls_ca: Some(tls.ca.clone()),
        data_tls,
        degrade_after: Duration::ZERO,
        ..ClientConfig::default()
    }
}

fn impatient(client: MasterClient) -> MasterClient {
    let mut client = client;
    client.policy.deadline = Duration::from_secs(5);
    client
}

/// `crescentctl --master MASTER... get KEY` with the client certificate
/// under `certs`: its stdout, after asserting it succeeded.
fn ctl_get(
    master: &[&str],
    key: &str,
    token: &std::path::Path,
    certs: &std::path::Path,
) -> Vec<u8> {
    let out = std::process::Command::new(find_binary("crescentctl").unwrap())
        .arg("--master")
        .args(master)
        .args(["get", key])
        .arg("--token-file")
        .arg(token)
        .args(tls_flags(certs, false))
        .arg("--data-tls")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

async fn refused_by_tls(client: &MasterClient, who: &str) {
    let started = std::time::Instant::now();
    let err = client
        .get_leader()
        .await
        .expect_err(&format!("{who} must be refused"));
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{who}: {err}");
    assert!(err.to_string().contains("TLS"), "{who}: {err}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{who}: refused only at the deadline"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_serves_only_clients_with_a_certificate_its_ca_signed() {
    let mut cluster = LocalCluster::start_as(3, &[], Security::TokensAndTls).unwrap();
    // A leader means Raft runs over TLS; a mounted segment means the store
    // reached the leader over TLS.
    let (_, leader_addr, term) = cluster.with_mounted_store("64mb").await.unwrap();
    let certs = cluster.certs.clone().unwrap();
    let token = cluster.client_token_file().unwrap();

    let client_tls = TlsFiles::client_in(&certs).unwrap();
    let engine = Client::connect(engine_config(
        cluster.masters_arg(),
        Some(token.clone()),
        &client_tls,
        true,
    ))
    .await
    .unwrap();
    let one = ReplicateConfig::default();
    for i in 0..8 {
        engine
            .put(&format!("tls-{i}"), &value(i), &one)
            .await
            .unwrap();
    }
    for i in 0..8 {
        assert_eq!(engine.get(&format!("tls-{i}")).await.unwrap(), value(i));
    }

    let bearer = crescent_auth::BearerToken::from_file(&token).unwrap();
    // 1. Clear text, with a valid token.
    let plain = impatient(
        MasterClient::new(&cluster.masters_arg())
            .unwrap()
            .with_token(bearer.clone()),
    );
    refused_by_tls(&plain, "a clear-text client").await;

    // 2. Another CA's client: it does not trust the masters, they do not
    //    trust its certificate.
    let foreign = tempfile::tempdir().unwrap();
    write_certs(foreign.path()).unwrap();
    let stranger = impatient(
        MasterClient::new(&cluster.masters_arg())
            .unwrap()
            .with_token(bearer.clone())
            .with_tls(Some(&TlsFiles::client_in(foreign.path()).unwrap())),
    );
    refused_by_tls(&stranger, "a client of another CA").await;

    // 3. Trusts the right CA but presents another CA's certificate: the
    //    masters refuse it (they, not the client, decide here).
    let forged = TlsFiles::read(
        &foreign.path().join("client.pem"),
        &foreign.path().join("client.key"),
        &certs.join(CA_CERT_FILE),
    )
    .unwrap();
    let impostor = impatient(
        MasterClient::new(&cluster.masters_arg())
            .unwrap()
            .with_token(bearer.clone())
            .with_tls(Some(&forged)),
    );
    refused_by_tls(&impostor, "a certificate of another CA").await;

    // 4. Trusts the right CA and presents no certificate at all.
    let ca = std::fs::read(certs.join(CA_CERT_FILE)).unwrap();
    let anonymous = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca));
    let channel = crescent_auth::tls::endpoint(&leader_addr, Some(&anonymous))
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(2))
        .connect()
        .await;
    match channel {
        // The handshake itself may fail, or the first call after it
        // (TLS 1.3 reports a refused client certificate after the
        // client's side of the handshake is done).
        Err(_) => {}
        Ok(ch) => {
            let mut raw = pb::cluster_service_client::ClusterServiceClient::new(bearer.wrap(ch));
            raw.get_leader(pb::GetLeaderRequest {})
                .await
                .expect_err("a client without a certificate must be refused");
        }
    }

    // 5. crescentctl: with the client certificate it is served; without
    //    TLS flags it is not.
    let ctl = find_binary("crescentctl").unwrap();
    assert_eq!(
        ctl_get(&[&cluster.masters_arg()], "tls-3", &token, &certs),
        value(3)
    );
    let out = std::process::Command::new(&ctl)
        .args(["--master", &cluster.masters_arg(), "leader"])
        .arg("--token-file")
        .arg(&token)
        .env_remove("CRESCENT_TLS_CERT")
        .env_remove("CRESCENT_TLS_KEY")
        .env_remove("CRESCENT_TLS_CA")
        .output()
        .unwrap();
    assert!(!out.status.success(), "clear-text crescentctl was served");

    // 6. The admin HTTP port serves HTTPS with the node certificate: a
    //    client trusting the CA reads /metrics (no client certificate is
    //    asked for); clear text and a client trusting another CA get nothing.
    let http = cluster.masters[0].http.clone();
    let curl = |args: &[&str]| {
        std::process::Command::new("curl")
            .args(["-sS", "--max-time", "5"])
            .args(args)
            .output()
            .expect("curl (scripts/install-deps.sh installs it)")
    };
    let ca_path = certs.join(CA_CERT_FILE);
    let metrics = format!("https://{http}/metrics");
    let out = curl(&["--cacert", ca_path.to_str().unwrap(), &metrics]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("master_"));
    let out = curl(&[&format!("http://{http}/metrics")]);
    assert!(!out.status.success(), "clear-text HTTP was answered");
    let foreign_ca = foreign.path().join(CA_CERT_FILE);
    let out = curl(&["--cacert", foreign_ca.to_str().unwrap(), &metrics]);
    assert!(
        !out.status.success(),
        "another CA's client trusted the port"
    );

    // Nothing the strangers did changed the cluster.
    let status = cluster
        .master_client()
        .unwrap()
        .node_status(&leader_addr)
        .await
        .unwrap();
    assert_eq!(status.term, term, "a refused client moved the term");
    assert_eq!(status.key_count, 8);
    for i in 0..8 {
        assert_eq!(engine.get(&format!("tls-{i}")).await.unwrap(), value(i));
    }
}

/// Waits (bounded) until `client` is served: a SIGHUP is handled a moment
/// after it is sent.
/// SIGHUPs every master with files that must be refused, and waits until
/// each has logged the refusal (so what follows tests the files in use,
/// not a signal still on its way).
async fn hangup_refused(cluster: &mut LocalCluster) {
    const REFUSED: &str = "TLS files not reloaded";
    let ids: Vec<u64> = cluster.masters.iter().map(|m| m.id).collect();
    let count = |c: &LocalCluster, id: u64| c.log_tail(id, 100_000).matches(REFUSED).count();
    let before: Vec<usize> = ids.iter().map(|id| count(cluster, *id)).collect();
    cluster.hangup_all().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for (id, before) in ids.iter().zip(before) {
        while count(cluster, *id) <= before {
            assert!(
                std::time::Instant::now() < deadline,
                "master {id} did not log {REFUSED:?} after the SIGHUP"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn served_within(client: &MasterClient, who: &str, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        match client.get_leader().await {
            Ok(_) => return,
            Err(e) => assert!(
                std::time::Instant::now() < deadline,
                "{who} still refused after {within:?}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Rotation to a new CA without a restart: masters first trust both CAs
/// (SIGHUP), then present a certificate of the new one (SIGHUP). Clients of
/// the new CA are refused before the first step and served after it; the
/// cluster keeps serving puts throughout; a broken file at a SIGHUP leaves
/// the files in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_rotates_the_certificates_masters_serve_with() {
    // A short client TTL: step 3 checks the store stays live through a
    // leader change, which it could not without reaching the new leader.
    let ttl = ["--client-ttl".to_string(), "3s".to_string()];
    let mut cluster = LocalCluster::start_as(3, &ttl, Security::TokensAndTls).unwrap();
    cluster.with_mounted_store("64mb").await.unwrap();
    let certs = cluster.certs.clone().unwrap();
    let token = cluster.client_token_file().unwrap();
    let bearer = crescent_auth::BearerToken::from_file(&token).unwrap();
    let next = tempfile::tempdir().unwrap();
    write_certs(next.path()).unwrap();
    let masters = cluster.masters_arg();
    let engine = |tls: &TlsFiles| {
        impatient(
            MasterClient::new(&masters)
                .unwrap()
                .with_token(bearer.clone())
                .with_tls(Some(tls)),
        )
    };
    // A client of the new CA that still trusts the old one (the masters
    // present old certificates until step 2).
    let new_cert_old_trust = TlsFiles::read(
        &next.path().join("client.pem"),
        &next.path().join("client.key"),
        &certs.join(CA_CERT_FILE),
    )
    .unwrap();
    refused_by_tls(
        &engine(&new_cert_old_trust),
        "the new CA before the rotation",
    )
    .await;

    let writer = Client::connect(engine_config(
        cluster.masters_arg(),
        Some(token.clone()),
        &TlsFiles::client_in(&certs).unwrap(),
        true,
    ))
    .await
    .unwrap();
    let one = ReplicateConfig::default();
    writer.put("before", &value(1), &one).await.unwrap();

    // Step 1: trust both CAs (the old one first), SIGHUP.
    let old_ca = std::fs::read(certs.join(CA_CERT_FILE)).unwrap();
    let new_ca = std::fs::read(next.path().join(CA_CERT_FILE)).unwrap();
    std::fs::write(certs.join(CA_CERT_FILE), [old_ca.clone(), new_ca].concat()).unwrap();
    cluster.hangup_all().unwrap();
    served_within(
        &engine(&new_cert_old_trust),
        "the new CA after step 1",
        Duration::from_secs(5),
    )
    .await;
    writer.put("step-1", &value(2), &one).await.unwrap();
    // The store's data port still presents the old CA's certificate: a
    // transport trusting only the new CA refuses it (and the store, which
    // now trusts the new CA too, would take its certificate).
    let only_new = TlsFiles::client_in(next.path()).unwrap();
    let step_1 = writer.master().get_replica_list("step-1").await.unwrap();
    let only_new_transport = TcpTransport::with_tls(Some(&only_new)).unwrap();
    let before = read_directly(&only_new_transport, &step_1).await;
    match before {
        Err(e @ TransferError::Tls { .. })
            if e.to_string().contains("invalid peer certificate") => {}
        Err(e) => panic!("the data port did not present the old certificate before step 2: {e}"),
        Ok(_) => panic!("the data port presented the new certificate before step 2"),
    }

    // Step 2: present the new CA's certificate, SIGHUP. A client that
    // trusts only the new CA is served now. Masters and the store trust
    // both CAs since step 1's SIGHUP, so Raft and the store open new
    // connections freely; the writer, an engine that reads its files only
    // when it connects, runs over connections opened before (docs/security.md's
    // procedure restarts engines after step 1; this test does not).
    for f in ["node.pem", "node.key"] {
        std::fs::copy(next.path().join(f), certs.join(f)).unwrap();
    }
    cluster.hangup_all().unwrap();
    served_within(
        &engine(&only_new),
        "a client trusting only the new CA",
        Duration::from_secs(5),
    )
    .await;
    writer.put("step-2", &value(3), &one).await.unwrap();
    // The store's SIGHUP reached its data port too: the transport that
    // trusts only the new CA reads through it now (new connections; the
    // writer's pooled ones keep their sessions).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match read_directly(&only_new_transport, &step_1).await {
            Ok(bytes) => {
                assert_eq!(bytes, value(2));
                break;
            }
            Err(e) => assert!(
                std::time::Instant::now() < deadline,
                "the data port still refuses the new CA's client after step 2: {e}"
            ),
        }
        only_new_transport.forget(&step_1.replicas[0].endpoint);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ca_path = next.path().join(CA_CERT_FILE);
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "5", "--cacert"])
        .arg(&ca_path)
        .arg(format!("https://{}/metrics", cluster.masters[0].http))
        .output()
        .expect("curl (scripts/install-deps.sh installs it)");
    assert!(
        out.status.success(),
        "HTTPS still serves the old certificate: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A broken key at the next SIGHUP: refused, the files in use stay.
    std::fs::write(certs.join("node.key"), b"not a key").unwrap();
    hangup_refused(&mut cluster).await;
    let fresh = engine(&TlsFiles::client_in(next.path()).unwrap());
    fresh
        .get_leader()
        .await
        .expect("a broken file at SIGHUP must leave the certificate in use");
    for (key, i) in [("before", 1), ("step-1", 2), ("step-2", 3)] {
        assert_eq!(writer.get(key).await.unwrap(), value(i), "{key}");
    }
    // A well-formed key of another certificate: refused as well, by the
    // side served and the side presented to the peers alike (had the peers
    // taken it, every Raft message would fail its handshake from now on
    // and no put could commit).
    std::fs::copy(next.path().join("client.key"), certs.join("node.key")).unwrap();
    hangup_refused(&mut cluster).await;
    writer
        .put("after-a-mismatched-key", &value(6), &one)
        .await
        .expect("a mismatched key at SIGHUP must leave Raft's connections working");

    // Step 3: drop the old CA (trust only the new one), SIGHUP, restart
    // nothing. Since step 2's SIGHUP every process presents the new
    // certificate as a client too (masters to their peers, the store to the
    // masters), so connections opened from now on are still accepted.
    // A certificate of the old CA, trusting the new one: served until the
    // old CA is dropped, refused after.
    let old_cert_new_trust = TlsFiles::read(
        &certs.join("client.pem"),
        &certs.join("client.key"),
        &next.path().join(CA_CERT_FILE),
    )
    .unwrap();
    served_within(
        &engine(&old_cert_new_trust),
        "the old CA's certificate before step 3",
        Duration::from_secs(5),
    )
    .await;
    for f in ["node.key", CA_CERT_FILE, "client.pem", "client.key"] {
        std::fs::copy(next.path().join(f), certs.join(f)).unwrap();
    }
    cluster.hangup_all().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let old = engine(&old_cert_new_trust);
        match old.get_leader().await {
            Err(e) if e.code() == ErrorCode::PermissionDenied => break,
            other => assert!(
                std::time::Instant::now() < deadline,
                "the old CA's certificate still served 5 s after step 3: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fresh = Client::connect(engine_config(
        cluster.masters_arg(),
        Some(token.clone()),
        &only_new,
        true,
    ))
    .await
    .unwrap();
    // A restarted follower is reached by the leader over a new connection,
    // with the certificate the leader presents now, and catches up.
    let (leader, _, _) = cluster
        .wait_for_leader(Duration::from_secs(10))
        .await
        .unwrap();
    let follower = (1..=3u64).find(|id| *id != leader).unwrap();
    cluster.kill(follower).unwrap();
    cluster.restart(follower).unwrap();
    fresh.put("step-3", &value(4), &one).await.unwrap();
    let status = |addr: String| {
        let client = impatient(
            MasterClient::new(&addr)
                .unwrap()
                .with_token(bearer.clone())
                .with_tls(Some(&only_new)),
        );
        async move { client.node_status(&addr).await }
    };
    let leader_addr = cluster.by_id(leader).unwrap().addr.clone();
    let follower_addr = cluster.by_id(follower).unwrap().addr.clone();
    let committed = status(leader_addr).await.unwrap().committed;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        match status(follower_addr.clone()).await {
            Ok(s) if s.applied >= committed => break,
            other => assert!(
                std::time::Instant::now() < deadline,
                "master {follower}, restarted after step 3, did not catch up to {committed} \
                 (the leader must reach it with its new certificate): {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The store reaches a new leader over a new connection too: after the
    // leader is killed, its segment stays live past the new leader's
    // takeover grace (one client TTL) and takes puts.
    cluster.kill(leader).unwrap();
    let (next_leader, next_addr, _) = cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    assert_ne!(next_leader, leader);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let live = status(next_addr).await.unwrap().segment_count;
    assert_eq!(
        live, 1,
        "the store's segment expired after step 3: it could not reach the new leader"
    );
    fresh
        .put("step-3-after-failover", &value(5), &one)
        .await
        .unwrap();
    for (key, i) in [
        ("before", 1),
        ("step-2", 3),
        ("step-3", 4),
        ("step-3-after-failover", 5),
    ] {
        assert_eq!(fresh.get(key).await.unwrap(), value(i), "{key}");
    }
}

/// etcd serving TLS with client certificates: masters register and elect
/// through it (`--etcd-tls`), a store and an engine find the masters with
/// `etcd://` over TLS, and crescentctl too. An etcd client without a
/// certificate reads nothing; an engine that forgets `etcd_tls` is told so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_stores_and_engines_use_etcd_over_tls() {
    let etcd = LocalEtcd::start_tls().unwrap();
    let mut cluster = LocalCluster::start_with_tls_etcd(3, &etcd, "tls-etcd", &[]).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(20))
        .await
        .unwrap();
    let url = etcd.url("tls-etcd");
    let certs = cluster.certs.clone().unwrap();
    cluster
        .start_store_at(&url, "64mb", &["--etcd-tls".to_string()])
        .unwrap();
    cluster
        .wait_for_segments(1, Duration::from_secs(20))
        .await
        .unwrap();

    let client_tls = TlsFiles::client_in(&certs).unwrap();
    let config = ClientConfig {
        etcd_tls: true,
        ..engine_config(url.clone(), cluster.client_token_file(), &client_tls, true)
    };
    let engine = Client::connect(config.clone()).await.unwrap();
    engine
        .put("etcd-tls", &value(7), &ReplicateConfig::default())
        .await
        .unwrap();
    assert_eq!(engine.get("etcd-tls").await.unwrap(), value(7));

    let token = cluster.client_token_file().unwrap();
    assert_eq!(
        ctl_get(&[&url, "--etcd-tls"], "etcd-tls", &token, &certs),
        value(7)
    );

    // Without a certificate, etcd gives nothing away.
    let plain = tokio::time::timeout(Duration::from_secs(5), async {
        let mut kv = etcd_client::Client::connect([etcd.endpoint.as_str()], None).await?;
        kv.get(
            "/crescent/",
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
    })
    .await;
    assert!(
        !matches!(plain, Ok(Ok(_))),
        "etcd answered a client without TLS"
    );
    // An engine that forgets etcd_tls fails to connect, saying etcd.
    let forgot = Client::connect(ClientConfig {
        etcd_tls: false,
        ..config
    })
    .await;
    let err = forgot
        .err()
        .expect("etcd in clear text must fail")
        .to_string();
    assert!(err.contains("etcd"), "{err}");
}

/// Half a TLS set-up is a start-up error that names the missing flag, and
/// a key file that is not PEM is refused by name.
#[test]
fn a_master_refuses_to_start_with_half_a_tls_setup() {
    let dir = tempfile::tempdir().unwrap();
    write_certs(&dir.path().join("certs")).unwrap();
    let certs = dir.path().join("certs");
    let master = find_binary("crescent-master").unwrap();
    let run = |data: &str, extra: &[&std::ffi::OsStr]| {
        std::process::Command::new(&master)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--http",
                "127.0.0.1:0",
                "--insecure",
            ])
            .arg("--data-dir")
            .arg(dir.path().join(data))
            .args(extra)
            .env_remove("CRESCENT_TLS_CERT")
            .env_remove("CRESCENT_TLS_KEY")
            .env_remove("CRESCENT_TLS_CA")
            .output()
            .unwrap()
    };
    let node_pem = certs.join("node.pem");
    let out = run("m1", &["--tls-cert".as_ref(), node_pem.as_os_str()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--tls-key"), "{stderr}");

    let ca = certs.join("ca.pem");
    let out = run(
        "m2",
        &[
            "--tls-cert".as_ref(),
            node_pem.as_os_str(),
            "--tls-key".as_ref(),
            node_pem.as_os_str(),
            "--tls-ca".as_ref(),
            ca.as_os_str(),
        ],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("node.pem") && stderr.contains("PRIVATE KEY"),
        "{stderr}"
    );
}

/// Reads an object's first replica through `transport` under the grant its
/// descriptor carries: straight at the store's data port, no master call.
async fn read_directly(
    transport: &TcpTransport,
    found: &pb::GetReplicaListResponse,
) -> Result<Vec<u8>, TransferError> {
    let r = &found.replicas[0];
    let mut buf = vec![0u8; r.length as usize];
    transport
        .read(&r.endpoint, &mut [(Grant::from(r), r.offset, &mut buf)])
        .await?;
    Ok(buf)
}

/// A data-port refusal must be a TLS refusal, at once: not a transfer
/// failure to retry, not a wait for a timeout.
async fn refused_at_the_data_port(
    transport: &TcpTransport,
    found: &pb::GetReplicaListResponse,
    who: &str,
    says: &str,
) {
    let started = std::time::Instant::now();
    match read_directly(transport, found).await {
        Err(e @ TransferError::Tls { .. }) => {
            let text = e.to_string();
            assert!(text.contains(says), "{who}: {text}");
        }
        Err(other) => panic!("{who}: expected a TLS refusal, got {other}"),
        Ok(bytes) => panic!("{who}: served {} bytes", bytes.len()),
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{who}: refused only after {:?}",
        started.elapsed()
    );
}

/// The stores' data port over mutual TLS, against real
/// processes. A client with the cluster's certificate puts and gets 1 MiB
/// and 4 KiB values through a crescent-store's data port (TCP: the store
/// has no shared memory). A raw clear-text connection sending a READ under
/// a valid grant for an object gets none of its bytes and is closed. A
/// transport speaking clear text, trusting another CA, or presenting
/// another CA's certificate is refused at once with a TLS error. A
/// client's embedded segment serves TLS too: with a certificate fit to
/// serve, other clients put and get through it; with the client-only
/// certificate, they are refused, and the client library reports
/// PERMISSION_DENIED (as for the masters), not a transfer failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_moves_bytes_only_over_mutual_tls_on_the_data_port() {
    let mut cluster = LocalCluster::start_as(3, &[], Security::TokensAndTls).unwrap();
    cluster.with_mounted_store("64mb").await.unwrap();
    let certs = cluster.certs.clone().unwrap();
    let token = cluster.client_token_file().unwrap();
    let client_tls = TlsFiles::client_in(&certs).unwrap();
    let config = engine_config(
        cluster.masters_arg(),
        Some(token.clone()),
        &client_tls,
        true,
    );
    let engine = Client::connect(config.clone()).await.unwrap();
    let one = ReplicateConfig::default();
    let big: Vec<u8> = (0..1usize << 20)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    engine.put("data-tls-big", &big, &one).await.unwrap();
    engine.put("data-tls-small", &value(5), &one).await.unwrap();
    assert!(
        engine.get("data-tls-big").await.unwrap() == big,
        "1 MiB differs"
    );
    assert_eq!(engine.get("data-tls-small").await.unwrap(), value(5));
    let tcp_bytes = engine
        .stats
        .tcp_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        tcp_bytes >= 2 * (big.len() + 4096) as u64,
        "the bytes did not go through the data port ({tcp_bytes})"
    );
    let found = engine
        .master()
        .get_replica_list("data-tls-big")
        .await
        .unwrap();
    let replica = found.replicas[0].clone();
    assert_eq!(replica.endpoint, cluster.stores[0].endpoint);

    // 1. A raw clear-text READ of the whole object under its valid grant:
    //    nothing of the object comes back, no transfer answer, and the
    //    connection is closed. (A clear-text store answers it with the
    //    bytes.)
    let mut raw = tokio::net::TcpStream::connect(&replica.endpoint)
        .await
        .unwrap();
    let request = Request {
        op: Op::Read,
        request_id: 1,
        offset: replica.offset,
        len: replica.length,
        grant: Grant::from(&replica),
    };
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    raw.write_all(&request.encode()).await.unwrap();
    let mut got = Vec::new();
    // What arrived is in `got` even if the store keeps the connection.
    let read = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut got)).await;
    assert!(
        !got.starts_with(b"CRES"),
        "a clear-text request was answered"
    );
    assert!(
        !got.windows(64).any(|w| w == &big[4096..4096 + 64]),
        "object bytes served in clear text"
    );
    assert!(got.len() < 64, "{} bytes came back", got.len());
    assert!(read.is_ok(), "the clear-text connection was kept open");

    // 2. A transport in clear text is told the store requires TLS.
    refused_at_the_data_port(
        &TcpTransport::new(),
        &found,
        "a clear-text transport",
        "requires TLS",
    )
    .await;

    // 3. Another CA's client: it does not trust the store.
    let foreign = tempfile::tempdir().unwrap();
    write_certs(foreign.path()).unwrap();
    let stranger =
        TcpTransport::with_tls(Some(&TlsFiles::client_in(foreign.path()).unwrap())).unwrap();
    refused_at_the_data_port(&stranger, &found, "a client of another CA", "certificate").await;

    // 4. Trusts the cluster's CA but presents another CA's certificate:
    //    the store refuses it.
    let forged = TlsFiles::read(
        &foreign.path().join("client.pem"),
        &foreign.path().join("client.key"),
        &certs.join(CA_CERT_FILE),
    )
    .unwrap();
    let impostor = TcpTransport::with_tls(Some(&forged)).unwrap();
    refused_at_the_data_port(
        &impostor,
        &found,
        "a certificate of another CA",
        "does not trust",
    )
    .await;

    // The store counted the refusals (its metrics port serves HTTPS).
    let ca_path = certs.join(CA_CERT_FILE);
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "5", "--cacert"])
        .arg(&ca_path)
        .arg(format!("https://{}/metrics", cluster.stores[0].http))
        .output()
        .expect("curl (scripts/install-deps.sh installs it)");
    let metrics = String::from_utf8_lossy(&out.stdout);
    let refused: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("store_transfer_tls_refused_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no store_transfer_tls_refused_total in {metrics}"));
    assert!(refused >= 3, "{refused} TLS refusals counted");

    // 5. Embedded segments serve TLS with their client's files. One with
    //    a certificate fit to serve (the node pair names 127.0.0.1, where
    //    it is advertised) takes another client's put and get.
    let contributor = |cert: &str, key: &str| ClientConfig {
        global_segment_size: 16 << 20,
        transfer_listen: "127.0.0.1:0".into(),
        tls_cert: Some(certs.join(cert)),
        tls_key: Some(certs.join(key)),
        ..config.clone()
    };
    let serving = Client::connect(contributor("node.pem", "node.key"))
        .await
        .unwrap();
    let serving_segment = serving.local_store().unwrap().name.clone();
    let there = ReplicateConfig {
        replica_num: 1,
        preferred_segments: vec![serving_segment],
        ..Default::default()
    };
    engine
        .put("data-tls-embedded", &value(6), &there)
        .await
        .unwrap();
    let placed = engine
        .master()
        .get_replica_list("data-tls-embedded")
        .await
        .unwrap();
    assert_eq!(
        placed.replicas[0].endpoint,
        serving.local_store().unwrap().endpoint,
        "not placed on the embedded segment"
    );
    assert_eq!(engine.get("data-tls-embedded").await.unwrap(), value(6));

    // One with the client-only certificate (no server use, no address)
    // is refused by the other clients: a put to it fails at once with
    // PERMISSION_DENIED naming TLS, and nothing is stored.
    let unfit = Client::connect(contributor("client.pem", "client.key"))
        .await
        .unwrap();
    let unfit_segment = unfit.local_store().unwrap().name.clone();
    let started = std::time::Instant::now();
    let err = engine
        .put(
            "data-tls-unfit",
            &value(7),
            &ReplicateConfig {
                replica_num: 1,
                preferred_segments: vec![unfit_segment],
                ..Default::default()
            },
        )
        .await
        .expect_err("a segment with a client-only certificate served");
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
    assert!(err.to_string().contains("TLS"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "refused only after {:?}",
        started.elapsed()
    );
    assert!(!engine.exists("data-tls-unfit").await.unwrap());
    // Still served everywhere else.
    assert!(engine.get("data-tls-big").await.unwrap() == big);
}

/// The default: TLS files alone make gRPC mutual TLS, not the data port.
/// A store started without `--data-tls` serves clear text there, an engine
/// without `data_tls` speaks it, and an engine that asks for TLS against
/// such a store is told so at once (PERMISSION_DENIED naming TLS), with
/// nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_data_tls_a_tls_cluster_keeps_its_data_port_in_clear_text() {
    let mut cluster = LocalCluster::start_as(3, &[], Security::TokensAndTls).unwrap();
    cluster.data_tls = false;
    cluster.with_mounted_store("64mb").await.unwrap();
    let certs = cluster.certs.clone().unwrap();
    let client_tls = TlsFiles::client_in(&certs).unwrap();
    // The TLS files alone, as an engine that never heard of data_tls has.
    let config = ClientConfig {
        data_tls: ClientConfig::default().data_tls,
        ..engine_config(
            cluster.masters_arg(),
            cluster.client_token_file(),
            &client_tls,
            false,
        )
    };
    assert!(!config.data_tls, "data TLS is off unless asked");
    let engine = Client::connect(config.clone()).await.unwrap();
    let one = ReplicateConfig::default();
    engine.put("clear-data", &value(8), &one).await.unwrap();
    assert_eq!(engine.get("clear-data").await.unwrap(), value(8));

    // A clear-text transport reads it straight from the store's port.
    let found = engine
        .master()
        .get_replica_list("clear-data")
        .await
        .unwrap();
    let plain = TcpTransport::new();
    assert_eq!(read_directly(&plain, &found).await.unwrap(), value(8));

    // An engine asking for data TLS against this store: refused, clearly.
    let asking = Client::connect(ClientConfig {
        data_tls: true,
        ..config
    })
    .await
    .unwrap();
    let err = asking
        .put("tls-against-clear", &value(9), &one)
        .await
        .expect_err("a TLS transfer to a clear-text data port succeeded");
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
    assert!(err.to_string().contains("TLS"), "{err}");
    assert!(!engine.exists("tls-against-clear").await.unwrap());
}
