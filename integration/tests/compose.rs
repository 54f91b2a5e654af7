//! deploy/docker-compose.yml, for real: bring it up from the locally built
//! image, find the leader through the published ports with `crescentctl`,
//! kill the leader's container, see a new leader, tear it down.
//!
//! Needs a Docker engine, docker-compose and the image `make images` builds
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

fn engine_answers() -> bool {
    Command::new("docker")
        .args(["version"])
        .output()
        .is_ok_and(|o| o.status.success())
        && Command::new("docker-compose")
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
}

fn leader(masters: &str) -> Option<(u64, u64)> {
    let (ok, out, _) = crescentctl(&["--master", masters, "leader", "--json"]).ok()?;
    if !ok {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(out.trim()).ok()?;
    Some((v["leader_id"].as_u64()?, v["term"].as_u64()?))
}

fn wait_leader(masters: &str, not: Option<u64>, within: Duration) -> (u64, u64) {
    let deadline = Instant::now() + within;
    loop {
        if let Some((id, term)) = leader(masters) {
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
    if !engine_answers() {
        skip_or_fail(
            "compose_cluster_survives_leader_kill",
            "no Docker engine or docker-compose answers here",
        );
        return;
    }
    let image = std::env::var("CRESCENT_IMAGE").unwrap_or_else(|_| "crescent:latest".into());
    let inspect = Command::new("docker")
        .args(["image", "inspect", &image])
        .output()
        .unwrap();
    assert!(
        inspect.status.success(),
        "image {image} missing: run `make images` (or set CRESCENT_IMAGE)"
    );
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
    let (first, term) = wait_leader(&masters, None, Duration::from_secs(90));
    println!("leader: master{first} (term {term})");

    // Metrics are published too.
    let http = format!("127.0.0.1:{}", ports[3 + (first as usize - 1)]);
    let (status, body) = http_request(&http, "GET", "/metrics", &[]).await.unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("master_key_count"), "{body}");

    let (ok, out) = compose.run(&["kill", &format!("master{first}")]);
    assert!(ok, "docker-compose kill failed:\n{out}");
    let (second, new_term) = wait_leader(&masters, Some(first), Duration::from_secs(30));
    println!("after killing master{first}: leader master{second} (term {new_term})");
    assert!(new_term > term);
}
