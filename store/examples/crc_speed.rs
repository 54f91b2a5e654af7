//! crc32c throughput on 1 MiB buffers. `cargo run --release -p crescent-store --example crc_speed`
use std::time::Instant;
fn main() {
    let buf = vec![7u8; 1 << 20];
    let n = 2000;
    let start = Instant::now();
    let mut x = 0u32;
    for _ in 0..n {
        x ^= crc32c::crc32c(std::hint::black_box(&buf));
    }
    let gbps = (n << 20) as f64 / start.elapsed().as_secs_f64() / 1e9;
    println!("crc32c: {gbps:.2} GB/s ({x})");
}
