//! deploy/docker-compose.yml, for real: bring it up from the locally built
//! image (its `credentials` service writing tokens and certificates into a
//! temporary directory), find the leader through the published ports with
//! `crescentctl` presenting those credentials, see a clear-text caller
//! refused, read `/metrics` over HTTPS, kill the leader's container, see a
//! new leader, tear it down.
//!
//! docker-compose is the lifecycle here on purpose: the file is tested as a
//! user runs it. Needs a Docker engine, docker-compose and the image `make images` builds
//! (`$CRESCENT_IMAGE`, default crescent:latest). Without an engine it fails
//! under CI (`skip_or_fail`) and is otherwise skipped with a line `make test`
//! lists at the end; with an engine but no image it fails.

use std::process::Command;
use std::time::{Duration, Instant};

use crescent_integration::{crescentctl, free_port, http_request, skip_or_fail};

struct Compose {
    project: String,
    file: String,
    env: Vec<(String, String)>,
}

impl Compose {
    fn run(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("docker-compose")
            .args(["-p", &self.project, "-f", &self.file])
            .args(args)
            .envs(self.env.iter().cloned())
            .output()
            .expect("docker-compose runs");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        let (_, logs) = self.run(&["logs", "--no-color", "--tail", "30"]);
        if std::thread::panicking() {
            eprintln!("compose logs:\n{logs}");
        }
        self.run(&["down", "-v", "--timeout", "2"]);
    }
}

/// The engine (through bollard) and the `docker-compose` tool a user runs
/// the compose file with. (testcontainers' compose support drives the
/// `docker compose` plugin, which these machines do not have, and this test
/// is about the file as users run it.)
async fn engine_answers() -> bool {
    crescent_integration::containers::engine_answers().await
        && Command::new("docker-compose")
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
}

/// `crescentctl` flags presenting the admin token and the client certificate
/// the compose file's `credentials` service wrote under `secrets`.
fn credentials(secrets: &std::path::Path) -> Vec<String> {
    let path = |p: &str| secrets.join(p).to_string_lossy().into_owned();
    vec![
        "--token-file".into(),
        path("tokens/admin.token"),
        "--tls-cert".into(),
        path("certs/client.pem"),
        "--tls-key".into(),
        path("certs/client.key"),
        "--tls-ca".into(),
        path("certs/ca.pem"),
    ]
}

fn leader(masters: &str, creds: &[String]) -> Option<(u64, u64)> {
    let mut args: Vec<&str> = creds.iter().map(String::as_str).collect();
    args.extend(["--master", masters, "leader", "--json"]);
    let (ok, out, _) = crescentctl(&args).ok()?;
    if !ok {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(out.trim()).ok()?;
    Some((v["leader_id"].as_u64()?, v["term"].as_u64()?))
}

fn wait_leader(masters: &str, creds: &[String], not: Option<u64>, within: Duration) -> (u64, u64) {
    let deadline = Instant::now() + within;
    loop {
        if let Some((id, term)) = leader(masters, creds) {
            if id != 0 && Some(id) != not {
                return (id, term);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no (new) leader within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_cluster_survives_leader_kill() {
    if !engine_answers().await {
        skip_or_fail(
            "compose_cluster_survives_leader_kill",
            "no Docker engine or docker-compose answers here",
        );
        return;
    }
    let image = std::env::var("CRESCENT_IMAGE").unwrap_or_else(|_| "crescent:latest".into());
    if let Some(why) = crescent_integration::containers::blocker(&image).await {
        panic!("{why} (or set CRESCENT_IMAGE)");
    }
    let ports: Vec<u16> = (0..7).map(|_| free_port().unwrap()).collect();
    let names = [
        "CRESCENT_MASTER1_PORT",
        "CRESCENT_MASTER2_PORT",
        "CRESCENT_MASTER3_PORT",
        "CRESCENT_MASTER1_HTTP",
        "CRESCENT_MASTER2_HTTP",
        "CRESCENT_MASTER3_HTTP",
        "CRESCENT_ETCD_PORT",
    ];
    let mut env: Vec<(String, String)> = names
        .iter()
        .zip(&ports)
        .map(|(n, p)| (n.to_string(), p.to_string()))
        .collect();
    env.push(("CRESCENT_IMAGE".into(), image.clone()));
    let secrets = tempfile::tempdir().unwrap();
    env.push((
        "CRESCENT_SECRETS".into(),
        secrets.path().to_string_lossy().into_owned(),
    ));
    let creds = credentials(secrets.path());
    env.push(("CRESCENT_SEGMENT_SIZE".into(), "64mb".into()));
    let compose = Compose {
        project: format!("crescent-compose-{}", std::process::id()),
        file: format!(
            "{}/../deploy/docker-compose.yml",
            env!("CARGO_MANIFEST_DIR")
        ),
        env,
    };
    let (ok, out) = compose.run(&["up", "-d"]);
    assert!(ok, "docker-compose up failed:\n{out}");

    let masters = format!(
        "127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
        ports[0], ports[1], ports[2]
    );
    let (first, term) = wait_leader(&masters, &creds, None, Duration::from_secs(90));
    println!("leader: master{first} (term {term})");

    // Secured by default: without a certificate and token, refused.
    let (ok, _, err) = crescentctl(&["--master", &masters, "leader"]).unwrap();
    assert!(!ok && err.contains("PERMISSION_DENIED"), "{err}");

    // Metrics are published too, over HTTPS with the compose CA.
    let http = format!("127.0.0.1:{}", ports[3 + (first as usize - 1)]);
    let ca = secrets.path().join("certs/ca.pem");
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(&ca)
        .arg(format!("https://{http}/metrics"))
        .output()
        .expect("curl (scripts/install-deps.sh installs it)");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(body.contains("master_key_count"), "{body}");
    // Clear-text HTTP is not served.
    let plain = http_request(&http, "GET", "/metrics", &[]).await;
    assert!(
        !matches!(plain, Ok((200, _))),
        "clear-text /metrics answered"
    );

    let (ok, out) = compose.run(&["kill", &format!("master{first}")]);
    assert!(ok, "docker-compose kill failed:\n{out}");
    let (second, new_term) = wait_leader(&masters, &creds, Some(first), Duration::from_secs(30));
    println!("after killing master{first}: leader master{second} (term {new_term})");
    assert!(new_term > term);
}
