//! Mutual TLS on the data port: the handshake within its slot and
//! deadline, and a clear-text peer told so with a TLS alert.

use super::*;
use tracing::Instrument;

/// Accepts connections forever (until the task is dropped): with `tls`,
/// mutual TLS only, each connection with the acceptor `tls` holds when it
/// is accepted (so a [`ServingTls::reload`] reaches every later
/// connection); without, clear text. `local` lists the segments of this
/// process a COPY may write to; `segment` is added to it.
///
/// Dropping the task closes every connection it accepted too. Each holds
/// the segment, so a segment that stops being served is released at once:
/// a disk segment's file lock with it, which a process that serves the
/// same directory again (an engine's client reconnecting) waits for.
pub async fn serve_tls(
    segment: Arc<Segment>,
    listener: TcpListener,
    stats: Arc<TransferStats>,
    limits: ServeLimits,
    tls: Option<Arc<ServingTls>>,
    local: LocalSegments,
) {
    local.add(&segment, &stats);
    let limits = Arc::new(limits);
    let mut connections = tokio::task::JoinSet::<()>::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            // Reaps finished connections, so the set holds live ones only.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        match accepted {
            Ok((stream, peer)) => {
                if stats.connections.load(Ordering::Relaxed) >= limits.max_connections {
                    stats.rejected_connections.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, max = limits.max_connections, "too many transfer connections; closing a new one");
                    drop(stream);
                    continue;
                }
                let _ = stream.set_nodelay(true);
                let segment = segment.clone();
                let stats = stats.clone();
                let limits = limits.clone();
                let local = local.clone();
                let acceptor = tls.as_ref().map(|tls| tls.data_acceptor());
                // Counted from here, handshake included: a connection
                // stuck in its handshake holds a slot like any other.
                stats.connections.fetch_add(1, Ordering::Relaxed);
                let span = tracing::info_span!("conn", %peer);
                connections.spawn(
                    async move {
                        let served = match acceptor {
                            None => {
                                let (r, w) = stream.into_split();
                                handle(segment, &local, r, w, &stats, &limits, true).await
                            }
                            Some(acceptor) => {
                                handle_tls(segment, &local, stream, acceptor, &stats, &limits).await
                            }
                        };
                        if let Err(e) = served {
                            stats.rejected_connections.fetch_add(1, Ordering::Relaxed);
                            if matches!(e, ConnError::Tls(_) | ConnError::TlsOnClearText) {
                                stats.tls_refused.fetch_add(1, Ordering::Relaxed);
                            }
                            tracing::warn!(%peer, error = %e, "closing transfer connection");
                        }
                        stats.connections.fetch_sub(1, Ordering::Relaxed);
                    }
                    .instrument(span),
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves one connection over mutual TLS once its handshake is done, the
/// handshake bounded by `limits.handshake_timeout`.
pub(super) async fn handle_tls(
    segment: Arc<Segment>,
    local: &LocalSegments,
    stream: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    stats: &TransferStats,
    limits: &ServeLimits,
) -> Result<(), ConnError> {
    let accept = acceptor.accept(stream).into_fallible();
    match tokio::time::timeout(limits.handshake_timeout, accept).await {
        Err(_) => Err(ConnError::Tls(format!(
            "handshake not done within {:?}",
            limits.handshake_timeout
        ))),
        Ok(Err((e, mut stream))) => {
            // rustls has written its alert (an untrusted or missing
            // certificate, clear text where TLS was expected). Send it
            // with a FIN and read what the peer still sends for a moment:
            // closing with unread bytes — a TLS 1.3 client sends its first
            // request right after its side of the handshake — makes the
            // kernel send a reset, which can destroy the alert before the
            // peer reads it, leaving it "connection reset" instead of why.
            let _ = stream.shutdown().await;
            drain(&mut stream, REFUSED_PAYLOAD_DRAIN).await;
            Err(ConnError::Tls(e.to_string()))
        }
        Ok(Ok(tls)) => {
            let (r, w) = tokio::io::split(tls);
            handle(segment, local, r, w, stats, limits, false).await
        }
    }
}

/// The start of a TLS handshake record (a ClientHello): content type 22,
/// protocol version 3.x.
pub(super) fn is_tls_client_hello(hdr: &[u8]) -> bool {
    hdr.len() >= 5 && hdr[0] == 0x16 && hdr[1] == 0x03
}

/// A fatal TLS alert (handshake_failure) as a clear-text record: what a
/// TLS client that reached a clear-text data port gets, so it reports a
/// TLS refusal at once rather than a reset connection.
pub(super) const TLS_HANDSHAKE_FAILURE_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28];

/// Reads the rest of the ClientHello record `hdr` begins (briefly: it is
/// a few hundred bytes), so closing sends no reset that could destroy the
/// alert, then sends the alert.
pub(super) async fn refuse_tls_client<R, W>(r: &mut R, w: &mut W, hdr: &[u8; REQUEST_LEN])
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let record = 5 + u64::from(u16::from_be_bytes([hdr[3], hdr[4]]));
    drain(r, record.saturating_sub(REQUEST_LEN as u64)).await;
    let answer = async {
        w.write_all(&TLS_HANDSHAKE_FAILURE_ALERT).await?;
        w.flush().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), answer).await;
}
