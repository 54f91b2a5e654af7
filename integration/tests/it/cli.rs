//! The command lines as a user runs them: `crescentctl put/get/rm/exists`
//! against a real cluster, and the master's configuration precedence
//! (command line over environment over `--config` file over default).
//! Needs `cargo build --bins` first (`make test` does it).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crescent_integration::{crescentctl, find_binary, free_port, http_request, LocalCluster};

/// Runs `crescentctl` and returns (exit code, stdout bytes, stderr).
fn ctl_raw(args: &[&str]) -> (i32, Vec<u8>, String) {
    let out = Command::new(find_binary("crescentctl").unwrap())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crescentctl_put_get_rm_exists() {
    let mut cluster = LocalCluster::start(3, &[]).unwrap();
    cluster.with_mounted_store("64mb").await.unwrap();
    let m = cluster.masters_arg();
    let dir = tempfile::tempdir().unwrap();

    // Text value.
    let (code, _, err) = ctl_raw(&["--master", &m, "put", "cli/text", "hello world"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("stored cli/text (11 bytes, 1 replica(s))"),
        "{err}"
    );
    let (code, out, err) = ctl_raw(&["--master", &m, "get", "cli/text"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, b"hello world");

    // Binary value through files, every byte value, two replicas refused
    // honestly (one store) rather than silently stored once.
    let input = dir.path().join("in.bin");
    let bytes: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&input, &bytes).unwrap();
    let input_s = input.to_str().unwrap();
    let (code, _, err) = ctl_raw(&[
        "--master",
        &m,
        "put",
        "cli/bin",
        "--file",
        input_s,
        "--replicas",
        "2",
    ]);
    assert_ne!(code, 0, "two replicas on one store must be refused: {err}");
    let (code, _, err) = ctl_raw(&["--master", &m, "put", "cli/bin", "--file", input_s]);
    assert_eq!(code, 0, "{err}");
    let output = dir.path().join("out.bin");
    let (code, _, err) = ctl_raw(&[
        "--master",
        &m,
        "get",
        "cli/bin",
        "--out",
        output.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(&output).unwrap(), bytes);

    // exists: exit 0 and "yes", exit 2 and "no"; --json says the same.
    let (code, out, _) = ctl_raw(&["--master", &m, "exists", "cli/text"]);
    assert_eq!((code, out.as_slice()), (0, b"yes\n".as_slice()));
    let (code, out, _) = ctl_raw(&["--master", &m, "exists", "cli/none"]);
    assert_eq!((code, out.as_slice()), (2, b"no\n".as_slice()));
    let (code, out, _) = ctl_raw(&["--master", &m, "--json", "exists", "cli/none"]);
    assert_eq!(code, 2);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["exists"], false);

    // Objects are immutable: a second put of a key succeeds as in Mooncake
    // (OBJECT_ALREADY_EXISTS counts as success) and the first value stays.
    let (code, _, err) = ctl_raw(&["--master", &m, "put", "cli/text", "other"]);
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = ctl_raw(&["--master", &m, "get", "cli/text"]);
    assert_eq!(out, b"hello world");

    // rm: the gets above hold a read lease (10 s), so a plain rm is refused
    // with a hint, and --force removes; then it is gone for exists and get.
    let (code, _, err) = ctl_raw(&["--master", &m, "rm", "cli/text"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("OBJECT_HAS_LEASE") && err.contains("force"),
        "{err}"
    );
    assert_eq!(ctl_raw(&["--master", &m, "exists", "cli/text"]).0, 0);
    let (code, _, err) = ctl_raw(&["--master", &m, "rm", "--force", "cli/text"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("removed cli/text"), "{err}");
    let (code, _, _) = ctl_raw(&["--master", &m, "exists", "cli/text"]);
    assert_eq!(code, 2);
    let (code, out, err) = ctl_raw(&["--master", &m, "get", "cli/text"]);
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(err.contains("not found"), "{err}");
    let (code, _, err) = ctl_raw(&["--master", &m, "rm", "--force", "cli/text"]);
    assert_eq!(code, 1);
    assert!(err.contains("not found"), "{err}");

    // Usage errors say what is wrong.
    let (code, _, err) = ctl_raw(&["--master", &m, "put", "cli/x"]);
    assert_eq!(code, 1);
    assert!(err.contains("give either a VALUE or --file F"), "{err}");
    // Both at once is a command-line error (clap's exit status 2).
    let (code, _, err) = ctl_raw(&["--master", &m, "put", "cli/x", "v", "--file", input_s]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot be used with"), "{err}");
}

/// With no master answering, `crescentctl put` fails and says so. The CLI
/// never goes local-only: the value would live only in the memory of a
/// process about to exit, so "stored" would be a false success (it once
/// printed "stored" while the leader was out of file descriptors).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crescentctl_put_fails_when_no_master_answers() {
    let mut cluster = LocalCluster::start(3, &[]).unwrap();
    cluster.with_mounted_store("64mb").await.unwrap();
    let m = cluster.masters_arg();
    for id in [1, 2, 3] {
        cluster.pause(id).unwrap();
    }
    let (ok, _, err) = crescentctl(&["--master", &m, "put", "cli/lost", "value"]).unwrap();
    for id in [1, 2, 3] {
        cluster.resume(id).unwrap();
    }
    assert!(!ok, "a put no master took must fail: {err}");
    assert!(!err.contains("stored"), "{err}");
    // Nothing was stored behind the user's back.
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let (code, _, _) = ctl_raw(&["--master", &m, "exists", "cli/lost"]);
    assert_eq!(code, 2);
}

/// A lone master started with `--node-id` from some of: a `--config` file, the
/// environment, the command line. Returns the id its `/health` reports.
async fn effective_node_id(file: Option<u64>, env: Option<u64>, flag: Option<u64>) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let (port, http) = (free_port().unwrap(), free_port().unwrap());
    let mut cmd = Command::new(find_binary("crescent-master").unwrap());
    cmd.arg("--insecure")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .args(["--data-dir", dir.path().join("data").to_str().unwrap()])
        .env_remove("CRESCENT_NODE_ID")
        .env_remove("CRESCENT_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(id) = file {
        let path = dir.path().join("master.toml");
        // A key the flag table also has, in the documented form (long flag name).
        std::fs::write(&path, format!("node-id = {id}\nlease-ttl = \"10s\"\n")).unwrap();
        cmd.args(["--config", path.to_str().unwrap()]);
    }
    if let Some(id) = env {
        cmd.env("CRESCENT_NODE_ID", id.to_string());
    }
    if let Some(id) = flag {
        cmd.args(["--node-id", &id.to_string()]);
    }
    let mut child = cmd.spawn().unwrap();
    let addr = format!("127.0.0.1:{http}");
    let deadline = Instant::now() + Duration::from_secs(15);
    let id = loop {
        if let Ok((_, body)) = http_request(&addr, "GET", "/health", &[]).await {
            if let Some(id) = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["id"].as_u64())
            {
                break id;
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("master (file {file:?}, env {env:?}, flag {flag:?}) never answered /health");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_config_precedence_is_flag_then_env_then_file_then_default() {
    assert_eq!(effective_node_id(Some(7), Some(8), Some(9)).await, 9);
    assert_eq!(effective_node_id(Some(7), Some(8), None).await, 8);
    assert_eq!(effective_node_id(Some(7), None, None).await, 7);
    assert_eq!(effective_node_id(None, None, None).await, 1);
    // The file's value is used only where neither flag nor env sets the key.
    assert_eq!(effective_node_id(Some(7), None, Some(9)).await, 9);
}
