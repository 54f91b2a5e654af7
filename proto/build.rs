fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/master.proto",
        "proto/cluster.proto",
        "proto/raft.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    println!("cargo:rerun-if-changed=proto/common.proto");
    tonic_prost_build::configure().compile_protos(&protos, &["proto"])?;
    Ok(())
}
