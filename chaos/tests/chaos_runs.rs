//! Real chaos runs through the `crescent-chaos` binary.
//!
//! - `ci_schedule_and_a_short_run_into_one_out_dir_have_no_violations`: the short CI
//!   schedule (10 leader kills, 2 random-master kills, 2 pauses, 2 leader
//!   partitions and a follower partition in container mode, a store kill, an
//!   etcd member kill, a rolling restart, 2 leader kills amid removes, a big
//!   batch, a connection flood, a stalled writer across a failover, a
//!   store restart with its disk tier, a master killed with a torn log, a
//!   paused store, a store cut off, a master added and removed, and late
//!   writes and requests) must end with 0 violations; then a run of six
//!   leader kills into the same `--out` must pass too (it must not take
//!   the first run's stop file for its own and run no workload).
//!   Container mode when a Docker engine answers and `make images` built
//!   `$CRESCENT_CHAOS_IMAGE` (default crescent:latest); otherwise processes
//!   mode, and it says so.
//! - `acking_before_commit_is_caught`: masters started with the test-only
//!   `--unsafe-ack-before-commit` lose acknowledged writes when the leader
//!   is killed (six leader kills); the checker must fail the run.
//! - `forgetting_leases_is_caught`: masters started with the test-only
//!   `--unsafe-forget-leases` let a forced remove hand a leased object's
//!   space to the next put; the workload's slow readers must see wrong bytes
//!   and the checker must fail the run.
//! - `adopting_foreign_reservations_is_caught`: masters started with the
//!   test-only `--unsafe-adopt-foreign-reservations` let a new leader place
//!   puts in the ranges its predecessor reserved, where a stalled writer
//!   placed by that predecessor still writes; over a schedule of stalled
//!   writers across failovers, its late bytes must overwrite acknowledged
//!   objects and the checker must fail the run.
//! - `reusing_revoked_ranges_is_caught`: masters started with the test-only
//!   `--unsafe-reuse-revoked-ranges` place a revoked put's range again at
//!   once; over a schedule of late writes after revokes, bytes delivered
//!   under the revoked puts' still-valid grants must overwrite acknowledged
//!   objects and the checker must fail the run.
//! - `reading_the_wall_clock_is_caught`: masters and stores started with
//!   the test-only `--unsafe-wall-clock` fence ranges and check grants on
//!   their wall clocks, and stores do not compare theirs with the leader's;
//!   over a schedule of late writes across an hour's step of the leader's
//!   wall clock (libfaketime), the step frees the revoked ranges, the late
//!   bytes must overwrite acknowledged objects and the checker must fail
//!   the run. (The honest run of the same fault is in the soak schedule.)
//! - `a_store_trusting_its_own_clock_is_caught`: the same switch; over a
//!   schedule of late requests to a store restarted with its wall clock an
//!   hour behind, that store honours grants past their expiry, so requests
//!   held until their ranges were freed and reused must overwrite
//!   acknowledged objects, and the checker must fail the run (masters in
//!   two-commit mode, so the freed ranges go to the next puts). (The honest
//!   store refuses every grant while its clock is off; that run is in the
//!   soak schedule.)
//! - `resuming_leadership_after_a_restart_is_caught`: masters started with
//!   the test-only `--unsafe-resume-leadership` lead again in their old term
//!   when restarted, with only a commit hint up to 1,024 transactions old;
//!   over a minute of rolling restarts (each restarts the leader last),
//!   gets must miss acknowledged puts and the checker must fail the run.
//!   (The honest run of the same schedule is what the soak's rolling
//!   restarts and `master/tests/it/one_node.rs` cover.)
//! - `forgetting_the_disk_on_restart_is_caught`: over a schedule of store
//!   restarts with the disk tier, an honest run checks disk objects across
//!   the restarts and passes; a run whose stores are started with the
//!   test-only `--unsafe-forget-disk-on-restart` (a restarted store deletes
//!   its disk segment) must fail with disk objects lost.
//! - `degraded_periods_are_judged_by_what_each_read_promises`: every
//!   master paused three times while a third worker runs a client with the
//!   descriptor cache and degraded mode; it must read through its cache,
//!   read and put while degraded, and the run must pass with each read held
//!   to its promise (a lease of staleness; real bytes while degraded) and
//!   the plain workers' reads to linearizability.
//! - `evicting_on_a_failing_disk_is_caught`: over a schedule of failing
//!   disks (the second store's disk answers EIO while the leader demotes),
//!   an honest run moves what the failing disk refused to the other disk
//!   and passes; masters started with the test-only
//!   `--unsafe-evict-on-failed-copy` evict those objects instead, and the
//!   checker must fail the run (the probes, read while the disk fails, are
//!   lost writes).
//! - `exclusive_promotion_is_caught`: masters started with the test-only
//!   `--unsafe-exclusive-promotion` release a promoted object's disk
//!   replica; over store restarts with the disk tier, objects promoted into
//!   the restarted store's memory are lost and the checker must fail the run.

use std::process::Command;

fn chaos(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_crescent-chaos"))
        .args(args)
        .env("CRESCENT_CHAOS_BIN", env!("CARGO_BIN_EXE_crescent-chaos"))
        .output()
        .expect("crescent-chaos runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn out_dir(name: &str) -> String {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir.display().to_string()
}

/// A run's verdict and errors on one line: CI keeps only the tail of a
/// failed test's output, so they go in the panic message, not after it.
fn why_it_ended(text: &str) -> String {
    text.lines()
        .filter(|l| {
            l.starts_with("crescent-chaos:")
                || l.starts_with("chaos: FAILED")
                || l.contains(" failed")
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// The run's own directory, from its `chaos: output = DIR` line.
fn run_dir(text: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix("chaos: output = "))
        .unwrap_or_else(|| panic!("no output line in:\n{text}"))
        .to_string()
}

fn report(text: &str) -> serde_json::Value {
    let path = format!("{}/report.json", run_dir(text));
    serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))).unwrap()
}

/// Every worker recorded operations (a stale stop file makes them record none).
fn assert_every_worker_recorded(run: &str) {
    for w in 0..2 {
        let path = format!("{run}/history-{w}.jsonl");
        let lines = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .lines()
            .count();
        assert!(lines > 100, "worker {w} recorded only {lines} operations");
    }
}

/// A passing run of `schedule` in the mode `auto` picks: its directory and
/// report.
fn auto_run(schedule: &str, image: &str, out: &str, seed: &str) -> (String, serde_json::Value) {
    let (code, text) = chaos(&[
        "run",
        "--mode",
        "auto",
        "--schedule",
        schedule,
        "--seed",
        seed,
        "--image",
        image,
        "--out",
        out,
    ]);
    // Visible in the test output: which mode ran and why.
    println!("{text}");
    assert!(text.contains("chaos: mode = "), "{text}");
    assert_eq!(
        code,
        0,
        "chaos run failed (logs and report in {out}): {}",
        why_it_ended(&text)
    );
    let report = report(&text);
    assert_eq!(report["violations"].as_array().unwrap().len(), 0);
    assert_eq!(report["passed"], true);
    (run_dir(&text), report)
}

#[test]
fn ci_schedule_and_a_short_run_into_one_out_dir_have_no_violations() {
    let image = std::env::var("CRESCENT_CHAOS_IMAGE").unwrap_or_else(|_| "crescent:latest".into());
    let out = out_dir("chaos-ci");
    let (first, report) = auto_run("ci", &image, &out, "20261121");
    // A second, short run into the same directory must not take the first
    // run's stop file for its own.
    let (second, _) = auto_run("leader-kills", &image, &out, "20261122");
    assert_ne!(first, second, "each run gets its own directory");
    // `crescent-chaos check` re-checks a saved run from its files alone.
    let first_report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(format!("{first}/report.json")).unwrap()).unwrap();
    let (code, text) = chaos(&["check", &first]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(&format!(
            "{} keys checked, 0 violations, 0 inconclusive",
            first_report["keys_checked"]
        )),
        "{text}"
    );
    assert_every_worker_recorded(&first);
    assert_every_worker_recorded(&second);
    let latest = std::fs::canonicalize(format!("{out}/latest")).unwrap();
    assert_eq!(latest, std::fs::canonicalize(&second).unwrap());

    let count = |kind: &str| {
        report["faults"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == kind)
            .count()
    };
    assert!(count("kill_leader") >= 10, "{}", report["faults"]);
    // The leadership check compared something: the real masters report the
    // leader id of what they applied, across the failovers.
    let seen = &report["leadership"];
    assert!(seen["terms_led"].as_u64().unwrap() >= 10, "{seen}");
    assert!(seen["terms_committed"].as_u64().unwrap() >= 2, "{seen}");
    assert!(
        seen["applied_indexes_seen"].as_u64().unwrap() >= 10,
        "{seen}"
    );
    assert_eq!(count("kill_leader_amid_removes"), 2);
    assert_eq!(count("big_batch"), 1, "{}", report["faults"]);
    assert_eq!(count("connection_flood"), 1, "{}", report["faults"]);
    assert_eq!(
        count("stalled_writer_across_failover"),
        1,
        "{}",
        report["faults"]
    );
    assert_eq!(count("restart_store_with_disk"), 1, "{}", report["faults"]);
    // Visible, not required: the one restart may find few disk objects.
    println!(
        "disk objects checked across the store restart: {}",
        report["disk_objects_checked"]
    );
    let engine = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(crescent_integration::containers::engine_answers());
    if engine {
        // With an engine, `make test` built the image: partitions must run.
        assert_eq!(report["mode"], "containers", "{}", report["mode_reason"]);
    }
    if report["mode"] == "containers" {
        assert!(count("partition_leader") >= 2);
    } else {
        crescent_integration::skip_or_fail(
            "chaos partitions (ran in processes mode)",
            report["mode_reason"].as_str().unwrap_or("no Docker engine"),
        );
    }
}

/// A processes-mode run of `schedule` into a fresh `name` directory, with
/// `more` arguments (a switch, a `--duration`): its exit code and output.
fn processes_run(name: &str, schedule: &str, seed: &str, more: &[&str]) -> (i32, String) {
    let out = out_dir(name);
    let mut args = vec![
        "run",
        "--mode",
        "processes",
        "--schedule",
        schedule,
        "--seed",
        seed,
        "--out",
        &out,
    ];
    args.extend_from_slice(more);
    let (code, text) = chaos(&args);
    println!("{text}");
    (code, text)
}

/// A run of `schedule` in processes mode with a test-only switch that
/// breaks a guarantee: it must fail; its violation counts.
fn broken_run(
    name: &str,
    schedule: &str,
    seed: &str,
    switch: &str,
) -> serde_json::Map<String, serde_json::Value> {
    broken_run_with(name, schedule, seed, switch, &[])
}

/// [`broken_run`] with more `run` arguments (a `--duration`).
fn broken_run_with(
    name: &str,
    schedule: &str,
    seed: &str,
    switch: &str,
    more: &[&str],
) -> serde_json::Map<String, serde_json::Value> {
    let mut args = vec![switch];
    args.extend_from_slice(more);
    let (code, text) = processes_run(name, schedule, seed, &args);
    if code != 1 {
        panic!(
            "{switch} must fail the run with violations (exit 1); it exited {code}: {}",
            why_it_ended(&text)
        );
    }
    // Re-checking the saved run finds the violations again.
    let (check_code, check_text) = chaos(&["check", &run_dir(&text)]);
    assert_eq!(check_code, 1, "{check_text}");
    assert!(!check_text.contains(" 0 violations"), "{check_text}");
    report(&text)["violation_counts"]
        .as_object()
        .unwrap()
        .clone()
}

#[test]
fn degraded_periods_are_judged_by_what_each_read_promises() {
    let (code, text) = processes_run("chaos-degraded", "degraded-periods", "5", &[]);
    assert_eq!(code, 0, "{}", why_it_ended(&text));
    let report = report(&text);
    let relaxed = &report["relaxed_reads"];
    for what in ["stale_within_lease", "degraded", "local_only_puts"] {
        assert!(
            relaxed[what].as_u64().unwrap_or(0) > 0,
            "the run proved nothing about {what}: {relaxed}"
        );
    }
    assert_every_worker_recorded(&run_dir(&text));
}

#[test]
fn evicting_on_a_failing_disk_is_caught() {
    let (code, text) = processes_run("chaos-failing-disk", "failing-disks", "3", &[]);
    if text.contains("cannot be made to fail here") {
        println!("SKIPPED: no FUSE here, so no disk can be made to fail");
        return;
    }
    assert_eq!(code, 0, "{}", why_it_ended(&text));
    let rounds: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("probes read:"))
        .collect();
    assert_eq!(
        rounds.len(),
        crescent_chaos::schedule::FAILING_DISK_FAULTS,
        "{text}"
    );
    for round in rounds {
        assert!(
            round.contains(" 0 missing") && !round.contains("read: 0 found"),
            "probes must be read, none missing, while the disk fails: {round}"
        );
    }
    let counts = broken_run(
        "chaos-failing-disk-unsafe",
        "failing-disks",
        "3",
        "--unsafe-evict-on-failed-copy",
    );
    assert!(
        counts.contains_key("lost_write"),
        "expected lost writes (evicted probes), got {counts:?}"
    );
}

#[test]
fn acking_before_commit_is_caught() {
    let counts = broken_run(
        "chaos-unsafe",
        "leader-kills",
        "7",
        "--unsafe-ack-before-commit",
    );
    assert!(
        counts.contains_key("lost_write") || counts.contains_key("not_linearizable"),
        "expected lost or non-linearizable writes, got {counts:?}"
    );
}

#[test]
fn resuming_leadership_after_a_restart_is_caught() {
    // In the dev build `make test` uses, seed 29 gave 112 and 165
    // violations in two minutes (16 rolling restarts), and 46 in one
    // minute (8) beside another chaos run; its honest run passed.
    let counts = broken_run_with(
        "chaos-resume-leadership",
        "rolling-restarts",
        "29",
        "--unsafe-resume-leadership",
        &["--duration", "1m"],
    );
    assert!(
        counts.contains_key("lost_write") || counts.contains_key("not_linearizable"),
        "expected gets that miss acknowledged puts, got {counts:?}"
    );
}

#[test]
fn forgetting_leases_is_caught() {
    let counts = broken_run(
        "chaos-forget-leases",
        "leader-kills",
        "11",
        "--unsafe-forget-leases",
    );
    assert!(
        counts.contains_key("wrong_bytes"),
        "expected slow readers to see wrong bytes, got {counts:?}"
    );
}

#[test]
fn adopting_foreign_reservations_is_caught() {
    let counts = broken_run(
        "chaos-adopt-reservations",
        "stalled-writers",
        "13",
        "--unsafe-adopt-foreign-reservations",
    );
    assert!(
        counts.contains_key("wrong_bytes"),
        "expected reads of objects the stalled writer overwrote to see wrong bytes, got {counts:?}"
    );
}

#[test]
fn reusing_revoked_ranges_is_caught() {
    let counts = broken_run(
        "chaos-reuse-revoked",
        "late-writes",
        "17",
        "--unsafe-reuse-revoked-ranges",
    );
    assert!(
        counts.contains_key("wrong_bytes"),
        "expected reads of objects the late writes overwrote to see wrong bytes, got {counts:?}"
    );
}

#[test]
fn reading_the_wall_clock_is_caught() {
    let counts = broken_run(
        "chaos-wall-clock",
        "clock-steps",
        "17",
        "--unsafe-wall-clock",
    );
    assert!(
        counts.contains_key("wrong_bytes"),
        "expected reads of objects the late writes overwrote after the leader's clock stepped to see wrong bytes, got {counts:?}"
    );
}

#[test]
fn a_store_trusting_its_own_clock_is_caught() {
    // Two commits: best fit over the whole segment gives a freed range to
    // the next put of its size (one-commit reservations fill and rotate in
    // the 20 s the fence lasts). Seed 19 gave 6 wrong_bytes (3 per fault),
    // the honest run of it none.
    let counts = broken_run_with(
        "chaos-store-skew",
        "store-skews",
        "19",
        "--unsafe-wall-clock",
        &["--put-mode", "two-commit"],
    );
    assert!(
        counts.contains_key("wrong_bytes"),
        "expected reads of objects the late requests overwrote on the skewed store to see wrong bytes, got {counts:?}"
    );
}

#[test]
fn forgetting_the_disk_on_restart_is_caught() {
    // The honest run of the same schedule and seed: disk objects are
    // checked across the restarts, and none is lost.
    let (code, text) = processes_run("chaos-disk-restarts", "disk-restarts", "17", &[]);
    assert_eq!(
        code,
        0,
        "the honest run failed (logs and report in {}): {}",
        run_dir(&text),
        why_it_ended(&text)
    );
    let honest = report(&text);
    assert_eq!(honest["violations"].as_array().unwrap().len(), 0);
    let restarts = honest["faults"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "restart_store_with_disk")
        .count();
    assert_eq!(restarts, crescent_chaos::schedule::DISK_RESTART_FAULTS);
    let checked = honest["disk_objects_checked"].as_u64().unwrap();
    let excused = honest["disk_objects_removed_meanwhile"].as_u64().unwrap();
    assert!(
        checked > excused,
        "the honest run must judge disk objects across its restarts: {checked} checked, \
         {excused} of them removed meanwhile"
    );

    let counts = broken_run(
        "chaos-forget-disk",
        "disk-restarts",
        "17",
        "--unsafe-forget-disk-on-restart",
    );
    let lost = counts
        .get("disk_lost")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    assert!(
        lost > 0,
        "expected disk objects lost across the store restarts, got {counts:?}"
    );
}

#[test]
fn exclusive_promotion_is_caught() {
    // The disk check reads each disk object twice before the restart and
    // waits for the leader to promote it (to the same store's memory);
    // with the switch the promotion releases its disk replica, and the
    // restart loses it.
    let counts = broken_run(
        "chaos-exclusive-promotion",
        "disk-restarts",
        "19",
        "--unsafe-exclusive-promotion",
    );
    // The disk check's probes (no worker removes them, so each is judged)
    // show as disk_lost; the workers' own promoted keys as lost writes.
    assert!(
        counts.contains_key("disk_lost"),
        "expected promoted disk objects lost across a store restart, got {counts:?}"
    );
}
