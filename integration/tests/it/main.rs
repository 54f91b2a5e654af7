//! Crescent's integration tests, one module per concern, in one binary so
//! they compile and link once. They run real etcd, master and store
//! processes on loopback (`crescent_integration`'s harness) and need
//! `cargo build --bins` first (`make test` does it). `common` holds the
//! helpers the modules share.

mod common;

mod attacks;
mod cli;
mod compose;
mod data;
mod data_plane_grants;
mod deploy_files;
mod descriptor_cache;
mod disk_tier;
mod ha;
mod http;
mod limits;
mod liveness;
mod masters;
mod request_ids;
mod security;
mod tls;
