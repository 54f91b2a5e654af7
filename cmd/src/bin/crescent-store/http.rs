//! The store's `/metrics` (Prometheus text) and `/health`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crescent_client::agent::StoreAgent;

/// The routes of the store's `--http` port.
pub fn router(agent: Arc<StoreAgent>) -> axum::Router {
    use axum::routing::get;
    use crescent_proto::metrics::{label, sample};
    async fn metrics(
        axum::extract::State(a): axum::extract::State<Arc<StoreAgent>>,
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
        out.push_str(&format!("# HELP store_info Segment name.\n# TYPE store_info gauge\nstore_info{{segment=\"{name}\"}} 1\n"));
        s.transfer_latency.render(
            &mut out,
            "store_transfer_seconds",
            "Time to serve one transfer request.",
        );
        ([("content-type", "text/plain; version=0.0.4")], out)
    }
    async fn health(
        axum::extract::State(a): axum::extract::State<Arc<StoreAgent>>,
    ) -> impl axum::response::IntoResponse {
        let mounted = a.segment_id().is_some();
        let body = axum::Json(
            serde_json::json!({"status": "serving", "segment": a.name, "endpoint": a.endpoint,
            "segment_id": a.segment_id(), "mounted": mounted}),
        );
        // Serving bytes does not need a master: healthy even while unmounted.
        (axum::http::StatusCode::OK, body)
    }
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .with_state(agent)
}
