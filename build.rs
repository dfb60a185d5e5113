//! Compiles the vendored Envoy protos in `proto/` into a descriptor set for gRPC server
//! reflection. The message types themselves come from the `envoy-types` crate; only the
//! descriptors are built here, with protox (pure Rust), so a fresh machine needs no protoc.

use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=proto");
    let files = ["envoy/service/ratelimit/v3/rls.proto"];
    let set = protox::compile(files, ["proto"]).expect("compile vendored protos in proto/");
    let bytes = prost::Message::encode_to_vec(&set);
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    fs::write(out.join("rls_descriptor.bin"), bytes).expect("write descriptor set");
}
