//! Admin and metrics HTTP (`--http`, default 127.0.0.1:9003): open are
//! `/metrics` (Prometheus text), `/health`, `/leader` and Mooncake's
//! `/get_all_segments` (segment names only: SGLang polls it, without
//! credentials, before it starts). The admin reads `/query_key`,
//! `/segments`, `/keys`, `/get_all_keys`, `/query_segment?segment=` and
//! `POST /remove_all` need the admin token (`Authorization: Bearer ...`)
//! unless the master runs `--insecure`. Mooncake's names answer in its
//! plain-text formats.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use openraft::ServerState;
use serde::Deserialize;
use serde_json::json;

use crate::node::MasterNode;
use crate::service::MasterApi;
use crescent_proto::metrics::{label, sample};

const MAX_KEYS_PAGE: usize = 10_000;
/// `/get_all_keys` answers at most this many keys (Mooncake has no paging);
/// a longer list is cut and says so in the `X-Crescent-Truncated` header.
const MAX_ALL_KEYS: usize = 1_000_000;
const MOONCAKE_TEXT: &str = "text/plain; version=0.0.4";

pub fn router(node: Arc<MasterNode>) -> Router {
    let admin = Router::new()
        .route("/query_key", get(query_key))
        .route("/segments", get(segments))
        .route("/keys", get(keys))
        .route("/get_all_keys", get(mooncake_all_keys))
        .route("/query_segment", get(mooncake_query_segment))
        .route("/remove_all", post(remove_all))
        .route_layer(axum::middleware::from_fn_with_state(
            node.clone(),
            require_admin,
        ));
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/leader", get(leader))
        .route("/get_all_segments", get(mooncake_all_segments))
        .merge(admin)
        .with_state(node)
}

/// Lets a request through only with the admin token (any token passes
/// `--insecure`, except the deprecated `--admin-token` on POST /remove_all).
async fn require_admin(
    State(node): State<Arc<MasterNode>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let authorization = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    match node
        .verifier()
        .check(authorization, crescent_auth::Role::Admin)
    {
        Ok(()) => next.run(request).await,
        Err(denied) => {
            let code = match denied {
                crescent_auth::Denied::Insufficient { .. } => StatusCode::FORBIDDEN,
                _ => StatusCode::UNAUTHORIZED,
            };
            (code, Json(json!({"error": denied.to_string()}))).into_response()
        }
    }
}

fn role_name(s: ServerState) -> &'static str {
    match s {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

async fn metrics(State(node): State<Arc<MasterNode>>) -> impl IntoResponse {
    let m = node.metrics();
    let mut out = String::with_capacity(4096);
    let mm = node.counters();
    sample(
        &mut out,
        "master_auth_denied_total",
        "counter",
        "Requests refused for lack of a valid token or role (gRPC and admin HTTP).",
        node.verifier().denied_total(),
    );
    {
        let st = node.state();
        sample(
            &mut out,
            "master_key_count",
            "gauge",
            "Objects in the store (all phases).",
            st.objects.len(),
        );
        sample(
            &mut out,
            "master_allocated_bytes",
            "gauge",
            "Bytes allocated to replicas.",
            st.total_allocated(),
        );
        sample(
            &mut out,
            "master_total_capacity_bytes",
            "gauge",
            "Capacity of all mounted segments.",
            st.total_capacity(),
        );
        let (mem_cap, mem_used) = st.tier_usage(crescent_raft::state::Tier::Memory);
        let (disk_cap, disk_used) = st.tier_usage(crescent_raft::state::Tier::Disk);
        sample(
            &mut out,
            "master_memory_capacity_bytes",
            "gauge",
            "Capacity of memory segments.",
            mem_cap,
        );
        sample(
            &mut out,
            "master_memory_allocated_bytes",
            "gauge",
            "Bytes allocated in memory segments.",
            mem_used,
        );
        sample(
            &mut out,
            "master_disk_capacity_bytes",
            "gauge",
            "Capacity of disk segments.",
            disk_cap,
        );
        sample(
            &mut out,
            "master_disk_allocated_bytes",
            "gauge",
            "Bytes allocated in disk segments.",
            disk_used,
        );
        let on_disk = st.disk_object_count();
        sample(
            &mut out,
            "master_disk_key_count",
            "gauge",
            "Objects with a disk replica.",
            on_disk,
        );
        sample(
            &mut out,
            "master_segment_count",
            "gauge",
            "Mounted segments.",
            st.live_segment_count(),
        );
        sample(
            &mut out,
            "master_evicted_key_count",
            "counter",
            "Objects evicted since the cluster started.",
            st.evicted_total,
        );
        sample(
            &mut out,
            "master_alloc_failures_total",
            "counter",
            "PutStarts that found no space.",
            st.alloc_failures,
        );
        let _ = writeln!(out, "# HELP segment_allocated_bytes Bytes allocated in a segment.\n# TYPE segment_allocated_bytes gauge");
        for s in st.segments.values() {
            let used = st.allocator(s.id).map(|a| a.allocated()).unwrap_or(0);
            let _ = writeln!(
                out,
                "segment_allocated_bytes{{segment=\"{}\"}} {used}",
                label(&s.spec.name)
            );
        }
        let _ = writeln!(out, "# HELP segment_capacity_bytes Capacity of a segment.\n# TYPE segment_capacity_bytes gauge");
        for s in st.segments.values() {
            let _ = writeln!(
                out,
                "segment_capacity_bytes{{segment=\"{}\"}} {}",
                label(&s.spec.name),
                s.spec.capacity
            );
        }
    }
    let active = node.active_clients();
    sample(
        &mut out,
        "master_active_clients",
        "gauge",
        "Clients heartbeating to this leader within client-ttl.",
        active,
    );
    for (name, help, v) in [
        (
            "master_put_start_requests_total",
            "Objects in PutStart and BatchPutStart requests, and puts into a placement made ahead (which need no PutStart): one per put started.",
            &mm.put_start_requests,
        ),
        (
            "master_put_end_requests_total",
            "Objects in PutEnd and BatchPutEnd requests.",
            &mm.put_end_requests,
        ),
        (
            "master_get_replica_list_requests_total",
            "Objects in GetReplicaList and BatchGetReplicaList requests.",
            &mm.get_replica_list_requests,
        ),
        (
            "master_exist_key_requests_total",
            "Objects in Exist and BatchExist requests.",
            &mm.exist_requests,
        ),
        (
            "master_remove_requests_total",
            "Objects in Remove and BatchRemove requests.",
            &mm.remove_requests,
        ),
        (
            "master_mount_segment_requests_total",
            "MountSegment requests.",
            &mm.mount_requests,
        ),
        (
            "master_heartbeat_requests_total",
            "Heartbeats received.",
            &mm.heartbeat_requests,
        ),
        (
            "master_eviction_rounds_total",
            "Eviction rounds run by this node as leader.",
            &mm.eviction_rounds,
        ),
        (
            "master_demotions_total",
            "Objects this node as leader moved from memory to a disk segment.",
            &mm.demotions,
        ),
        (
            "master_demotion_bytes_total",
            "Bytes this node as leader copied from memory to disk.",
            &mm.demotion_bytes,
        ),
        (
            "master_demotion_failures_total",
            "Demotion copies that failed (the object stays in memory).",
            &mm.demotion_failures,
        ),
        (
            "master_tier_copies_on_store_total",
            "Demotions and promotions a store copied between its own memory and disk (the rest went through this leader).",
            &mm.tier_copies_on_store,
        ),
        (
            "master_promotions_total",
            "Objects this node as leader copied from disk back to memory (they stay on disk too).",
            &mm.promotions,
        ),
        (
            "master_promotion_bytes_total",
            "Bytes this node as leader copied from disk to memory.",
            &mm.promotion_bytes,
        ),
        (
            "master_promotion_failures_total",
            "Promotion copies that failed (the object stays on disk only).",
            &mm.promotion_failures,
        ),
        (
            "master_memory_copies_released_total",
            "Promoted objects whose memory copy eviction released (their disk replica stays).",
            &mm.memory_copies_dropped,
        ),
        (
            "master_disk_copies_released_total",
            "Promoted objects whose disk copy the disk watermark released (their memory replica stays).",
            &mm.disk_copies_dropped,
        ),
        (
            "master_disk_evicted_key_count_total",
            "Objects this node as leader dropped from disk at the disk watermark.",
            &mm.disk_evictions,
        ),
        (
            "master_lease_reads_total",
            "Reads answered under the leader lease, with no quorum round.",
            &mm.lease_reads,
        ),
        (
            "master_read_index_reads_total",
            "Reads that confirmed leadership with a quorum round (read-index mode, or no lease).",
            &mm.read_index_reads,
        ),
        (
            "master_one_commit_placements_total",
            "Puts this leader placed inside its reservations without a commit (one commit per put).",
            &mm.one_commit_placements,
        ),
        (
            "master_placements_ahead_total",
            "Of those, placements made ahead of their put's key (asked for in the writer's previous PutEnd).",
            &mm.placements_ahead,
        ),
        (
            "master_placements_ahead_given_back_total",
            "Placements made ahead that their writer gave back unused (revoked).",
            &mm.placements_ahead_given_back,
        ),
        (
            "master_two_commit_placements_total",
            "Puts that asked for one commit and took two (no reservation fitted, item too large, no lease).",
            &mm.two_commit_fallbacks,
        ),
        (
            "master_puts_to_disk_total",
            "Puts placed straight on a disk segment because memory had no room (retried, not refused).",
            &mm.puts_to_disk,
        ),
        (
            "master_reservations_made_total",
            "Reservations this leader committed for one-commit puts.",
            &mm.reservations_made,
        ),
        (
            "master_reservations_retired_total",
            "Reservations this leader retired (full, or an earlier term's after the release timeout).",
            &mm.reservations_retired,
        ),
        (
            "raft_leader_changes_total",
            "Leader changes seen by this node.",
            &mm.leader_changes,
        ),
    ] {
        sample(&mut out, name, "counter", help, v.load(Relaxed));
    }
    let _ = writeln!(
        out,
        "# HELP master_quota_rejections_total Requests refused by a quota: objects, unfinished puts and key bytes per client; segments per client or in all.\n# TYPE master_quota_rejections_total counter"
    );
    for (quota, v) in [
        ("objects", &mm.quota_rejections_objects),
        ("unfinished_puts", &mm.quota_rejections_unfinished_puts),
        ("key_bytes", &mm.quota_rejections_key_bytes),
        ("segments", &mm.quota_rejections_segments),
    ] {
        let _ = writeln!(
            out,
            "master_quota_rejections_total{{quota=\"{quota}\"}} {}",
            v.load(Relaxed)
        );
    }
    sample(
        &mut out,
        "raft_term",
        "gauge",
        "Current Raft term.",
        m.current_term,
    );
    let _ = writeln!(
        out,
        "# HELP raft_role 1 for this node's current role.\n# TYPE raft_role gauge"
    );
    for r in ["leader", "follower", "candidate", "learner", "shutdown"] {
        let _ = writeln!(
            out,
            "raft_role{{role=\"{r}\"}} {}",
            u8::from(role_name(m.state) == r)
        );
    }
    sample(
        &mut out,
        "raft_is_leader",
        "gauge",
        "1 when this node leads.",
        u8::from(node.is_leader()),
    );
    sample(
        &mut out,
        "raft_last_log_index",
        "gauge",
        "Last log index on this node.",
        m.last_log_index.unwrap_or(0),
    );
    sample(
        &mut out,
        "raft_applied_index",
        "gauge",
        "Last applied index on this node.",
        m.last_applied.map(|l| l.index).unwrap_or(0),
    );
    sample(
        &mut out,
        "raft_snapshot_index",
        "gauge",
        "Index of the last snapshot.",
        m.snapshot.map(|l| l.index).unwrap_or(0),
    );
    if let Some(repl) = &m.replication {
        let last = m.last_log_index.unwrap_or(0);
        let _ = writeln!(out, "# HELP raft_follower_lag Entries a follower is behind the leader's log.\n# TYPE raft_follower_lag gauge");
        for (id, matched) in repl {
            let lag = last.saturating_sub(matched.map(|l| l.index).unwrap_or(0));
            let _ = writeln!(out, "raft_follower_lag{{follower=\"{id}\"}} {lag}");
        }
        sample(
            &mut out,
            "raft_commit_index",
            "gauge",
            "Highest index stored on a majority (leader view).",
            crate::cluster::committed_index(repl, &node.voters(), node.id(), m.last_log_index),
        );
    }
    mm.tier_copy_latency.render(
        &mut out,
        "master_tier_copy_seconds",
        "Time of one object's copy between tiers (demotion or promotion) that was done, by its store or by this leader.",
    );
    mm.proposal_latency.render(
        &mut out,
        "raft_proposal_seconds",
        "Time from proposing a write to its commit and apply.",
    );
    mm.read_index_latency.render(
        &mut out,
        "raft_read_index_seconds",
        "Time to confirm leadership for a linearizable read.",
    );
    ([("content-type", "text/plain; version=0.0.4")], out)
}

fn health_json(node: &MasterNode) -> (bool, serde_json::Value) {
    let m = node.metrics();
    let leader = m.current_leader;
    let voters = node.voters();
    // A leader that a quorum acknowledged within two election timeouts.
    let quorum = match m.state {
        ServerState::Leader => m
            .millis_since_quorum_ack
            .is_some_and(|ms| ms <= 2 * node.config().election_timeout_max.as_millis() as u64),
        _ => leader.is_some(),
    };
    let serving = leader.is_some() && m.state != ServerState::Shutdown;
    (
        serving && quorum,
        json!({"status": if serving && quorum { "serving" } else { "no_quorum" }, "id": node.id(),
               "role": role_name(m.state), "term": m.current_term, "leader_id": leader,
               "leader_addr": node.leader_hint().1, "quorum": quorum, "voters": voters.len(),
               "degraded": false}),
    )
}

async fn health(State(node): State<Arc<MasterNode>>) -> Response {
    let (ok, body) = health_json(&node);
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body)).into_response()
}

async fn leader(State(node): State<Arc<MasterNode>>) -> Response {
    let m = node.metrics();
    match node.leader_hint() {
        (Some(id), addr) => {
            Json(json!({"leader_id": id, "leader_addr": addr, "term": m.current_term}))
                .into_response()
        }
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "no leader known"})),
        )
            .into_response(),
    }
}

#[derive(Deserialize)]
struct KeyQuery {
    key: String,
}

async fn query_key(State(node): State<Arc<MasterNode>>, Query(q): Query<KeyQuery>) -> Response {
    let state = node.state();
    let Some(obj) = state.objects.get(&q.key) else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "OBJECT_NOT_FOUND", "key": q.key})),
        )
            .into_response();
    };
    let replicas: Vec<_> = obj
        .replicas
        .iter()
        .map(|r| {
            let seg = state.segments.get(&r.segment_id);
            json!({"segment_id": r.segment_id, "segment": seg.map(|s| s.spec.name.clone()),
                   "endpoint": seg.map(|s| s.spec.endpoint.clone()), "offset": r.offset, "length": r.len})
        })
        .collect();
    Json(json!({"key": q.key, "size": obj.size, "complete": obj.is_complete(), "checksum": obj.checksum,
                "hard_pin": obj.hard_pin, "soft_pin_until_ms": obj.soft_pin_until_ms, "created_ms": obj.created_ms,
                "writer": obj.writer, "replicas": replicas, "as_applied_on_node": node.id()}))
    .into_response()
}

async fn segments(State(node): State<Arc<MasterNode>>) -> Response {
    let state = node.state();
    let list: Vec<_> = state
        .segments
        .values()
        .map(|s| {
            let a = state.allocator(s.id);
            json!({"id": s.id, "name": s.spec.name, "owner": s.owner, "endpoint": s.spec.endpoint,
                   "hostname": s.spec.hostname, "shm": !s.spec.shm_file().is_empty(), "disk_file": !s.spec.disk_file().is_empty(), "capacity": s.spec.capacity,
                   "allocated": a.map(|a| a.allocated()).unwrap_or(0),
                   "largest_free": a.map(|a| a.largest_free()).unwrap_or(0), "mounted_ms": s.mounted_ms, "expired_ms": s.expired_ms})
        })
        .collect();
    Json(json!({"segments": list})).into_response()
}

/// Mooncake's `/get_all_segments`: names of the mounted (live) segments,
/// one per line.
async fn mooncake_all_segments(State(node): State<Arc<MasterNode>>) -> Response {
    let state = node.state();
    let mut body = String::new();
    for s in state.segments.values().filter(|s| s.is_live()) {
        body.push_str(&s.spec.name);
        body.push('\n');
    }
    ([("content-type", MOONCAKE_TEXT)], body).into_response()
}

/// Mooncake's `/get_all_keys`: every complete object's key, one per line.
async fn mooncake_all_keys(State(node): State<Arc<MasterNode>>) -> Response {
    let state = node.state();
    let mut body = String::new();
    let mut truncated = false;
    for (listed, (k, _)) in state
        .objects
        .iter()
        .filter(|(_, o)| o.is_complete())
        .enumerate()
    {
        if listed == MAX_ALL_KEYS {
            truncated = true;
            break;
        }
        body.push_str(k);
        body.push('\n');
    }
    let truncated = if truncated { "true" } else { "false" };
    (
        [
            ("content-type", MOONCAKE_TEXT),
            ("x-crescent-truncated", truncated),
        ],
        body,
    )
        .into_response()
}

#[derive(Deserialize)]
struct SegmentQuery {
    segment: String,
}

/// Mooncake's `/query_segment?segment=NAME`: the name, then used and total
/// bytes, one per line; 404 for a segment that is not mounted.
async fn mooncake_query_segment(
    State(node): State<Arc<MasterNode>>,
    Query(q): Query<SegmentQuery>,
) -> Response {
    let state = node.state();
    let Some(s) = state
        .segments
        .values()
        .find(|s| s.is_live() && s.spec.name == q.segment)
    else {
        return (
            StatusCode::NOT_FOUND,
            [("content-type", MOONCAKE_TEXT)],
            format!("segment {} not found\n", q.segment),
        )
            .into_response();
    };
    let used = state.allocator(s.id).map(|a| a.allocated()).unwrap_or(0);
    (
        [("content-type", MOONCAKE_TEXT)],
        format!(
            "{}\nUsed(bytes): {used}\nCapacity(bytes): {}\n",
            s.spec.name, s.spec.capacity
        ),
    )
        .into_response()
}

#[derive(Deserialize)]
struct KeysQuery {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

async fn keys(State(node): State<Arc<MasterNode>>, Query(q): Query<KeysQuery>) -> Response {
    let limit = q.limit.unwrap_or(1000).clamp(1, MAX_KEYS_PAGE);
    let state = node.state();
    let objects: &BTreeMap<String, _> = &state.objects;
    let start = q.after.clone().unwrap_or_else(|| q.prefix.clone());
    let mut page: Vec<&String> = objects
        .range(start..)
        .map(|(k, _)| k)
        .filter(|k| Some(*k) != q.after.as_ref())
        .take_while(|k| k.starts_with(&q.prefix))
        .take(limit + 1)
        .collect();
    let next = if page.len() > limit {
        page.truncate(limit);
        page.last().map(|k| k.to_string())
    } else {
        None
    };
    Json(json!({"keys": page, "next": next})).into_response()
}

#[derive(Deserialize)]
struct RemoveAllQuery {
    #[serde(default)]
    force: bool,
}

async fn remove_all(
    State(node): State<Arc<MasterNode>>,
    headers: HeaderMap,
    Query(q): Query<RemoveAllQuery>,
) -> Response {
    if let Some(token) = node
        .config()
        .admin_token
        .as_deref()
        .filter(|t| !t.is_empty())
    {
        let given = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(token) {
            return (
                StatusCode::UNAUTHORIZED,
                Json(json!({"error": "admin token required (Authorization: Bearer ...)"})),
            )
                .into_response();
        }
    }
    match MasterApi::new(node.clone()).remove_all_admin(q.force).await {
        Ok(n) => Json(json!({"removed": n})).into_response(),
        Err(s) => {
            let code = if s.error_code() == crescent_proto::ErrorCode::NotLeader {
                StatusCode::MISDIRECTED_REQUEST
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            (code, Json(json!({"error": s.error_code().as_str_name(), "message": s.message, "leader_addr": s.leader_addr}))).into_response()
        }
    }
}
