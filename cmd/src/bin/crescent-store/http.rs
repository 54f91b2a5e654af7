//! The store's `/metrics` (Prometheus text) and `/health`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crescent_client::agent::StoreAgent;

/// The routes of the store's `--http` port. `disk_error`: why the disk
/// segment `--disk-path` asked for is not served (None: served, or none
/// asked for).
pub fn router(
    agent: Arc<StoreAgent>,
    disk: Option<Arc<StoreAgent>>,
    disk_error: Option<String>,
) -> axum::Router {
    use axum::routing::get;
    use crescent_proto::metrics::{label, sample};
    type Agents = (Arc<StoreAgent>, Option<Arc<StoreAgent>>, Option<String>);
    async fn metrics(
        axum::extract::State((a, disk, disk_error)): axum::extract::State<Agents>,
    ) -> impl axum::response::IntoResponse {
        let s = &a.stats;
        let mut out = String::new();
        let name = label(&a.name);
        sample(
            &mut out,
            "store_bytes_read_total",
            "counter",
            "Bytes served to readers.",
            s.bytes_read.load(Ordering::Relaxed),
        );
        sample(
            &mut out,
            "store_bytes_written_total",
            "counter",
            "Bytes written by writers.",
            s.bytes_written.load(Ordering::Relaxed),
        );
        sample(
            &mut out,
            "store_requests_total",
            "counter",
            "Transfer requests served.",
            s.requests.load(Ordering::Relaxed),
        );
        sample(
            &mut out,
            "store_connections",
            "gauge",
            "Open transfer connections.",
            s.connections.load(Ordering::Relaxed),
        );
        sample(
            &mut out,
            "store_rejected_connections_total",
            "counter",
            "Connections closed for bad requests.",
            s.rejected_connections.load(Ordering::Relaxed),
        );
        sample(
            &mut out,
            "store_transfer_forbidden_total",
            "counter",
            "Transfer requests refused for their grant (unsigned, expired, another segment, operation or range).",
            s.forbidden.load(Ordering::Relaxed),
        );
        sample(
            &mut out,
            "store_transfer_tls_refused_total",
            "counter",
            "Transfer connections refused at the TLS handshake (no or an untrusted certificate, clear text on a TLS port, TLS on a clear-text port, too slow).",
            s.tls_refused.load(Ordering::Relaxed),
        );
        sample(
            &mut out,
            "store_segment_capacity_bytes",
            "gauge",
            "Size of the contributed segment.",
            a.segment.len(),
        );
        sample(
            &mut out,
            "store_segment_mounted",
            "gauge",
            "1 while the segment is mounted on the masters.",
            u8::from(a.segment_id().is_some()),
        );
        sample(
            &mut out,
            "store_clock_off",
            "gauge",
            "1 while this store's clock is too far from the leader's and it refuses every grant.",
            u8::from(a.clock_is_off()),
        );
        out.push_str(&format!("# HELP store_info Segment name.\n# TYPE store_info gauge\nstore_info{{segment=\"{name}\"}} 1\n"));
        s.transfer_latency.render(
            &mut out,
            "store_transfer_seconds",
            "Time to serve one transfer request.",
        );
        disk_metrics(&mut out, &a, disk.as_deref());
        sample(
            &mut out,
            "store_disk_open_failed",
            "gauge",
            "1 when --disk-path was given but its disk segment could not be opened (see /health's disk_error).",
            u8::from(disk_error.is_some()),
        );
        ([("content-type", "text/plain; version=0.0.4")], out)
    }
    async fn health(
        axum::extract::State((a, disk, disk_error)): axum::extract::State<Agents>,
    ) -> impl axum::response::IntoResponse {
        let mounted = a.segment_id().is_some();
        let disk = disk.map(|d| {
            serde_json::json!({"segment": d.name, "endpoint": d.endpoint,
            "segment_id": d.segment_id(), "mounted": d.segment_id().is_some()})
        });
        // Still 200: the memory segment serves. "degraded" says the disk
        // tier asked for is not there (why: disk_error).
        let status = if disk_error.is_some() {
            "degraded"
        } else {
            "serving"
        };
        let body = axum::Json(
            serde_json::json!({"status": status, "segment": a.name, "endpoint": a.endpoint,
            "segment_id": a.segment_id(), "mounted": mounted, "disk": disk,
            "disk_error": disk_error}),
        );
        // Serving bytes does not need a master: healthy even while unmounted.
        (axum::http::StatusCode::OK, body)
    }
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .with_state((agent, disk, disk_error))
}

/// The disk tier's figures (all zero without a disk segment, so dashboards
/// show the tier as empty rather than missing).
fn disk_metrics(out: &mut String, memory: &StoreAgent, disk: Option<&StoreAgent>) {
    use crescent_proto::metrics::sample;
    let s = disk.map(|d| &*d.stats);
    let load = |f: fn(&crescent_store::TransferStats) -> u64| s.map_or(0, f);
    sample(
        out,
        "store_disk_capacity_bytes",
        "gauge",
        "Size of the disk segment (0 without --disk-path).",
        disk.map_or(0, |d| d.segment.len()),
    );
    sample(
        out,
        "store_disk_segment_mounted",
        "gauge",
        "1 while the disk segment is mounted on the masters.",
        u8::from(disk.is_some_and(|d| d.segment_id().is_some())),
    );
    sample(
        out,
        "store_disk_read_bytes_total",
        "counter",
        "Bytes read from the disk segment.",
        load(|s| s.disk_bytes_read.load(Ordering::Relaxed)),
    );
    sample(
        out,
        "store_disk_write_bytes_total",
        "counter",
        "Bytes written to the disk segment.",
        load(|s| s.disk_bytes_written.load(Ordering::Relaxed)),
    );
    sample(
        out,
        "store_disk_errors_total",
        "counter",
        "Disk reads or writes that failed (the connection is closed; readers use another replica).",
        load(|s| s.disk_errors.load(Ordering::Relaxed)),
    );
    // A copy is served by the segment it reads: `from="memory"` are
    // demotions, `from="disk"` promotions.
    let by_source = |f: fn(&crescent_store::TransferStats) -> u64| {
        [("memory", f(&memory.stats)), ("disk", load(f))]
    };
    for (name, help, values) in [
        (
            "store_tier_copies_total",
            "Copies between this store's memory and disk segments the masters asked it for, by the tier read.",
            by_source(|s| s.copies.load(Ordering::Relaxed)),
        ),
        (
            "store_tier_copy_bytes_total",
            "Bytes those copies moved, by the tier read.",
            by_source(|s| s.copy_bytes.load(Ordering::Relaxed)),
        ),
        (
            "store_tier_copy_errors_total",
            "Copies between this store's tiers that failed after their checks (a disk error, an expired grant, cut short), by the tier read.",
            by_source(|s| s.copy_errors.load(Ordering::Relaxed)),
        ),
    ] {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
        for (from, value) in values {
            out.push_str(&format!("{name}{{from=\"{from}\"}} {value}\n"));
        }
    }
    if let Some(s) = s {
        s.disk_read_latency.render(
            out,
            "store_disk_read_seconds",
            "Time of one disk read (a piece of at most 1 MiB).",
        );
        s.disk_write_latency.render(
            out,
            "store_disk_write_seconds",
            "Time of one disk write (a piece of at most 1 MiB).",
        );
    }
}
