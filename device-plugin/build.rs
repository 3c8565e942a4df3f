//! Generates the v1beta1 messages, clients and servers from `proto/api.proto` with `protox`
//! (a protobuf compiler written in Rust), so building needs no system `protoc`.

fn main() {
    println!("cargo:rerun-if-changed=proto/api.proto");
    let fds = protox::compile(["api.proto"], ["proto"]).unwrap_or_else(|e| panic!("proto/api.proto: {e}"));
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating the v1beta1 API: {e}"));
}
