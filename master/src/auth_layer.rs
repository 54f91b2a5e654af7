//! The gRPC port's gate: every request is checked against the role its
//! method needs ([`crescent_auth::role_for_grpc_path`]) before any service
//! sees it, so no handler can forget the check. A request that carries a
//! request id ([`crescent_proto::request_id`]) is served inside a `grpc`
//! span with its method and that id, so what the handler and its proposal
//! log can be tied to one engine call.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crescent_auth::{role_for_grpc_path, Verifier};
use crescent_proto::request_id::{RequestId, HEADER};
use tracing::Instrument;

/// Wraps the gRPC routes with [`AuthService`].
#[derive(Clone)]
pub struct AuthLayer {
    verifier: Arc<Verifier>,
}

impl AuthLayer {
    pub fn new(verifier: Arc<Verifier>) -> Self {
        Self { verifier }
    }
}

impl<S> tower_layer::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            verifier: self.verifier.clone(),
        }
    }
}

/// Answers a request without the needed role with UNAUTHENTICATED or
/// PERMISSION_DENIED; passes the rest to `inner`.
#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    verifier: Arc<Verifier>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower_service::Service<http::Request<B>> for AuthService<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        let request_id = request
            .headers()
            .get(HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(RequestId::parse);
        // Only calls made for an engine's request carry an id; Raft traffic
        // and other calls get no span, so they cost nothing here.
        let span = match request_id {
            Some(id) => tracing::info_span!("grpc", method = path, request_id = %id),
            None => tracing::Span::none(),
        };
        let _entered = span.enter();
        let needed = role_for_grpc_path(path);
        let authorization = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        match self.verifier.check(authorization, needed) {
            Ok(()) => Box::pin(self.inner.call(request).instrument(span.clone())),
            Err(denied) => {
                tracing::debug!(%denied, "refused a gRPC request");
                let status: tonic::Status = denied.into();
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}
