//! The master's tests against real Raft, gRPC and disk in this process: a
//! three-node cluster over loopback, and one node's restarts. One binary,
//! so they link once.

mod in_process_cluster;
mod one_node;
