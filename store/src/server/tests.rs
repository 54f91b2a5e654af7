//! Real sockets on loopback, with small limits so the bounds show within
//! a test; every wait is capped by a generous deadline.

use super::*;
use crate::protocol::{Grant, RESPONSE_LEN};
use crescent_auth::capability::SegmentKey;
use std::sync::LazyLock;
use std::time::Instant;

const SEGMENT_ID: u64 = 7;
static KEY: LazyLock<SegmentKey> = LazyLock::new(SegmentKey::generate);

async fn serve_segment(segment: Arc<Segment>, limits: ServeLimits) -> (String, Arc<TransferStats>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stats = Arc::new(TransferStats::default());
    tokio::spawn(serve(segment, listener, stats.clone(), limits));
    (addr, stats)
}

async fn start(limits: ServeLimits) -> (String, Arc<TransferStats>) {
    let segment = Segment::anonymous(4 << 20).unwrap();
    segment.set_mounted(SEGMENT_ID, &KEY);
    serve_segment(segment, limits).await
}

fn small_limits() -> ServeLimits {
    ServeLimits {
        max_connections: 2,
        idle_timeout: Duration::from_millis(300),
        request_base: Duration::from_millis(300),
        min_bytes_per_sec: 1 << 30,
        grant_clock_skew: Duration::ZERO,
        handshake_timeout: Duration::from_millis(300),
        clock: Arc::default(),
    }
}

/// A grant for exactly `[offset, offset+len)`, signed with `key`.
fn grant(key: &SegmentKey, op: Op, offset: u64, len: u64, expiry_ms: u64) -> Grant {
    let mut g = Grant {
        segment_id: SEGMENT_ID,
        offset,
        len,
        expiry_ms,
        mac: [0; 16],
    };
    if let Some(access) = op.access() {
        g.mac = key.sign(&g.capability(access));
    }
    g
}

fn request_under(op: Op, id: u64, offset: u64, len: u64, grant: Grant) -> [u8; REQUEST_LEN] {
    Request {
        op,
        request_id: id,
        offset,
        len,
        grant,
    }
    .encode()
}

/// A request under a valid grant for exactly its range.
fn request(op: Op, id: u64, offset: u64, len: u64) -> [u8; REQUEST_LEN] {
    let g = grant(&KEY, op, offset, len, now_ms() + 60_000);
    request_under(op, id, offset, len, g)
}

async fn answer(s: &mut TcpStream) -> Response {
    let mut hdr = [0u8; RESPONSE_LEN];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut hdr))
        .await
        .expect("answer within 10 s")
        .unwrap();
    Response::decode(&hdr).unwrap()
}

/// Sends one request (with `payload` for a write) on a new connection
/// and returns the status of the answer.
async fn status_of(addr: &str, req: [u8; REQUEST_LEN], payload: &[u8]) -> Status {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&req).await.unwrap();
    s.write_all(payload).await.unwrap();
    answer(&mut s).await.status
}

#[tokio::test]
async fn a_store_whose_clock_is_off_honours_no_grant() {
    let clock = Arc::new(ClockCheck::default());
    let (addr, stats) = start(ServeLimits {
        max_connections: 64,
        clock: clock.clone(),
        ..small_limits()
    })
    .await;
    let write = || request(Op::Write, 1, 0, 8);
    assert_eq!(status_of(&addr, write(), b"12345678").await, Status::Ok);
    // The leader answers a heartbeat an hour ahead of this store.
    let now = now_ms();
    clock.observe(now, now + 3_600_000, now + 5);
    for (op, payload) in [(Op::Write, &b"abcdefgh"[..]), (Op::Read, &[][..])] {
        let st = status_of(&addr, request(op, 2, 0, 8), payload).await;
        assert_eq!(st, Status::Forbidden, "{op:?} under a valid grant");
    }
    assert_eq!(stats.forbidden.load(Ordering::Relaxed), 2);
    clock.observe(now, now + 1, now + 5);
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&request(Op::Read, 3, 0, 8)).await.unwrap();
    assert_eq!(answer(&mut s).await.status, Status::Ok);
    let mut got = [0u8; 8];
    s.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"12345678", "the refused write changed nothing");
}

#[tokio::test]
async fn only_requests_under_a_valid_grant_are_served() {
    let (addr, stats) = start(ServeLimits {
        max_connections: 64,
        ..small_limits()
    })
    .await;
    let now = now_ms();
    let later = now + 60_000;
    // A valid write then read of the same range.
    let g = grant(&KEY, Op::Write, 4096, 8, later);
    let st = status_of(&addr, request_under(Op::Write, 1, 4096, 8, g), b"12345678").await;
    assert_eq!(st, Status::Ok);
    let g = grant(&KEY, Op::Read, 4096, 8, later);
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&request_under(Op::Read, 2, 4096, 8, g))
        .await
        .unwrap();
    assert_eq!(answer(&mut s).await.status, Status::Ok);
    let mut got = [0u8; 8];
    s.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"12345678");
    // Part of a granted range is served too.
    let st = status_of(&addr, request_under(Op::Read, 3, 4100, 4, g), &[]).await;
    assert_eq!(st, Status::Ok);

    let refused = [
        (
            "no grant",
            request_under(
                Op::Read,
                4,
                4096,
                8,
                Grant {
                    segment_id: SEGMENT_ID,
                    ..Default::default()
                },
            ),
        ),
        (
            "another key",
            request_under(
                Op::Read,
                5,
                4096,
                8,
                grant(&SegmentKey::generate(), Op::Read, 4096, 8, later),
            ),
        ),
        (
            "expired",
            request_under(
                Op::Read,
                6,
                4096,
                8,
                grant(&KEY, Op::Read, 4096, 8, now - 1_000),
            ),
        ),
        ("past the range", request_under(Op::Read, 7, 4096, 9, g)),
        ("before the range", request_under(Op::Read, 8, 4095, 8, g)),
        (
            "widened grant",
            request_under(
                Op::Read,
                9,
                0,
                1 << 20,
                Grant {
                    offset: 0,
                    len: 1 << 20,
                    ..g
                },
            ),
        ),
        (
            "a read grant used to write",
            request_under(Op::Write, 10, 4096, 8, g),
        ),
    ];
    for (what, req) in refused {
        // A refused write's payload is read and dropped, never stored.
        let is_write = Request::decode(&req).unwrap().op == Op::Write;
        let payload: &[u8] = if is_write { b"XXXXXXXX" } else { b"" };
        assert_eq!(
            status_of(&addr, req, payload).await,
            Status::Forbidden,
            "{what}"
        );
    }
    assert_eq!(stats.forbidden.load(Ordering::Relaxed), 7);
    // The refused write changed nothing.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&request_under(Op::Read, 11, 4096, 8, g))
        .await
        .unwrap();
    assert_eq!(answer(&mut s).await.status, Status::Ok);
    s.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"12345678");
    // A grant for another segment id is a wrong-segment answer.
    let other = Grant {
        segment_id: SEGMENT_ID + 1,
        ..g
    };
    let st = status_of(&addr, request_under(Op::Read, 12, 4096, 8, other), &[]).await;
    assert_eq!(st, Status::WrongSegment);
}

#[tokio::test]
async fn a_disk_segment_is_served_under_grants_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let size = 8 << 20;
    let (segment, _) =
        Segment::disk(dir.path(), "disk", size, crate::OtherCapacity::Refuse).unwrap();
    segment.set_mounted(SEGMENT_ID, &KEY);
    let (addr, stats) = serve_segment(
        segment.clone(),
        ServeLimits {
            max_connections: 64,
            ..tls_limits()
        },
    )
    .await;
    let transport = crate::TcpTransport::new();
    // 1 MiB (one piece) at an odd offset, then a transfer of several
    // pieces ending at the segment's last byte.
    let mib: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    let got = round_trip(&transport, &addr, 12_345, &mib).await.unwrap();
    assert!(got == mib, "bytes differ");
    let tail: Vec<u8> = (0..(3 * DISK_PIECE + 17)).map(|i| (i % 13) as u8).collect();
    let at = size - tail.len() as u64;
    let got = round_trip(&transport, &addr, at, &tail).await.unwrap();
    assert!(got == tail, "bytes differ");
    // On disk, where the segment says.
    let mut direct = vec![0u8; mib.len()];
    segment.read_at(12_345, &mut direct).unwrap();
    assert!(direct == mib, "bytes on disk differ");
    let moved = (mib.len() + tail.len()) as u64;
    assert_eq!(stats.disk_bytes_written.load(Ordering::Relaxed), moved);
    assert_eq!(stats.disk_bytes_read.load(Ordering::Relaxed), moved);
    assert_eq!(stats.bytes_read.load(Ordering::Relaxed), moved);
    // Reads go out in pieces of DISK_READ_PIECE (the next read while
    // the last is sent), writes come in pieces of DISK_PIECE.
    let pieces = |len: usize, piece: usize| len.div_ceil(piece) as u64;
    assert_eq!(
        stats.disk_reads.load(Ordering::Relaxed),
        pieces(mib.len(), DISK_READ_PIECE) + pieces(tail.len(), DISK_READ_PIECE)
    );
    assert_eq!(stats.disk_writes.load(Ordering::Relaxed), 1 + 4);
    assert_eq!(stats.disk_errors.load(Ordering::Relaxed), 0);

    // Out of range under a grant for that range: refused, nothing read.
    for (id, offset, len) in [(1, size - 4, 8), (2, size, 1)] {
        let st = status_of(&addr, request(Op::Read, id, offset, len), &[]).await;
        assert_eq!(st, Status::OutOfRange, "[{offset}, +{len})");
    }
    // A range that wraps around u64 is refused by the grant check first.
    let st = status_of(&addr, request(Op::Read, 3, u64::MAX - 2, 8), &[]).await;
    assert_eq!(st, Status::Forbidden);
    let st = status_of(&addr, request(Op::Write, 4, size - 1, 2), b"xx").await;
    assert_eq!(st, Status::OutOfRange);
    assert_eq!(stats.disk_bytes_read.load(Ordering::Relaxed), moved);
    assert_eq!(stats.disk_bytes_written.load(Ordering::Relaxed), moved);
    // Without a valid grant: forbidden, as for memory.
    let foreign = grant(&SegmentKey::generate(), Op::Read, 0, 8, now_ms() + 60_000);
    let st = status_of(&addr, request_under(Op::Read, 5, 0, 8, foreign), &[]).await;
    assert_eq!(st, Status::Forbidden);
}

/// Writes two `piece`-byte halves of one request to `segment` under a
/// grant that expires between them (1 s, no skew allowed): the store
/// must close the connection without an answer. Its counters after.
async fn write_across_grant_expiry(segment: Arc<Segment>, piece: usize) -> Arc<TransferStats> {
    segment.set_mounted(SEGMENT_ID, &KEY);
    let (addr, stats) = serve_segment(
        segment,
        ServeLimits {
            grant_clock_skew: Duration::ZERO,
            ..tls_limits()
        },
    )
    .await;
    let len = 2 * piece as u64;
    let g = grant(&KEY, Op::Write, 0, len, now_ms() + 1_000);
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&request_under(Op::Write, 1, 0, len, g))
        .await
        .unwrap();
    // The first half in time, the second after the expiry.
    s.write_all(&vec![1u8; piece]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let _ = s.write_all(&vec![2u8; piece]).await;
    assert!(
        closed_by_the_store(&mut s).await,
        "no answer after bytes past the expiry"
    );
    stats
}

/// A disk write whose grant expires while its bytes are still arriving
/// stops writing: the masters may have given the range away since.
#[tokio::test]
async fn a_disk_write_stops_at_its_grant_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let (segment, _) =
        Segment::disk(dir.path(), "disk", 8 << 20, crate::OtherCapacity::Refuse).unwrap();
    let stats = write_across_grant_expiry(segment.clone(), DISK_PIECE).await;
    let mut written = vec![0u8; 2 * DISK_PIECE];
    segment.read_at(0, &mut written).unwrap();
    assert!(
        written[..DISK_PIECE].iter().all(|&b| b == 1),
        "the piece in time was written"
    );
    assert!(
        written[DISK_PIECE..].iter().all(|&b| b == 0),
        "the late piece was written"
    );
    assert_eq!(stats.disk_errors.load(Ordering::Relaxed), 1);
}

/// A memory write whose grant expires while its bytes are still
/// arriving stops writing, as a disk write does: bytes delivered late
/// (a healed partition retransmitting) never land in a range the
/// masters may have given to another object.
#[tokio::test]
async fn a_memory_write_stops_at_its_grant_expiry() {
    const PIECE: usize = 1 << 20;
    let segment = Segment::anonymous(8 << 20).unwrap();
    let stats = write_across_grant_expiry(segment.clone(), PIECE).await;
    // SAFETY: nothing writes the segment any more.
    let written = unsafe { segment.slice(0, 2 * PIECE as u64) }.unwrap();
    assert!(
        written[..PIECE].iter().all(|&b| b == 1),
        "the bytes in time were written"
    );
    assert!(
        written[PIECE..].iter().all(|&b| b == 0),
        "bytes that arrived after the expiry were written"
    );
    assert_eq!(stats.forbidden.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn an_unmounted_segment_serves_nothing_but_pings() {
    let segment = Segment::anonymous(1 << 20).unwrap();
    let (addr, _) = serve_segment(segment, small_limits()).await;
    let st = status_of(&addr, request(Op::Read, 1, 0, 8), &[]).await;
    assert_eq!(st, Status::Forbidden);
    let mut s = TcpStream::connect(&addr).await.unwrap();
    assert_eq!(ping(&mut s, 2).await.status, Status::Ok);
}

#[tokio::test]
async fn a_pooled_connection_the_store_closed_is_replaced_once() {
    // The store closes connections idle for 300 ms, as a store that
    // restarted drops them all: the transport's pooled connection is
    // then stale, and only a retry on a new one can succeed.
    let (addr, stats) = start(small_limits()).await;
    let tcp = crate::transport::TcpTransport::new();
    let expiry = now_ms() + 60_000;
    let data = vec![0x5au8; 4096];
    let put = |off: u64| (grant(&KEY, Op::Write, off, 4096, expiry), off, &data[..]);
    tcp.write(&addr, &[put(0)]).await.expect("first write");
    for round in 1..=2u64 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        // Each op below starts on a pooled connection the store closed.
        tcp.write(&addr, &[put(round * 4096)])
            .await
            .unwrap_or_else(|e| panic!("write on a stale pooled connection, round {round}: {e}"));
        tokio::time::sleep(Duration::from_millis(700)).await;
        let mut buf = vec![0u8; 4096];
        let g = grant(&KEY, Op::Read, round * 4096, 4096, expiry);
        tcp.read(&addr, &mut [(g, round * 4096, &mut buf[..])])
            .await
            .unwrap_or_else(|e| panic!("read on a stale pooled connection, round {round}: {e}"));
        assert_eq!(buf, data, "round {round}: wrong bytes");
    }
    assert_eq!(stats.bytes_written.load(Ordering::Relaxed), 3 * 4096);
    // A refusal is an answer, not a stale connection: not retried.
    let bad = grant(&SegmentKey::generate(), Op::Write, 0, 4096, expiry);
    let refused = tcp.write(&addr, &[(bad, 0, &data[..])]).await;
    assert!(
        matches!(
            refused,
            Err(crate::transport::TransferError::Refused { .. })
        ),
        "{refused:?}"
    );
}

/// Waits (at most 10 s) for the store to close `s`.
async fn closed_by_the_store(s: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    matches!(
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await,
        Ok(Ok(_)) | Ok(Err(_))
    )
}

async fn ping(s: &mut TcpStream, id: u64) -> Response {
    s.write_all(&request(Op::Ping, id, 0, 0)).await.unwrap();
    answer(s).await
}

#[tokio::test]
async fn idle_and_trickling_connections_are_closed() {
    let (addr, _) = start(small_limits()).await;
    // Silent after connecting.
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    assert!(closed_by_the_store(&mut idle).await, "idle connection kept");
    // Half a header, then nothing.
    let mut half = TcpStream::connect(&addr).await.unwrap();
    half.write_all(&request(Op::Ping, 1, 0, 0)[..10])
        .await
        .unwrap();
    assert!(
        closed_by_the_store(&mut half).await,
        "truncated header kept"
    );
    // A WRITE whose payload stops arriving.
    let mut slow = TcpStream::connect(&addr).await.unwrap();
    slow.write_all(&request(Op::Write, 2, 0, 1 << 20))
        .await
        .unwrap();
    slow.write_all(&[7u8; 100]).await.unwrap();
    assert!(closed_by_the_store(&mut slow).await, "stalled write kept");
    // A connection that keeps working is served throughout.
    let mut busy = TcpStream::connect(&addr).await.unwrap();
    let until = Instant::now() + Duration::from_millis(900);
    let mut id = 10;
    while Instant::now() < until {
        id += 1;
        let r = ping(&mut busy, id).await;
        assert_eq!((r.status, r.request_id), (Status::Ok, id));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_and_the_others_served() {
    let (addr, stats) = start(ServeLimits {
        idle_timeout: Duration::from_secs(60),
        ..small_limits()
    })
    .await;
    let mut a = TcpStream::connect(&addr).await.unwrap();
    let mut b = TcpStream::connect(&addr).await.unwrap();
    ping(&mut a, 1).await;
    ping(&mut b, 2).await;
    let mut c = TcpStream::connect(&addr).await.unwrap();
    assert!(closed_by_the_store(&mut c).await, "a third connection kept");
    assert!(stats.rejected_connections.load(Ordering::Relaxed) >= 1);
    assert_eq!(ping(&mut a, 3).await.status, Status::Ok);
    assert_eq!(ping(&mut b, 4).await.status, Status::Ok);
    // Once one closes, a new one is taken again.
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats.connections.load(Ordering::Relaxed) >= 2 {
        assert!(Instant::now() < deadline, "closed connection still counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut d = TcpStream::connect(&addr).await.unwrap();
    assert_eq!(ping(&mut d, 5).await.status, Status::Ok);
}

/// A CA and its node and client pairs in `dir`, under the names
/// `crescentctl certs init` uses (the node certificate names localhost
/// and 127.0.0.1, as there).
fn write_pki(dir: &std::path::Path) {
    use crescent_auth::tls::*;
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf = |names: Vec<String>, usages| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names).unwrap();
        params.extended_key_usages = usages;
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (node, node_key) = leaf(
        vec!["localhost".into(), "127.0.0.1".into()],
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    );
    let (client, client_key) = leaf(Vec::new(), vec![ExtendedKeyUsagePurpose::ClientAuth]);
    std::fs::create_dir_all(dir).unwrap();
    for (name, pem) in [
        (CA_CERT_FILE, ca_cert.pem()),
        (NODE_CERT_FILE, node),
        (NODE_KEY_FILE, node_key),
        (CLIENT_CERT_FILE, client),
        (CLIENT_KEY_FILE, client_key),
    ] {
        std::fs::write(dir.join(name), pem).unwrap();
    }
}

fn pki() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_pki(dir.path());
    dir
}

fn client_tls(dir: &std::path::Path) -> crescent_auth::tls::TlsFiles {
    crescent_auth::tls::TlsFiles::client_in(dir).unwrap()
}

/// A mounted segment served over mutual TLS with the node pair in `dir`.
async fn start_tls(
    limits: ServeLimits,
    dir: &std::path::Path,
) -> (String, Arc<TransferStats>, Arc<ServingTls>) {
    let files = crescent_auth::tls::TlsFiles::node_in(dir).unwrap();
    let tls = Arc::new(ServingTls::new(&files).unwrap());
    let segment = Segment::anonymous(4 << 20).unwrap();
    segment.set_mounted(SEGMENT_ID, &KEY);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stats = Arc::new(TransferStats::default());
    tokio::spawn(serve_tls(
        segment,
        listener,
        stats.clone(),
        limits,
        Some(tls.clone()),
        LocalSegments::default(),
    ));
    (addr, stats, tls)
}

fn tls_limits() -> ServeLimits {
    ServeLimits {
        max_connections: 64,
        idle_timeout: Duration::from_secs(10),
        request_base: Duration::from_secs(10),
        ..small_limits()
    }
}

fn read_grant(offset: u64, len: u64) -> Grant {
    grant(&KEY, Op::Read, offset, len, now_ms() + 60_000)
}

/// Writes `data` at `offset` and reads it back through `transport`.
async fn round_trip(
    transport: &crate::TcpTransport,
    endpoint: &str,
    offset: u64,
    data: &[u8],
) -> Result<Vec<u8>, crate::TransferError> {
    let len = data.len() as u64;
    let w = grant(&KEY, Op::Write, offset, len, now_ms() + 60_000);
    transport.write(endpoint, &[(w, offset, data)]).await?;
    let mut got = vec![0u8; data.len()];
    transport
        .read(endpoint, &mut [(read_grant(offset, len), offset, &mut got)])
        .await?;
    Ok(got)
}

/// Waits (at most 10 s) until `counter` reaches `n`: a connection's
/// task counts its end after the peer has seen it.
async fn counts_to(counter: &AtomicU64, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter.load(Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "counter below {n}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn tls_refusal(r: Result<Vec<u8>, crate::TransferError>, who: &str) -> String {
    match r {
        Err(e @ crate::TransferError::Tls { .. }) => e.to_string(),
        other => panic!("{who}: expected a TLS refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_tls_port_serves_clients_of_its_ca_by_address_and_by_name() {
    let dir = pki();
    let (addr, stats, _) = start_tls(tls_limits(), dir.path()).await;
    let transport = crate::TcpTransport::with_tls(Some(&client_tls(dir.path()))).unwrap();
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    // Reached by IP address (the certificate's IP entry) ...
    let got = round_trip(&transport, &addr, 4096, &data).await.unwrap();
    assert!(got == data, "bytes differ");
    // ... and by name (its DNS entry).
    let port = addr.rsplit_once(':').unwrap().1;
    let by_name = format!("localhost:{port}");
    let got = round_trip(&transport, &by_name, 0, b"by name")
        .await
        .unwrap();
    assert_eq!(got, b"by name");
    assert_eq!(stats.tls_refused.load(Ordering::Relaxed), 0);
    assert!(stats.bytes_read.load(Ordering::Relaxed) >= 1 << 20);
}

#[tokio::test]
async fn a_tls_port_serves_nothing_in_clear_text() {
    let dir = pki();
    let (addr, stats, _) = start_tls(tls_limits(), dir.path()).await;
    let secret = b"secret bytes";
    let transport = crate::TcpTransport::with_tls(Some(&client_tls(dir.path()))).unwrap();
    round_trip(&transport, &addr, 0, secret).await.unwrap();
    // A raw clear-text READ under a valid grant: no answer, no bytes;
    // only a TLS alert, then the end.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&request(Op::Read, 1, 0, secret.len() as u64))
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the connection was kept open");
    assert!(
        !got.starts_with(b"CRES"),
        "a clear-text request was answered"
    );
    assert!(
        !got.windows(secret.len()).any(|w| w == secret),
        "bytes served in clear text"
    );
    assert!(got.starts_with(&[0x15, 0x03]), "no TLS alert: {got:?}");
    // The clear-text transport says why.
    let err = tls_refusal(
        round_trip(&crate::TcpTransport::new(), &addr, 0, secret).await,
        "a clear-text transport",
    );
    assert!(err.contains("requires TLS"), "{err}");
    counts_to(&stats.tls_refused, 2).await;
}

#[tokio::test]
async fn a_tls_port_refuses_other_cas_and_a_tls_client_is_told_of_clear_text() {
    let dir = pki();
    let foreign = pki();
    let (addr, stats, _) = start_tls(tls_limits(), dir.path()).await;
    // Trusts another CA: refuses the store.
    let stranger = crate::TcpTransport::with_tls(Some(&client_tls(foreign.path()))).unwrap();
    let err = tls_refusal(round_trip(&stranger, &addr, 0, b"x").await, "a stranger");
    assert!(err.contains("certificate"), "{err}");
    // Trusts the store's CA but presents another CA's certificate: the
    // store refuses it (after the client's side of the handshake, in
    // TLS 1.3: the refusal arrives at the first read).
    let forged = crescent_auth::tls::TlsFiles::read(
        &foreign.path().join(crescent_auth::tls::CLIENT_CERT_FILE),
        &foreign.path().join(crescent_auth::tls::CLIENT_KEY_FILE),
        &dir.path().join(crescent_auth::tls::CA_CERT_FILE),
    )
    .unwrap();
    let impostor = crate::TcpTransport::with_tls(Some(&forged)).unwrap();
    let err = tls_refusal(round_trip(&impostor, &addr, 0, b"x").await, "an impostor");
    assert!(err.contains("does not trust"), "{err}");
    // Both failed handshakes: the stranger's and the impostor's.
    counts_to(&stats.tls_refused, 2).await;
    assert_eq!(stats.bytes_written.load(Ordering::Relaxed), 0);

    // A TLS client at a clear-text port.
    let (plain, plain_stats) = start(tls_limits()).await;
    let secure = crate::TcpTransport::with_tls(Some(&client_tls(dir.path()))).unwrap();
    let err = tls_refusal(
        round_trip(&secure, &plain, 0, b"x").await,
        "clear-text store",
    );
    assert!(err.contains("clear text"), "{err}");
    counts_to(&plain_stats.tls_refused, 1).await;
}

#[tokio::test]
async fn a_stalled_handshake_is_closed_and_holds_a_slot_meanwhile() {
    let dir = pki();
    let (addr, stats, _) = start_tls(
        ServeLimits {
            handshake_timeout: Duration::from_secs(2),
            ..small_limits()
        },
        dir.path(),
    )
    .await;
    let started = Instant::now();
    let mut a = TcpStream::connect(&addr).await.unwrap();
    let mut b = TcpStream::connect(&addr).await.unwrap();
    // Both slots are taken by silent handshakes: a third is closed at once.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats.connections.load(Ordering::Relaxed) < 2 {
        assert!(Instant::now() < deadline, "handshakes not counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut c = TcpStream::connect(&addr).await.unwrap();
    assert!(closed_by_the_store(&mut c).await, "a third connection kept");
    // Closed by the cap, not by the handshake timeout it would also meet.
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "the third connection was closed only after {:?}",
        started.elapsed()
    );
    assert_eq!(stats.rejected_connections.load(Ordering::Relaxed), 1);
    assert!(
        closed_by_the_store(&mut a).await,
        "a stalled handshake kept"
    );
    assert!(
        closed_by_the_store(&mut b).await,
        "a stalled handshake kept"
    );
    assert!(started.elapsed() >= Duration::from_millis(1800));
    counts_to(&stats.tls_refused, 2).await;
    // Slots freed: a TLS client is served again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats.connections.load(Ordering::Relaxed) > 0 {
        assert!(Instant::now() < deadline, "closed handshakes still counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let transport = crate::TcpTransport::with_tls(Some(&client_tls(dir.path()))).unwrap();
    round_trip(&transport, &addr, 0, b"after").await.unwrap();
}

#[tokio::test]
async fn a_reload_reaches_the_next_connection() {
    let dir = pki();
    let (addr, _, tls) = start_tls(tls_limits(), dir.path()).await;
    let old = crate::TcpTransport::with_tls(Some(&client_tls(dir.path()))).unwrap();
    round_trip(&old, &addr, 0, b"old").await.unwrap();
    // New files (another CA) in place, then the reload a SIGHUP does.
    let next = pki();
    let newcomer = crate::TcpTransport::with_tls(Some(&client_tls(next.path()))).unwrap();
    tls_refusal(round_trip(&newcomer, &addr, 0, b"x").await, "before");
    for entry in std::fs::read_dir(next.path()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    tls.reload().unwrap();
    assert_eq!(
        round_trip(&newcomer, &addr, 0, b"new").await.unwrap(),
        b"new"
    );
    // The old client's pooled connection keeps its session; a new one
    // is refused.
    assert_eq!(round_trip(&old, &addr, 0, b"kept").await.unwrap(), b"kept");
    old.forget(&addr);
    tls_refusal(round_trip(&old, &addr, 0, b"x").await, "after");
}

/// A grant for `[offset, offset+len)` of segment `segment_id`.
fn grant_in(
    key: &SegmentKey,
    segment_id: u64,
    access: crescent_auth::capability::Access,
    offset: u64,
    len: u64,
    expiry_ms: u64,
) -> Grant {
    let mut g = Grant {
        segment_id,
        offset,
        len,
        expiry_ms,
        mac: [0; 16],
    };
    g.mac = key.sign(&g.capability(access));
    g
}

#[tokio::test]
async fn a_store_copies_between_its_own_segments_only_under_both_grants() {
    use crate::protocol::{CopyTarget, FEATURE_COPY};
    use crate::TransferError;
    use crescent_auth::capability::Access;
    const DISK_ID: u64 = SEGMENT_ID + 1;
    let disk_key = SegmentKey::generate();
    let dir = tempfile::tempdir().unwrap();
    let memory = Segment::anonymous(8 << 20).unwrap();
    memory.set_mounted(SEGMENT_ID, &KEY);
    let (disk, _) =
        Segment::disk(dir.path(), "disk", 8 << 20, crate::OtherCapacity::Refuse).unwrap();
    disk.set_mounted(DISK_ID, &disk_key);
    let local = LocalSegments::default();
    let limits = ServeLimits {
        max_connections: 64,
        ..tls_limits()
    };
    let mut addrs = Vec::new();
    let mut stats = Vec::new();
    for segment in [&memory, &disk] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap().to_string());
        let st = Arc::new(TransferStats::default());
        stats.push(st.clone());
        let (seg, lim, loc) = (segment.clone(), limits.clone(), local.clone());
        tokio::spawn(serve_tls(seg, listener, st, lim, None, loc));
    }
    let (memory_addr, disk_addr) = (&addrs[0], &addrs[1]);
    let transport = crate::TcpTransport::new();
    assert_eq!(transport.features(memory_addr).await.unwrap(), FEATURE_COPY);

    // A demotion: 3.5 MiB (several pieces) from memory to disk.
    let bytes: Vec<u8> = (0..(7 * DISK_PIECE / 2)).map(|i| (i % 253) as u8).collect();
    let len = bytes.len() as u64;
    memory.write_at(4096, &bytes).unwrap();
    let later = now_ms() + 60_000;
    let read = grant_in(&KEY, SEGMENT_ID, Access::Read, 4096, len, later);
    let write = grant_in(&disk_key, DISK_ID, Access::Write, 8192, len, later);
    let to_disk = CopyTarget {
        offset: 8192,
        grant: write,
    };
    let crc = transport
        .copy(memory_addr, read, 4096, len, to_disk)
        .await
        .unwrap();
    assert_eq!(crc, crc32c::crc32c(&bytes));
    let mut on_disk = vec![0u8; bytes.len()];
    disk.read_at(8192, &mut on_disk).unwrap();
    assert!(on_disk == bytes, "bytes on disk differ");
    assert_eq!(stats[0].copies.load(Ordering::Relaxed), 1);
    assert_eq!(stats[0].copy_bytes.load(Ordering::Relaxed), len);
    assert_eq!(stats[1].disk_bytes_written.load(Ordering::Relaxed), len);

    // A promotion: the same bytes back from disk into memory.
    let read_disk = grant_in(&disk_key, DISK_ID, Access::Read, 8192, len, later);
    let write_memory = grant_in(&KEY, SEGMENT_ID, Access::Write, 4 << 20, len, later);
    let to_memory = CopyTarget {
        offset: 4 << 20,
        grant: write_memory,
    };
    let crc = transport
        .copy(disk_addr, read_disk, 8192, len, to_memory)
        .await
        .unwrap();
    assert_eq!(crc, crc32c::crc32c(&bytes));
    let mut in_memory = vec![0u8; bytes.len()];
    memory.read_at(4 << 20, &mut in_memory).unwrap();
    assert!(in_memory == bytes, "bytes in memory differ");
    assert_eq!(stats[1].disk_bytes_read.load(Ordering::Relaxed), len);

    // Each refusal writes nothing: the target range (disk, 4 MiB on,
    // never written) stays zero.
    let at = 4 << 20;
    let target = |grant: Grant| CopyTarget { offset: at, grant };
    let write = grant_in(&disk_key, DISK_ID, Access::Write, at, len, later);
    let refused = [
        (
            "target grant signed with another key",
            read,
            target(grant_in(&KEY, DISK_ID, Access::Write, at, len, later)),
            Status::Forbidden,
        ),
        (
            "target grant expired",
            read,
            target(grant_in(
                &disk_key,
                DISK_ID,
                Access::Write,
                at,
                len,
                now_ms() - 1,
            )),
            Status::Forbidden,
        ),
        (
            "target grant to read",
            read,
            target(grant_in(&disk_key, DISK_ID, Access::Read, at, len, later)),
            Status::Forbidden,
        ),
        (
            "target grant for less",
            read,
            target(grant_in(
                &disk_key,
                DISK_ID,
                Access::Write,
                at,
                len - 1,
                later,
            )),
            Status::Forbidden,
        ),
        (
            "target grant's MAC altered",
            read,
            target(Grant {
                mac: [1; 16],
                ..write
            }),
            Status::Forbidden,
        ),
        (
            "target segment in no other process",
            read,
            target(grant_in(&disk_key, 99, Access::Write, at, len, later)),
            Status::WrongSegment,
        ),
        (
            "source grant to write",
            grant_in(&KEY, SEGMENT_ID, Access::Write, 4096, len, later),
            target(write),
            Status::Forbidden,
        ),
        (
            "source grant expired",
            grant_in(&KEY, SEGMENT_ID, Access::Read, 4096, len, now_ms() - 1),
            target(write),
            Status::Forbidden,
        ),
    ];
    for (case, source_grant, to, status) in refused {
        let got = transport
            .copy(memory_addr, source_grant, 4096, len, to)
            .await;
        assert!(
            matches!(&got, Err(TransferError::Refused { status: s, .. }) if *s == status),
            "{case}: {got:?}"
        );
    }
    // A target range past the segment's end, under a grant for it.
    let past = grant_in(&disk_key, DISK_ID, Access::Write, (8 << 20) - 4, len, later);
    let got = transport
        .copy(
            memory_addr,
            read,
            4096,
            len,
            CopyTarget {
                offset: (8 << 20) - 4,
                grant: past,
            },
        )
        .await;
    assert!(
        matches!(
            &got,
            Err(TransferError::Refused {
                status: Status::OutOfRange,
                ..
            })
        ),
        "{got:?}"
    );
    let mut untouched = vec![1u8; bytes.len()];
    disk.read_at(at, &mut untouched).unwrap();
    assert!(untouched.iter().all(|&b| b == 0), "a refused copy wrote");
    let mut last = [1u8; 4];
    disk.read_at((8 << 20) - 4, &mut last).unwrap();
    assert_eq!(last, [0; 4], "the copy out of range wrote");
    assert_eq!(stats[0].copies.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_copy_cut_short_by_its_deadline_stops_writing() {
    use crate::protocol::CopyTarget;
    use crescent_auth::capability::Access;
    const DISK_ID: u64 = SEGMENT_ID + 1;
    const LEN: u64 = 96 << 20;
    let disk_key = SegmentKey::generate();
    let dir = tempfile::tempdir().unwrap();
    let memory = Segment::anonymous(LEN).unwrap();
    memory.set_mounted(SEGMENT_ID, &KEY);
    memory.write_at(0, &vec![7u8; LEN as usize]).unwrap();
    let (disk, _) = Segment::disk(dir.path(), "disk", LEN, crate::OtherCapacity::Refuse).unwrap();
    disk.set_mounted(DISK_ID, &disk_key);
    let local = LocalSegments::default();
    let disk_stats = Arc::new(TransferStats::default());
    local.add(&disk, &disk_stats);
    // A deadline of a millisecond, whatever the length: the copy of
    // 96 pieces is cut short after its first few.
    let limits = ServeLimits {
        max_connections: 64,
        request_base: Duration::from_millis(1),
        min_bytes_per_sec: u64::MAX,
        ..tls_limits()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stats = Arc::new(TransferStats::default());
    tokio::spawn(serve_tls(
        memory.clone(),
        listener,
        stats.clone(),
        limits,
        None,
        local,
    ));
    let later = now_ms() + 60_000;
    let read = grant_in(&KEY, SEGMENT_ID, Access::Read, 0, LEN, later);
    let target = CopyTarget {
        offset: 0,
        grant: grant_in(&disk_key, DISK_ID, Access::Write, 0, LEN, later),
    };
    let got = crate::TcpTransport::new()
        .copy(&addr, read, 0, LEN, target)
        .await;
    assert!(
        matches!(got, Err(crate::TransferError::Io { .. })),
        "{got:?}"
    );
    // Time for a copy left running to finish (a few hundred ms here).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut tail = vec![1u8; DISK_PIECE];
    disk.read_at(LEN - DISK_PIECE as u64, &mut tail).unwrap();
    assert!(
        tail.iter().all(|&b| b == 0),
        "the copy went on after its deadline"
    );
    assert_eq!(stats.copies.load(Ordering::Relaxed), 0);
    assert_eq!(stats.copy_errors.load(Ordering::Relaxed), 1);
}

/// A fake store (a bare listener, not the server): answers PINGs with
/// the COPY feature, reads a COPY and closes without answering; counts
/// the connections and COPYs it saw.
async fn fake_store_that_drops_copies() -> (String, Arc<AtomicU64>, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (connections, copies) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (conns, seen) = (connections.clone(), copies.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            conns.fetch_add(1, Ordering::Relaxed);
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut hdr = [0u8; REQUEST_LEN];
                while s.read_exact(&mut hdr).await.is_ok() {
                    let req = Request::decode(&hdr).unwrap();
                    if req.op == Op::Copy {
                        let mut target = [0u8; crate::protocol::COPY_TARGET_LEN];
                        let _ = s.read_exact(&mut target).await;
                        seen.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    let resp = Response {
                        status: Status::Ok,
                        request_id: req.request_id,
                        len: 0,
                        value: FEATURE_COPY,
                    };
                    s.write_all(&resp.encode()).await.unwrap();
                }
            });
        }
    });
    (addr, connections, copies)
}

#[tokio::test]
async fn a_copy_goes_out_once_on_a_connection_of_its_own() {
    let (addr, connections, copies) = fake_store_that_drops_copies().await;
    let transport = crate::TcpTransport::new();
    // The PING's connection goes back to the pool ...
    assert_eq!(transport.features(&addr).await.unwrap(), FEATURE_COPY);
    let target = crate::protocol::CopyTarget {
        offset: 0,
        grant: Grant::default(),
    };
    // ... but the COPY opens its own, and is not sent again when that
    // one breaks without an answer (the store may still be copying).
    let got = transport.copy(&addr, Grant::default(), 0, 8, target).await;
    assert!(
        matches!(got, Err(crate::TransferError::Io { .. })),
        "{got:?}"
    );
    assert_eq!(copies.load(Ordering::Relaxed), 1);
    assert_eq!(connections.load(Ordering::Relaxed), 2);
    // The pooled connection still serves the next PING.
    assert_eq!(transport.features(&addr).await.unwrap(), FEATURE_COPY);
    assert_eq!(connections.load(Ordering::Relaxed), 2);
}
