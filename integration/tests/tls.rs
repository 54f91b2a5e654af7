//! Mutual TLS (issue 13 item 1) against real processes: three masters, a
//! store and the clients all speak TLS with certificates `crescentctl certs
//! init` wrote. Raft, mounts, puts and gets work; a client in clear text, a
//! client without a certificate, a client whose certificate another CA
//! signed and a client that trusts another CA are all turned away at the
//! handshake, and the cluster is unchanged afterwards. The admin HTTP port
//! serves HTTPS.
//!
//! Needs `cargo build --bins` first (`make test` does it).

use std::time::Duration;

use crescent_auth::tls::{TlsFiles, CA_CERT_FILE};
use crescent_client::{Client, ClientConfig, MasterClient, ReplicateConfig};
use crescent_integration::{find_binary, tls_flags, write_certs, LocalCluster, Security};
use crescent_proto::{pb, ErrorCode};

fn value(i: usize) -> Vec<u8> {
    (0..4096).map(|j| (i * 31 + j) as u8).collect()
}

/// A master client that gives up after 5 s: a refusal at the handshake must
/// come back at once as PERMISSION_DENIED, not as "no master reachable"
/// when the deadline passes (that would send an engine local-only).
fn impatient(client: MasterClient) -> MasterClient {
    let mut client = client;
    client.policy.deadline = Duration::from_secs(5);
    client
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
    let engine = Client::connect(ClientConfig {
        master: cluster.masters_arg(),
        token_file: Some(token.clone()),
        tls_cert: Some(client_tls.cert.clone()),
        tls_key: Some(client_tls.key.clone()),
        tls_ca: Some(client_tls.ca.clone()),
        degrade_after: Duration::ZERO,
        ..ClientConfig::default()
    })
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
    let out = std::process::Command::new(&ctl)
        .args(["--master", &cluster.masters_arg(), "get", "tls-3"])
        .arg("--token-file")
        .arg(&token)
        .args(tls_flags(&certs, false))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, value(3));
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
