//! Wires the gRPC services of one master onto one listener.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crescent_proto::pb::cluster_service_server::ClusterServiceServer;
use crescent_proto::pb::master_service_server::MasterServiceServer;
use crescent_proto::pb::raft_service_server::RaftServiceServer;
use crescent_raft::network::MAX_RAFT_MESSAGE_BYTES;
use tokio::net::TcpListener;

use crate::cluster::ClusterApi;
use crate::node::MasterNode;
use crate::service::MasterApi;
use crescent_runtime::conn_limit::{self, CappedListener};

/// Longest any gRPC request may run on the server; every handler bounds its
/// own work well below it (writes by `--write-timeout`, a leadership
/// transfer to a few seconds, a snapshot chunk by its size).
pub const GRPC_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Requests served at once on one connection; more wait in HTTP/2 flow control.
pub const GRPC_CONCURRENCY_PER_CONNECTION: usize = 1024;

/// Serves MasterService, ClusterService and RaftService until `shutdown` resolves.
pub async fn serve(
    node: Arc<MasterNode>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let max = crescent_proto::MAX_GRPC_MESSAGE_BYTES;
    let master = MasterServiceServer::new(MasterApi::new(node.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let cluster = ClusterServiceServer::new(ClusterApi::new(node.clone()));
    let raft = RaftServiceServer::new(node.raft_service())
        .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES);
    // At most --max-connections connections, silent ones closed (idle
    // connections once exhausted the leader's file descriptors).
    let incoming = CappedListener::new(
        listener,
        node.config().max_connections,
        conn_limit::GRPC_IDLE_TIMEOUT,
    );
    let router = tonic::transport::Server::builder()
        // Dead or vanished peers are noticed and their connections dropped;
        // no request runs unbounded; one connection cannot queue unbounded
        // work (nothing bounded the gRPC server).
        .tcp_keepalive(Some(Duration::from_secs(60)))
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .timeout(GRPC_REQUEST_TIMEOUT)
        .concurrency_limit_per_connection(GRPC_CONCURRENCY_PER_CONNECTION)
        // Before any service: each method's role (without it an
        // outsider could wipe keys, forge Raft traffic and take over).
        .layer(crate::auth_layer::AuthLayer::new(node.verifier().clone()))
        .add_service(master)
        .add_service(cluster)
        .add_service(raft);
    match node.serving_tls() {
        None => {
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await?
        }
        Some(tls) => {
            // Our own handshakes rather than tonic's TLS, whose certificate
            // is fixed at start: these take the current one (SIGHUP).
            let tls = tls.clone();
            let (incoming, _accepting) = conn_limit::tls_incoming(
                incoming,
                Arc::new(move || tls.grpc_acceptor()),
                crescent_auth::tls::HANDSHAKE_TIMEOUT,
            );
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await?
        }
    }
    Ok(())
}

/// A running master inside this process (used by `main` and by tests).
pub struct RunningMaster {
    pub node: Arc<MasterNode>,
    pub addr: std::net::SocketAddr,
    /// Where the admin/metrics HTTP server listens.
    pub http_addr: std::net::SocketAddr,
    http: tokio::task::JoinHandle<()>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<anyhow::Result<()>>,
    watch: tokio::task::JoinHandle<()>,
}

impl RunningMaster {
    /// Starts a master on an already bound listener.
    pub async fn start(
        config: crate::config::MasterConfig,
        listener: TcpListener,
    ) -> anyhow::Result<Self> {
        let addr = listener.local_addr()?;
        let http_addr = config.http;
        let node = MasterNode::start(config).await?;
        let http_listener = tokio::net::TcpListener::bind(http_addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen for HTTP on {http_addr}: {e}"))?;
        let http_bound = http_listener.local_addr()?;
        let router = crate::http::router(node.clone());
        let http_listener = CappedListener::new(
            http_listener,
            conn_limit::MAX_HTTP_CONNECTIONS,
            conn_limit::HTTP_IDLE_TIMEOUT,
        );
        let https = node
            .serving_tls()
            .cloned()
            .map(|tls| -> conn_limit::TlsSource { Arc::new(move || tls.http_acceptor()) });
        let scheme = if https.is_some() { "https" } else { "http" };
        let http = tokio::spawn(conn_limit::serve_http(
            http_listener,
            router,
            conn_limit::HTTP_HEADER_READ_TIMEOUT,
            https,
        ));
        tracing::info!(%http_bound, scheme, "admin/metrics HTTP listening");
        let watch = tokio::spawn(crate::leader::run_leadership_watch(node.clone()));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(node.clone(), listener, async {
            let _ = rx.await;
        }));
        Ok(Self {
            node,
            addr,
            http_addr: http_bound,
            http,
            stop: Some(tx),
            server,
            watch,
        })
    }

    /// Stops serving and shuts the Raft node down. Its aborted tasks are
    /// dropped asynchronously, so the Raft store may stay open (locked) for
    /// a moment after this returns; a restart in the same process on the
    /// same data dir retries (see `master/tests/it/one_node.rs`).
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = self.node.shutdown().await;
        self.watch.abort();
        self.http.abort();
        let _ = (&mut self.server).await;
    }

    /// Resolves when the server task ends (error or shutdown).
    pub async fn wait(&mut self) -> anyhow::Result<()> {
        match (&mut self.server).await {
            Ok(r) => r,
            Err(e) => Err(e.into()),
        }
    }
}
