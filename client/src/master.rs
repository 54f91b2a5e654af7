//! Leader-following gRPC client for `MasterService` and `ClusterService`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crescent_auth::capability::SegmentKey;
use crescent_auth::{AuthedChannel, BearerToken};
use crescent_proto::pb::{
    self, cluster_service_client::ClusterServiceClient, master_service_client::MasterServiceClient,
};
use crescent_proto::ErrorCode;
use rand::Rng;
use tonic::transport::{Channel, ClientTlsConfig};

use crate::discovery::{DiscoveryError, Targets};

/// How long an attempt waits on its target before asking the other masters
/// whether leadership has moved (see `leader_moved_away_from`).
const LEADER_MOVE_CHECK_AFTER: Duration = Duration::from_millis(500);

/// Why a call to the masters failed (the client library's own errors are
/// [`crate::Error`]).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum MasterRpcError {
    /// The master answered with an error code (Mooncake's names).
    #[error("{}: {message}", code.as_str_name())]
    Status { code: ErrorCode, message: String },
    /// No master answered usefully before the deadline.
    #[error("no master reachable: {0}")]
    Unavailable(String),
    #[error("invalid master address {0:?}: expected host:port or a comma-separated list")]
    BadAddress(String),
}

impl From<DiscoveryError> for MasterRpcError {
    fn from(e: DiscoveryError) -> Self {
        match e {
            DiscoveryError::BadAddress(a) => MasterRpcError::BadAddress(a),
            DiscoveryError::Unavailable(why) => MasterRpcError::Unavailable(why),
        }
    }
}

impl MasterRpcError {
    pub fn code(&self) -> ErrorCode {
        match self {
            MasterRpcError::Status { code, .. } => *code,
            MasterRpcError::Unavailable(_) => ErrorCode::RpcFail,
            MasterRpcError::BadAddress(_) => ErrorCode::InvalidParams,
        }
    }

    pub fn from_status(s: &pb::Status) -> Self {
        MasterRpcError::Status {
            code: s.error_code(),
            message: s.message.clone(),
        }
    }
}

/// How long and how often to retry.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Overall deadline of one call, across retries.
    pub deadline: Duration,
    /// Timeout of one attempt.
    pub attempt_timeout: Duration,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(15),
            attempt_timeout: Duration::from_secs(6),
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(150),
        }
    }
}

/// Responses that carry a `Status`.
pub trait HasStatus {
    fn status(&self) -> Option<&pb::Status>;
}

macro_rules! has_status {
    ($($t:ty),* $(,)?) => {$(
        impl HasStatus for $t {
            fn status(&self) -> Option<&pb::Status> { self.status.as_ref() }
        }
    )*};
}

has_status!(
    pb::PutStartResponse,
    pb::BatchPutStartResponse,
    pb::StatusResponse,
    pb::PutEndResponse,
    pb::BatchStatusResponse,
    pb::BatchPutEndResponse,
    pb::GetReplicaListResponse,
    pb::BatchGetReplicaListResponse,
    pb::ExistResponse,
    pb::BatchExistResponse,
    pb::CountResponse,
    pb::MountSegmentResponse,
    pb::HeartbeatResponse,
    pb::GetLeaderResponse,
    pb::ListMembersResponse,
    pb::GetStatusResponse,
    pb::TransferLeaderResponse,
);

/// Where a put was placed: its replicas (with write grants), and whether
/// the placement is pending (made without a commit; the PutEnd records it).
/// How long a placement ahead (or its revoke) is tried: it only saves a
/// round trip, and each retry of it may leave a placement unused until the
/// leader's release timeout.
const AHEAD_DEADLINE: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Default)]
pub struct Placement {
    pub replicas: Vec<pb::ReplicaDescriptor>,
    pub pending: bool,
    /// Made ahead of its put, before its key was known (asked for by the
    /// PutEnd before it, [`MasterClient::put_end_placing_next`]); always
    /// pending.
    pub ahead: bool,
}

/// Splits `host:port,host:port` into addresses.
pub fn parse_master_list(spec: &str) -> Result<Vec<String>, MasterRpcError> {
    let addrs: Vec<String> = spec
        .split(',')
        .map(|s| s.trim().trim_start_matches("http://").to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if addrs.is_empty()
        || addrs.iter().any(|a| {
            !a.rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
        })
    {
        return Err(MasterRpcError::BadAddress(spec.to_string()));
    }
    Ok(addrs)
}

pub fn new_client_id() -> String {
    let r: u128 = rand::rng().random();
    format!("{r:032x}")
}

/// A refusal of the master's auth layer, or of the TLS handshake, as an
/// error; `None` for other transport statuses.
fn denied(status: &tonic::Status) -> Option<MasterRpcError> {
    if matches!(
        status.code(),
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
    ) {
        return Some(MasterRpcError::Status {
            code: ErrorCode::PermissionDenied,
            message: status.message().to_string(),
        });
    }
    tls_mismatch(status).map(|message| MasterRpcError::Status {
        code: ErrorCode::PermissionDenied,
        message,
    })
}

/// A connection the TLS layer refused — a certificate one side does not
/// trust, or one side speaking TLS and the other not. That is a
/// configuration error, not an outage: retrying cannot help, and a client
/// must not take it for "no master reachable" and go local-only.
fn tls_mismatch(status: &tonic::Status) -> Option<String> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(status);
    // The chain is a handful deep (status, transport, hyper, io, rustls).
    for _ in 0..16 {
        let e = next?;
        let text = e.to_string();
        // rustls's own words, as tokio-rustls passes them on.
        if text.contains("invalid peer certificate")
            || text.starts_with("received fatal alert")
            || text.contains("peer sent no certificates")
            || text.contains("received corrupt message")
        {
            return Some(format!("TLS handshake refused: {text}"));
        }
        // A TLS server's first bytes read as an HTTP/2 frame header give an
        // impossible frame size.
        if text.contains("frame with invalid size") {
            return Some(
                "the master does not speak clear-text gRPC: it may require TLS \
                 (CRESCENT_TLS_CERT, CRESCENT_TLS_KEY, CRESCENT_TLS_CA or --tls-*)"
                    .into(),
            );
        }
        next = e.source();
    }
    None
}

/// The channels of a [`MasterClient`] and the TLS they were made with.
#[derive(Default, Clone)]
struct Channels {
    /// Mutual TLS towards the masters (`--tls-*`); plain HTTP/2 without.
    tls: Option<Arc<ClientTlsConfig>>,
    by_addr: HashMap<String, Channel>,
}

/// A client of the master set that follows the leader by itself.
pub struct MasterClient {
    targets: std::sync::Arc<Targets>,
    next_seed: AtomicUsize,
    /// One lazily connected channel per master address, and the TLS they
    /// were made with: looked up on every call, added to once per address
    /// (copy-on-write), replaced whole by [`MasterClient::reload_tls`].
    channels: ArcSwap<Channels>,
    /// The files `channels` were made with (reloads compare against them).
    presented_tls: std::sync::Mutex<Option<crescent_auth::tls::TlsFiles>>,
    /// Presented on every call (none for `--insecure` clusters).
    token: BearerToken,
    client_id: String,
    seq: AtomicU64,
    /// Names this client gives its puts (see `new_put_id`).
    next_put_id: AtomicU64,
    pub policy: RetryPolicy,
}

/// Outcome classes of one attempt.
enum Attempt<R> {
    Done(R),
    /// Refused for good (no valid token, or the wrong role): no retry helps.
    Fail(MasterRpcError),
    Redirect(Option<String>),
    Retry(String),
}

impl MasterClient {
    /// `masters`: `host:port` or a comma list of them.
    pub fn new(masters: &str) -> Result<Self, MasterRpcError> {
        Ok(Self::with_seeds(parse_master_list(masters)?))
    }

    /// `masters`: `host:port`, a comma list, or `etcd://h1:2379,h2:2379[/cluster]`
    /// (the masters are then discovered in etcd and followed as they change).
    pub async fn connect(masters: &str) -> Result<Self, MasterRpcError> {
        Self::connect_with_etcd_tls(masters, None).await
    }

    /// [`connect`](Self::connect), reading etcd over TLS with `etcd_tls`
    /// (this process's certificate, trusting its CA) when given.
    pub async fn connect_with_etcd_tls(
        masters: &str,
        etcd_tls: Option<&crescent_auth::tls::TlsFiles>,
    ) -> Result<Self, MasterRpcError> {
        match crate::discovery::EtcdSpec::parse(masters) {
            Some(spec) => {
                let targets = std::sync::Arc::new(Targets::default());
                let tls = etcd_tls.map(|t| t.client_config());
                crate::discovery::start(spec?, tls, targets.clone()).await?;
                Ok(Self::with_targets(targets))
            }
            None => Self::new(masters),
        }
    }

    pub fn with_seeds(seeds: Vec<String>) -> Self {
        let targets = Targets::default();
        targets.set_seeds(seeds);
        Self::with_targets(std::sync::Arc::new(targets))
    }

    fn with_targets(targets: std::sync::Arc<Targets>) -> Self {
        // Start from a random seed so many clients spread their first contact.
        let n = targets.seeds.load().len();
        let start = rand::rng().random_range(0..n.max(1));
        Self {
            targets,
            next_seed: AtomicUsize::new(start),
            channels: ArcSwap::default(),
            presented_tls: std::sync::Mutex::new(None),
            token: BearerToken::none(),
            client_id: new_client_id(),
            seq: AtomicU64::new(1),
            next_put_id: AtomicU64::new(1),
            policy: RetryPolicy::default(),
        }
    }

    /// Presents `token` on every call from now on (the client token, or
    /// the admin token for administration).
    pub fn with_token(mut self, token: BearerToken) -> Self {
        self.token = token;
        self
    }

    /// Speaks mutual TLS to the masters from now on (channels opened
    /// before are dropped, so no call goes out in clear text after this).
    pub fn with_tls(self, tls: Option<&crescent_auth::tls::TlsFiles>) -> Self {
        *self.presented_tls.lock().expect("lock poisoned") = tls.cloned();
        self.channels.store(Arc::new(Channels {
            tls: tls.map(|t| Arc::new(t.client_config())),
            by_addr: HashMap::new(),
        }));
        self
    }

    /// Presents `tls` from now on (a SIGHUP after certificates were
    /// rotated): cached channels are dropped, so the next call connects
    /// with the new files; calls already made finish on their connection.
    /// Files that do not parse are refused and the ones in use stay (a
    /// broken reload must not cut a process off its masters); files equal
    /// to those in use change nothing.
    pub fn reload_tls(
        &self,
        tls: &crescent_auth::tls::TlsFiles,
    ) -> Result<(), crescent_auth::tls::TlsError> {
        tls.data_client_config()?;
        let mut current = self.presented_tls.lock().expect("lock poisoned");
        if current.as_ref().is_some_and(|c| c.same_as(tls)) {
            return Ok(());
        }
        self.channels.store(Arc::new(Channels {
            tls: Some(Arc::new(tls.client_config())),
            by_addr: HashMap::new(),
        }));
        *current = Some(tls.clone());
        Ok(())
    }

    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// Known master addresses.
    pub fn seeds(&self) -> Vec<String> {
        self.targets.seeds.load().to_vec()
    }

    /// The leader address this client currently believes in.
    pub fn cached_leader(&self) -> Option<String> {
        self.targets.leader.load().as_deref().cloned()
    }

    /// A fresh header for one logical write; reuse it across retries of that write.
    pub fn header(&self) -> pb::RequestHeader {
        pb::RequestHeader {
            client_id: self.client_id.clone(),
            request_seq: self.seq.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The channel to `addr`, with this client's token on every call.
    pub fn channel(&self, addr: &str) -> Result<AuthedChannel, MasterRpcError> {
        if let Some(c) = self.channels.load().by_addr.get(addr) {
            return Ok(self.token.wrap(c.clone()));
        }
        // Built inside the swap from the TLS of the map it joins: a reload
        // racing with this call cannot leave a channel with the old files.
        let mut chosen = None;
        let mut bad = false;
        self.channels.rcu(|current| {
            // rcu may run this again if another call swapped meanwhile.
            chosen = None;
            bad = false;
            let mut next = Channels::clone(current);
            if let Some(c) = next.by_addr.get(addr) {
                chosen = Some(c.clone());
                return next;
            }
            match crescent_auth::tls::endpoint(addr, next.tls.as_deref()) {
                Ok(endpoint) => {
                    let ch = endpoint
                        .connect_timeout(Duration::from_millis(300))
                        .tcp_nodelay(true)
                        .connect_lazy();
                    next.by_addr.insert(addr.to_string(), ch.clone());
                    chosen = Some(ch);
                }
                Err(_) => bad = true,
            }
            next
        });
        match chosen {
            Some(ch) if !bad => Ok(self.token.wrap(ch)),
            _ => Err(MasterRpcError::BadAddress(addr.to_string())),
        }
    }

    fn pick_target(&self) -> Option<String> {
        if let Some(l) = self.cached_leader() {
            return Some(l);
        }
        let seeds = self.targets.seeds.load();
        if seeds.is_empty() {
            return None;
        }
        let i = self.next_seed.fetch_add(1, Ordering::Relaxed);
        Some(seeds[i % seeds.len()].clone())
    }

    fn set_leader(&self, addr: String) {
        self.targets.leader.store(Some(Arc::new(addr)));
    }

    /// Forgets the leader only if it is still `addr`: a newer leader learnt
    /// meanwhile (by another task or the etcd watcher) stays.
    fn forget_leader(&self, addr: &str) {
        self.targets.leader.rcu(|current| match current {
            Some(l) if l.as_str() == addr => None,
            other => other.clone(),
        });
    }

    /// Calls the leader with `f`, following redirects and retrying transport
    /// failures, UNAVAILABLE and RPC_TIMEOUT until the deadline. `f` is called
    /// once per attempt and must rebuild the same request (same header).
    pub async fn call_leader<R, F, Fut>(&self, f: F) -> Result<R, MasterRpcError>
    where
        R: HasStatus,
        F: Fn(AuthedChannel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        self.call_leader_within(self.policy.deadline, f).await
    }

    /// [`call_leader`](Self::call_leader) with an explicit overall deadline.
    pub async fn call_leader_within<R, F, Fut>(
        &self,
        within: Duration,
        f: F,
    ) -> Result<R, MasterRpcError>
    where
        R: HasStatus,
        F: Fn(AuthedChannel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let deadline = Instant::now() + within;
        let mut backoff = self.policy.initial_backoff;
        let mut last_error;
        loop {
            let Some(target) = self.pick_target() else {
                return Err(MasterRpcError::Unavailable(
                    "no master address known (etcd lists none)".into(),
                ));
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let outcome = self
                .attempt(
                    &target,
                    &f,
                    self.policy
                        .attempt_timeout
                        .min(left.max(Duration::from_millis(50))),
                )
                .await;
            match outcome {
                Attempt::Done(r) => {
                    self.set_leader(target);
                    return Ok(r);
                }
                Attempt::Fail(e) => return Err(e),
                Attempt::Redirect(Some(addr)) if addr != target => {
                    self.set_leader(addr);
                    last_error = format!("{target} is not the leader");
                    // A named leader is tried at once, without backoff.
                    if Instant::now() < deadline {
                        continue;
                    }
                }
                Attempt::Redirect(_) => {
                    self.forget_leader(&target);
                    last_error = format!("{target} is not the leader and knows none");
                }
                Attempt::Retry(e) => {
                    self.forget_leader(&target);
                    last_error = format!("{target}: {e}");
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(MasterRpcError::Unavailable(last_error));
            }
            let jitter = rand::rng().random_range(0.5..1.5);
            let sleep = backoff.mul_f64(jitter).min(deadline - now);
            tokio::time::sleep(sleep).await;
            backoff = (backoff * 2).min(self.policy.max_backoff);
        }
    }

    async fn attempt<R, F, Fut>(&self, target: &str, f: &F, attempt_timeout: Duration) -> Attempt<R>
    where
        R: HasStatus,
        F: Fn(AuthedChannel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let channel = match self.channel(target) {
            Ok(c) => c,
            Err(e) => return Attempt::Retry(e.to_string()),
        };
        let call = tokio::time::timeout(attempt_timeout, f(channel));
        let outcome = tokio::select! {
            r = call => r,
            // A leader cut off by a partition answers nothing (packets are
            // dropped, no reset) until the attempt times out. If the other
            // masters meanwhile follow a new leader, go there: the request
            // carries its (client_id, seq), so a retry is applied once even
            // if the first attempt did commit.
            moved = self.leader_moved_away_from(target) => {
                return Attempt::Redirect(Some(moved));
            }
        };
        match outcome {
            Err(_) => Attempt::Retry("attempt timed out".into()),
            Ok(Err(status)) => match denied(&status) {
                Some(e) => Attempt::Fail(e),
                None => Attempt::Retry(format!("{}: {}", status.code(), status.message())),
            },
            Ok(Ok(resp)) => {
                let resp = resp.into_inner();
                let code = resp
                    .status()
                    .map(|s| s.error_code())
                    .unwrap_or(ErrorCode::Ok);
                match code {
                    ErrorCode::NotLeader => {
                        let hint = resp
                            .status()
                            .map(|s| s.leader_addr.clone())
                            .filter(|a| !a.is_empty());
                        Attempt::Redirect(hint)
                    }
                    ErrorCode::Unavailable | ErrorCode::RpcTimeout => {
                        Attempt::Retry(resp.status().map(|s| s.message.clone()).unwrap_or_default())
                    }
                    _ => Attempt::Done(resp),
                }
            }
        }
    }

    /// Resolves once another master names a leader other than `target`;
    /// never while `target` still leads. Starts looking only after
    /// [`LEADER_MOVE_CHECK_AFTER`]: a healthy leader answers long before.
    async fn leader_moved_away_from(&self, target: &str) -> String {
        tokio::time::sleep(LEADER_MOVE_CHECK_AFTER).await;
        loop {
            let others: Vec<String> = self.seeds().into_iter().filter(|s| s != target).collect();
            let asks = others.iter().map(|addr| async move {
                let ch = self.channel(addr).ok()?;
                let call =
                    async move { Self::cluster(ch).get_leader(pb::GetLeaderRequest {}).await };
                let r = tokio::time::timeout(Duration::from_millis(300), call)
                    .await
                    .ok()?
                    .ok()?
                    .into_inner();
                (r.leader_id != 0 && !r.leader_addr.is_empty() && r.leader_addr != target)
                    .then_some(r.leader_addr)
            });
            if let Some(addr) = futures::future::join_all(asks)
                .await
                .into_iter()
                .flatten()
                .next()
            {
                return addr;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Calls one specific master (no leader following), e.g. for status.
    pub async fn call_node<R, F, Fut>(&self, addr: &str, f: F) -> Result<R, MasterRpcError>
    where
        F: FnOnce(AuthedChannel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let ch = self.channel(addr)?;
        match tokio::time::timeout(Duration::from_secs(3), f(ch)).await {
            Err(_) => Err(MasterRpcError::Unavailable(format!("{addr}: timed out"))),
            Ok(Err(s)) => Err(denied(&s).unwrap_or_else(|| {
                MasterRpcError::Unavailable(format!("{addr}: {}", s.message()))
            })),
            Ok(Ok(r)) => Ok(r.into_inner()),
        }
    }

    /// One master's own view (role, term, indexes, counts), without leader following.
    pub async fn node_status(&self, addr: &str) -> Result<pb::GetStatusResponse, MasterRpcError> {
        self.call_node(addr, |ch| async move {
            Self::cluster(ch).get_status(pb::GetStatusRequest {}).await
        })
        .await
    }

    pub fn master(ch: AuthedChannel) -> MasterServiceClient<AuthedChannel> {
        MasterServiceClient::new(ch)
            .max_decoding_message_size(crescent_proto::MAX_GRPC_MESSAGE_BYTES)
            .max_encoding_message_size(crescent_proto::MAX_GRPC_MESSAGE_BYTES)
    }

    pub fn cluster(ch: AuthedChannel) -> ClusterServiceClient<AuthedChannel> {
        ClusterServiceClient::new(ch)
    }

    /// Asks the masters who leads: the first one that knows answers.
    pub async fn get_leader(&self) -> Result<pb::GetLeaderResponse, MasterRpcError> {
        let mut last = String::from("no masters configured");
        let deadline = Instant::now() + self.policy.deadline;
        loop {
            let mut targets: Vec<String> = self.cached_leader().into_iter().collect();
            targets.extend(self.seeds());
            for t in &targets {
                match self
                    .call_node(t, |ch| async move {
                        Self::cluster(ch).get_leader(pb::GetLeaderRequest {}).await
                    })
                    .await
                {
                    Ok(r) if r.status.as_ref().is_none_or(|s| s.is_ok()) && r.leader_id != 0 => {
                        return Ok(r)
                    }
                    Ok(r) => {
                        last = format!("{t}: {}", r.status.map(|s| s.message).unwrap_or_default())
                    }
                    // Refused for good: the token, not the cluster, is the problem.
                    Err(e) if e.code() == ErrorCode::PermissionDenied => return Err(e),
                    Err(e) => last = e.to_string(),
                }
            }
            if Instant::now() >= deadline {
                return Err(MasterRpcError::Unavailable(last));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// True when some master answers and names a leader that answers too,
    /// within `within`, or refuses this client's token (a master that
    /// answers is no outage: going local-only would hide the refusal behind
    /// puts that "succeed" in this process's memory). Used to detect outages
    /// and recoveries.
    pub async fn probe(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut targets: Vec<String> = self.cached_leader().into_iter().collect();
        targets.extend(self.seeds());
        for t in targets {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let Ok(ch) = self.channel(&t) else { continue };
            let call = async move { Self::cluster(ch).get_leader(pb::GetLeaderRequest {}).await };
            let answer = tokio::time::timeout(left, call).await;
            if let Ok(Err(status)) = &answer {
                if denied(status).is_some() {
                    return true;
                }
            }
            if let Ok(Ok(r)) = answer {
                let r = r.into_inner();
                if r.leader_id != 0 && !r.leader_addr.is_empty() {
                    if r.leader_addr == t {
                        self.set_leader(t);
                        return true;
                    }
                    self.set_leader(r.leader_addr);
                }
            }
        }
        false
    }

    // ---- MasterService operations ----

    fn check<R: HasStatus>(r: R) -> Result<R, MasterRpcError> {
        match r.status() {
            Some(s) if !s.is_ok() => Err(MasterRpcError::from_status(s)),
            _ => Ok(r),
        }
    }

    /// Mounts a segment under `key` (the store's own, random): masters sign
    /// its data-plane grants with it, and unmount and re-mount need it.
    pub async fn mount_segment(
        &self,
        spec: pb::SegmentSpec,
        key: &SegmentKey,
    ) -> Result<u64, MasterRpcError> {
        let header = self.header();
        let r = self
            .call_leader(|ch| {
                let req = pb::MountSegmentRequest {
                    header: Some(header.clone()),
                    segment: Some(spec.clone()),
                    segment_key: key.as_bytes().to_vec(),
                };
                async move { Self::master(ch).mount_segment(req).await }
            })
            .await?;
        Ok(Self::check(r)?.segment_id)
    }

    pub async fn unmount_segment(
        &self,
        segment_id: u64,
        key: &SegmentKey,
    ) -> Result<(), MasterRpcError> {
        let header = self.header();
        let r = self
            .call_leader(|ch| {
                let req = pb::UnmountSegmentRequest {
                    header: Some(header.clone()),
                    segment_id,
                    segment_key: key.as_bytes().to_vec(),
                };
                async move { Self::master(ch).unmount_segment(req).await }
            })
            .await?;
        Self::check(r).map(|_| ())
    }

    async fn batch_put_start_part(
        &self,
        items: Vec<pb::PutStartItem>,
        config: pb::ReplicateConfig,
        one_commit: bool,
    ) -> Result<Vec<pb::PutStartResult>, MasterRpcError> {
        let header = self.header();
        let r = self
            .call_leader(|ch| {
                let req = pb::BatchPutStartRequest {
                    header: Some(header.clone()),
                    items: items.clone(),
                    config: Some(config.clone()),
                    one_commit,
                };
                async move { Self::master(ch).batch_put_start(req).await }
            })
            .await?;
        Ok(Self::check(r)?.results)
    }

    async fn batch_put_end_part(
        &self,
        items: Vec<pb::PutEndItem>,
        config: Option<pb::ReplicateConfig>,
    ) -> Result<Vec<pb::Status>, MasterRpcError> {
        let (ended, _) = self
            .batch_put_end_placing_next(items, config, Vec::new())
            .await;
        ended
    }

    /// One BatchPutEnd (a part: see [`in_parts`]) that also asks the leader
    /// to place the writer's next puts (`next`, at most
    /// `crescent_proto::MAX_AHEAD_PER_REQUEST`) with `config`: the per-item
    /// answers, and the placements made ahead, each with the put id it was
    /// asked for. Those come whatever the commit's outcome.
    pub async fn batch_put_end_placing_next(
        &self,
        items: Vec<pb::PutEndItem>,
        config: Option<pb::ReplicateConfig>,
        next: Vec<pb::NextPut>,
    ) -> (
        Result<Vec<pb::Status>, MasterRpcError>,
        Vec<(u64, Placement)>,
    ) {
        let header = self.header();
        let asked = next.len();
        let r = self
            .call_leader(|ch| {
                let req = pb::BatchPutEndRequest {
                    header: Some(header.clone()),
                    items: items.clone(),
                    config: config.clone(),
                    next: next.clone(),
                };
                async move { Self::master(ch).batch_put_end(req).await }
            })
            .await;
        match r {
            Ok(mut r) => {
                let placed = std::mem::take(&mut r.next)
                    .into_iter()
                    .filter(|p| p.put_id != 0 && !p.replicas.is_empty())
                    .take(asked)
                    .map(|p| {
                        let placement = Placement {
                            replicas: p.replicas,
                            pending: true,
                            ahead: true,
                        };
                        (p.put_id, placement)
                    })
                    .collect();
                let ended = Self::check(r).and_then(|r| {
                    if r.results.len() == items.len() {
                        Ok(r.results)
                    } else {
                        // An item without its answer must not pass for done.
                        Err(MasterRpcError::Status {
                            code: ErrorCode::InternalError,
                            message: format!(
                                "BatchPutEnd answered {} results for {} items",
                                r.results.len(),
                                items.len()
                            ),
                        })
                    }
                });
                (ended, placed)
            }
            Err(e) => (Err(e), Vec::new()),
        }
    }

    async fn batch_put_revoke_part(
        &self,
        items: Vec<(String, u64)>,
    ) -> Result<Vec<pb::Status>, MasterRpcError> {
        let header = self.header();
        let (keys, put_ids): (Vec<String>, Vec<u64>) = items.into_iter().unzip();
        let r = self
            .call_leader(|ch| {
                let req = pb::BatchPutRevokeRequest {
                    header: Some(header.clone()),
                    keys: keys.clone(),
                    put_ids: put_ids.clone(),
                };
                async move { Self::master(ch).batch_put_revoke(req).await }
            })
            .await?;
        Ok(Self::check(r)?.results)
    }

    // Batch calls: a batch larger than one request may be
    // (`crescent_proto::MAX_BATCH_ITEMS` items or `MAX_BATCH_KEY_BYTES` of
    // keys) is sent as several requests in order, and the answers joined;
    // an error in one stops the rest and is returned (parts already sent
    // took effect: started puts are discarded by the master's timeout).
    pub async fn batch_put_start(
        &self,
        items: Vec<pb::PutStartItem>,
        config: pb::ReplicateConfig,
    ) -> Result<Vec<pb::PutStartResult>, MasterRpcError> {
        in_parts(
            items,
            |i| i.key.len(),
            |part| self.batch_put_start_part(part, config.clone(), false),
        )
        .await
    }

    /// [`batch_put_start`](Self::batch_put_start) asking for one commit per
    /// put: items answered `pending` were placed without a commit, and their
    /// PutEnd must carry the placement ([`batch_put_end_placed`](Self::batch_put_end_placed)).
    pub async fn batch_put_start_one_commit(
        &self,
        items: Vec<pb::PutStartItem>,
        config: pb::ReplicateConfig,
    ) -> Result<Vec<pb::PutStartResult>, MasterRpcError> {
        in_parts(
            items,
            |i| i.key.len(),
            |part| self.batch_put_start_part(part, config.clone(), true),
        )
        .await
    }

    pub async fn batch_put_end(
        &self,
        items: Vec<pb::PutEndItem>,
    ) -> Result<Vec<pb::Status>, MasterRpcError> {
        in_parts(
            items,
            |i| i.key.len(),
            |part| self.batch_put_end_part(part, None),
        )
        .await
    }

    /// BatchPutEnd whose pending items carry their placement and size, with
    /// the config their PutStart had.
    pub async fn batch_put_end_placed(
        &self,
        items: Vec<pb::PutEndItem>,
        config: pb::ReplicateConfig,
    ) -> Result<Vec<pb::Status>, MasterRpcError> {
        in_parts(
            items,
            |i| i.key.len(),
            |part| self.batch_put_end_part(part, Some(config.clone())),
        )
        .await
    }

    /// Revokes unfinished puts, each `(key, put id)`; id 0 revokes any
    /// unfinished put of the key by this client.
    pub async fn batch_put_revoke(
        &self,
        items: Vec<(String, u64)>,
    ) -> Result<Vec<pb::Status>, MasterRpcError> {
        in_parts(
            items,
            |(k, _)| k.len(),
            |part| self.batch_put_revoke_part(part),
        )
        .await
    }

    /// A fresh name for one of this client's puts (never 0), for PutStart's
    /// `put_id` and the PutEnd or PutRevoke that finishes it.
    pub fn new_put_id(&self) -> u64 {
        self.next_put_id.fetch_add(1, Ordering::Relaxed)
    }

    pub async fn batch_get_replica_list(
        &self,
        keys: Vec<String>,
    ) -> Result<Vec<pb::GetReplicaListResponse>, MasterRpcError> {
        in_parts(keys, String::len, |part| {
            self.batch_get_replica_list_part(part)
        })
        .await
    }

    pub async fn batch_exists(
        &self,
        keys: Vec<String>,
    ) -> Result<Vec<pb::ExistResponse>, MasterRpcError> {
        in_parts(keys, String::len, |part| self.batch_exists_part(part)).await
    }

    pub async fn batch_remove(
        &self,
        keys: Vec<String>,
        force: bool,
    ) -> Result<Vec<pb::Status>, MasterRpcError> {
        in_parts(keys, String::len, |part| {
            self.batch_remove_part(part, force)
        })
        .await
    }

    /// An unnamed PutStart (put id 0); see [`put_start_named`](Self::put_start_named).
    pub async fn put_start(
        &self,
        key: &str,
        size: u64,
        config: pb::ReplicateConfig,
    ) -> Result<Vec<pb::ReplicaDescriptor>, MasterRpcError> {
        self.put_start_named(key, size, config, 0).await
    }

    /// PutStart of the put this client names `put_id` (from [`new_put_id`](Self::new_put_id)).
    pub async fn put_start_named(
        &self,
        key: &str,
        size: u64,
        config: pb::ReplicateConfig,
        put_id: u64,
    ) -> Result<Vec<pb::ReplicaDescriptor>, MasterRpcError> {
        let header = self.header();
        let r = self
            .call_leader(|ch| {
                let req = pb::PutStartRequest {
                    header: Some(header.clone()),
                    key: key.to_string(),
                    size,
                    config: Some(config.clone()),
                    put_id,
                    one_commit: false,
                };
                async move { Self::master(ch).put_start(req).await }
            })
            .await?;
        Ok(Self::check(r)?.replicas)
    }

    /// PutStart asking for one commit per put: a `pending` placement was
    /// made without a commit, and [`put_end_placed`](Self::put_end_placed)
    /// records it with the object in one.
    pub async fn put_start_placed(
        &self,
        key: &str,
        size: u64,
        config: pb::ReplicateConfig,
        put_id: u64,
    ) -> Result<Placement, MasterRpcError> {
        let header = self.header();
        let r = self
            .call_leader(|ch| {
                let req = pb::PutStartRequest {
                    header: Some(header.clone()),
                    key: key.to_string(),
                    size,
                    config: Some(config.clone()),
                    put_id,
                    one_commit: true,
                };
                async move { Self::master(ch).put_start(req).await }
            })
            .await?;
        let r = Self::check(r)?;
        Ok(Placement {
            replicas: r.replicas,
            pending: r.pending,
            ahead: false,
        })
    }

    /// Gives back a placement made ahead and not used.
    pub async fn put_revoke_ahead(&self, put_id: u64) -> Result<(), MasterRpcError> {
        let header = self.header();
        let r = self
            .call_leader_within(AHEAD_DEADLINE, |ch| {
                let req = pb::PutRevokeRequest {
                    header: Some(header.clone()),
                    key: String::new(),
                    put_id,
                    ahead: true,
                };
                async move { Self::master(ch).put_revoke(req).await }
            })
            .await?;
        Self::check(r).map(|_| ())
    }

    /// PutEnd of a put started with [`put_start_placed`](Self::put_start_placed):
    /// carries the placement when it is pending.
    pub async fn put_end_placed(
        &self,
        key: &str,
        checksum: u32,
        put_id: u64,
        placement: &Placement,
        size: u64,
        config: &pb::ReplicateConfig,
    ) -> Result<(), MasterRpcError> {
        self.put_end_placing_next(key, checksum, put_id, placement, size, config, 0)
            .await
            .0
    }

    /// [`put_end_placed`](Self::put_end_placed) that also asks the leader
    /// to place this client's next put, of the same size and config, named
    /// `next_put_id` (not 0), while this one commits: that placement, if the
    /// leader made one, whatever became of this put.
    #[allow(clippy::too_many_arguments)]
    pub async fn put_end_placing_next(
        &self,
        key: &str,
        checksum: u32,
        put_id: u64,
        placement: &Placement,
        size: u64,
        config: &pb::ReplicateConfig,
        next_put_id: u64,
    ) -> (Result<(), MasterRpcError>, Option<Placement>) {
        let header = self.header();
        let replicas = if placement.pending {
            placement.replicas.clone()
        } else {
            Vec::new()
        };
        // The next placement is made with this config too.
        let config = (placement.pending || next_put_id != 0).then(|| config.clone());
        let r = self
            .call_leader(|ch| {
                let req = pb::PutEndRequest {
                    header: Some(header.clone()),
                    key: key.to_string(),
                    checksum,
                    put_id,
                    placement: replicas.clone(),
                    size,
                    config: config.clone(),
                    ahead: placement.ahead,
                    next_put_id,
                };
                async move { Self::master(ch).put_end(req).await }
            })
            .await;
        match r {
            Ok(mut r) => {
                let next = std::mem::take(&mut r.next);
                let next = (next_put_id != 0 && !next.is_empty()).then_some(Placement {
                    replicas: next,
                    pending: true,
                    ahead: true,
                });
                (Self::check(r).map(|_| ()), next)
            }
            Err(e) => (Err(e), None),
        }
    }

    /// An unnamed PutEnd: finishes this client's unfinished put of `key`, whichever it is.
    pub async fn put_end(&self, key: &str, checksum: u32) -> Result<(), MasterRpcError> {
        self.put_end_named(key, checksum, 0).await
    }

    /// PutEnd of the put named `put_id` only.
    pub async fn put_end_named(
        &self,
        key: &str,
        checksum: u32,
        put_id: u64,
    ) -> Result<(), MasterRpcError> {
        let header = self.header();
        let r = self
            .call_leader(|ch| {
                let req = pb::PutEndRequest {
                    header: Some(header.clone()),
                    key: key.to_string(),
                    checksum,
                    put_id,
                    ..Default::default()
                };
                async move { Self::master(ch).put_end(req).await }
            })
            .await?;
        Self::check(r).map(|_| ())
    }

    /// An unnamed PutRevoke: revokes this client's unfinished put of `key`.
    pub async fn put_revoke(&self, key: &str) -> Result<(), MasterRpcError> {
        self.put_revoke_named(key, 0).await
    }

    /// PutRevoke of the put named `put_id` only.
    pub async fn put_revoke_named(&self, key: &str, put_id: u64) -> Result<(), MasterRpcError> {
        let header = self.header();
        let r = self
            .call_leader(|ch| {
                let req = pb::PutRevokeRequest {
                    header: Some(header.clone()),
                    key: key.to_string(),
                    put_id,
                    ahead: false,
                };
                async move { Self::master(ch).put_revoke(req).await }
            })
            .await?;
        Self::check(r).map(|_| ())
    }

    pub async fn get_replica_list(
        &self,
        key: &str,
    ) -> Result<pb::GetReplicaListResponse, MasterRpcError> {
        let r = self
            .call_leader(|ch| {
                let req = pb::GetReplicaListRequest {
                    key: key.to_string(),
                };
                async move { Self::master(ch).get_replica_list(req).await }
            })
            .await?;
        Self::check(r)
    }

    async fn batch_get_replica_list_part(
        &self,
        keys: Vec<String>,
    ) -> Result<Vec<pb::GetReplicaListResponse>, MasterRpcError> {
        let r = self
            .call_leader(|ch| {
                let req = pb::BatchGetReplicaListRequest { keys: keys.clone() };
                async move { Self::master(ch).batch_get_replica_list(req).await }
            })
            .await?;
        Ok(Self::check(r)?.results)
    }

    pub async fn exists(&self, key: &str) -> Result<bool, MasterRpcError> {
        let r = self
            .call_leader(|ch| {
                let req = pb::ExistRequest {
                    key: key.to_string(),
                };
                async move { Self::master(ch).exist(req).await }
            })
            .await?;
        Ok(Self::check(r)?.exists)
    }

    async fn batch_exists_part(
        &self,
        keys: Vec<String>,
    ) -> Result<Vec<pb::ExistResponse>, MasterRpcError> {
        let r = self
            .call_leader(|ch| {
                let req = pb::BatchExistRequest { keys: keys.clone() };
                async move { Self::master(ch).batch_exist(req).await }
            })
            .await?;
        Ok(Self::check(r)?.results)
    }

    pub async fn remove(&self, key: &str, force: bool) -> Result<(), MasterRpcError> {
        let header = self.header();
        let r = self
            .call_leader(|ch| {
                let req = pb::RemoveRequest {
                    header: Some(header.clone()),
                    key: key.to_string(),
                    force,
                };
                async move { Self::master(ch).remove(req).await }
            })
            .await?;
        Self::check(r).map(|_| ())
    }

    async fn batch_remove_part(
        &self,
        keys: Vec<String>,
        force: bool,
    ) -> Result<Vec<pb::Status>, MasterRpcError> {
        let header = self.header();
        let r = self
            .call_leader(|ch| {
                let req = pb::BatchRemoveRequest {
                    header: Some(header.clone()),
                    keys: keys.clone(),
                    force,
                };
                async move { Self::master(ch).batch_remove(req).await }
            })
            .await?;
        Ok(Self::check(r)?.results)
    }

    pub async fn remove_by_regex(&self, regex: &str, force: bool) -> Result<u64, MasterRpcError> {
        let header = self.header();
        let r = self
            .call_leader(|ch| {
                let req = pb::RemoveByRegexRequest {
                    header: Some(header.clone()),
                    regex: regex.to_string(),
                    force,
                };
                async move { Self::master(ch).remove_by_regex(req).await }
            })
            .await?;
        Ok(Self::check(r)?.count)
    }

    pub async fn remove_all(&self, force: bool) -> Result<u64, MasterRpcError> {
        let header = self.header();
        let r = self
            .call_leader(|ch| {
                let req = pb::RemoveAllRequest {
                    header: Some(header.clone()),
                    force,
                };
                async move { Self::master(ch).remove_all(req).await }
            })
            .await?;
        Ok(Self::check(r)?.count)
    }

    /// One heartbeat, given up after `within` (so a store retries every
    /// interval): its result, and the leader's clock when it answered.
    pub async fn heartbeat(
        &self,
        segment_ids: Vec<u64>,
        within: Duration,
    ) -> Result<(pb::HeartbeatResult, u64), MasterRpcError> {
        let r = self
            .call_leader_within(within, |ch| {
                let req = pb::HeartbeatRequest {
                    client_id: self.client_id.clone(),
                    segment_ids: segment_ids.clone(),
                };
                async move { Self::master(ch).heartbeat(req).await }
            })
            .await?;
        let r = Self::check(r)?;
        let result =
            pb::HeartbeatResult::try_from(r.result).unwrap_or(pb::HeartbeatResult::HeartbeatOk);
        Ok((result, r.leader_time_ms))
    }
}

/// Sends `items` in parts a master accepts (see
/// [`crescent_proto::split_batch`]) and joins the answers in order.
async fn in_parts<T, R, Fut>(
    items: Vec<T>,
    key_len: impl Fn(&T) -> usize,
    mut send: impl FnMut(Vec<T>) -> Fut,
) -> Result<Vec<R>, MasterRpcError>
where
    Fut: Future<Output = Result<Vec<R>, MasterRpcError>>,
{
    let mut answers = Vec::with_capacity(items.len());
    for part in crescent_proto::split_batch(items, key_len) {
        answers.extend(send(part).await?);
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Cause(&'static str);
    impl std::fmt::Display for Cause {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Cause {}

    fn status_caused_by(code: tonic::Code, cause: &'static str) -> tonic::Status {
        let mut s = tonic::Status::new(code, "transport error");
        s.set_source(std::sync::Arc::new(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            Cause(cause),
        )));
        s
    }

    #[test]
    fn tls_refusals_are_final_and_outages_are_not() {
        for cause in [
            "invalid peer certificate: UnknownIssuer",
            "received fatal alert: CertificateRequired",
            "received corrupt message of type InvalidContentType",
            "connection error detected: frame with invalid size",
        ] {
            let err = denied(&status_caused_by(tonic::Code::Unknown, cause))
                .unwrap_or_else(|| panic!("{cause} taken for an outage"));
            assert_eq!(err.code(), ErrorCode::PermissionDenied, "{cause}");
        }
        for cause in [
            "Connection refused (os error 111)",
            "stream closed because of a broken pipe",
            "connection closed",
        ] {
            assert!(
                denied(&status_caused_by(tonic::Code::Unavailable, cause)).is_none(),
                "{cause} is an outage, to be retried"
            );
        }
        assert!(denied(&tonic::Status::unavailable("leader changed")).is_none());
        assert!(denied(&tonic::Status::permission_denied("role")).is_some());
    }

    #[test]
    fn master_lists() {
        assert_eq!(parse_master_list("a:1, b:2").unwrap(), vec!["a:1", "b:2"]);
        assert_eq!(parse_master_list("http://a:1").unwrap(), vec!["a:1"]);
        assert!(parse_master_list("").is_err());
        assert!(parse_master_list("a").is_err());
        assert!(parse_master_list("a:x").is_err());
    }

    #[test]
    fn headers_are_unique_per_write() {
        let c = MasterClient::new("127.0.0.1:1").unwrap();
        let a = c.header();
        let b = c.header();
        assert_eq!(a.client_id, b.client_id);
        assert_ne!(a.request_seq, b.request_seq);
    }
}
