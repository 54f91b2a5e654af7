//! One engine call can be followed through the logs by its request id: the
//! client's `request` span, the master's `grpc` span and the log index its
//! proposal was applied at, the `apply` of that index, and the store's log
//! of the bytes it was sent on the client's connection.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crescent_integration::LocalCluster;
use regex::Regex;

use crate::common::{connect_client, one_replica, value};

const DEBUG: &str = "info,crescent_master=debug,crescent_raft=debug,crescent_store=debug";

/// What the test's own subscriber wrote: the client's log.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock poisoned")).into_owned()
    }
}

/// The first capture of `pattern` in `text`; panics, showing `what`, if none.
fn find(text: &str, pattern: &str, what: &str) -> String {
    let re = Regex::new(pattern).expect("a valid pattern");
    match re.captures(text) {
        Some(c) => c[1].to_string(),
        None => panic!("{what}: no line matches {pattern:?} in:\n{text}"),
    }
}

// Current-thread: the subscriber set below is this thread's, and the
// client's tasks run on it.
#[tokio::test]
async fn a_puts_request_id_leads_from_the_client_to_apply_and_to_the_store() {
    let env = |_id: u64| vec![("RUST_LOG".to_string(), DEBUG.to_string())];
    let mut cluster = LocalCluster::start_with_env(1, &[], &env).expect("cluster");
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .expect("leader");
    cluster
        .start_store_env("64mb", &[], &[("RUST_LOG".into(), DEBUG.into())])
        .expect("store");
    cluster
        .wait_for_segments(1, Duration::from_secs(15))
        .await
        .expect("segment");
    let client = connect_client(&cluster).await;

    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("crescent_client=debug,crescent_store=debug")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    client
        .put("traced-key", &value(1), &one_replica())
        .await
        .expect("put");
    drop(guard);

    let client_log = captured.text();
    let id = find(
        &client_log,
        r#"request\{op="put" request_id=([0-9a-f]{16}) key="traced-key"\}"#,
        "the client's span",
    );
    let exchange = Regex::new(&format!(
        r"request_id={id}[^\n]*store exchange [^\n]*local=Some\(([0-9.:]+)\) kind=.(?:write|one). first_request_id=(\d+)"
    ))
    .expect("a valid pattern");
    let captures = exchange
        .captures(&client_log)
        .unwrap_or_else(|| panic!("no store exchange under request {id} in:\n{client_log}"));
    let (local, first) = (captures[1].to_string(), captures[2].to_string());

    // The master logs asynchronously to its file: wait for the lines.
    let mut master_log = String::new();
    let mut store_log = String::new();
    for _ in 0..50 {
        master_log = std::fs::read_to_string(&cluster.masters[0].log_path).unwrap_or_default();
        store_log = std::fs::read_to_string(&cluster.stores[0].log_path).unwrap_or_default();
        if master_log.contains(&id) && store_log.contains(&local) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let index = find(
        &master_log,
        &format!(r"grpc\{{[^}}]*request_id={id}\}}[^\n]*applied log_index=(\d+)"),
        "the master's span and the index it applied",
    );
    find(
        &master_log,
        &format!(r"crescent_raft::store: apply log_index={index} (op=)"),
        "apply of that index",
    );
    find(
        &store_log,
        &format!(r"conn\{{peer={local}\}}[^\n]*request (op=Write) request_id={first} "),
        "the store's log of the client's write",
    );
}
