//! Transport-only read throughput against an in-process store server, with and
//! without crc32c: isolates the data path from the masters. `cargo run --release
//! -p crescent-store --example raw_read [CERTS]`: with CERTS (a directory
//! `crescentctl certs init` wrote), over mutual TLS.
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let certs = std::env::args_os().nth(1).map(std::path::PathBuf::from);
    rt.block_on(async {
        let serving = certs.as_deref().map(|dir| {
            let node = crescent_auth::tls::TlsFiles::node_in(dir).expect("node certificate");
            Arc::new(crescent_auth::tls::ServingTls::new(&node).expect("TLS set-up"))
        });
        let client = certs
            .as_deref()
            .map(|dir| crescent_auth::tls::TlsFiles::client_in(dir).expect("client certificate"));
        let seg = crescent_store::Segment::anonymous(256 << 20).expect("segment");
        // Mounted as segment 1 under a fresh key; one grant covers it all.
        let key = crescent_auth::capability::SegmentKey::generate();
        seg.set_mounted(1, &key);
        let mut grant = crescent_store::protocol::Grant {
            segment_id: 1,
            offset: 0,
            len: 256 << 20,
            expiry_ms: u64::MAX,
            mac: [0; 16],
        };
        grant.mac = key.sign(&grant.capability(crescent_auth::capability::Access::Read));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let ep = l.local_addr().expect("addr").to_string();
        tokio::spawn(crescent_store::server::serve_tls(
            seg.clone(),
            l,
            Arc::new(Default::default()),
            Default::default(),
            serving,
            Default::default(),
        ));
        let t =
            Arc::new(crescent_store::TcpTransport::with_tls(client.as_ref()).expect("TLS set-up"));
        println!("TLS: {}", t.is_tls());
        for batch in [1usize, 16] {
            for crc in [false, true] {
                let n = 2048;
                let start = Instant::now();
                let mut bufs = vec![vec![0u8; 1 << 20]; batch];
                for i in (0..n).step_by(batch) {
                    let mut reads: Vec<_> = bufs
                        .iter_mut()
                        .enumerate()
                        .map(|(j, b)| (grant, (((i + j) % 200) << 20) as u64, b.as_mut_slice()))
                        .collect();
                    if crc {
                        std::hint::black_box(
                            t.read_checksummed(&ep, &mut reads).await.expect("read"),
                        );
                    } else {
                        t.read(&ep, &mut reads).await.expect("read");
                    }
                }
                let gbps = (n << 20) as f64 / start.elapsed().as_secs_f64() / 1e9;
                println!("1 MiB reads, batch {batch}, crc32c {crc}: {gbps:.2} GB/s");
            }
        }
    });
}
