//! Compiles the vendored protos in `proto/` with protox (pure Rust), so a fresh machine needs no
//! protoc:
//! - Envoy's rate-limit and rate-limit-quota service protos become a descriptor set for gRPC server reflection; their
//!   message types come from the `envoy-types` crate.
//! - envoyproxy/ratelimit's `RateLimitConfig` (the xDS resource Envoy Gateway serves) and
//!   Kuadrant's `Reserve`/`Commit` messages become Rust types with prost-build, since no crate
//!   ships them (the Envoy messages they use are `envoy-types`', Duration `prost-types`').

use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=proto");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));

    let files = [
        "envoy/service/ratelimit/v3/rls.proto",
        "envoy/service/rate_limit_quota/v3/rlqs.proto",
        "kuadrant/service/ratelimit/v1/kuadrantrls.proto",
    ];
    let set = protox::compile(files, ["proto"]).expect("compile vendored protos in proto/");
    let bytes = prost::Message::encode_to_vec(&set);
    let kuadrant = prost_types::FileDescriptorSet {
        file: (set.file.iter())
            .filter(|f| f.package() == "kuadrant.service.ratelimit.v1")
            .cloned()
            .collect(),
    };
    fs::write(out.join("rls_descriptor.bin"), bytes).expect("write descriptor set");

    let rls_conf = protox::compile(["ratelimit/config/ratelimit/v3/rls_conf.proto"], ["proto"])
        .expect("compile proto/ratelimit/config/ratelimit/v3/rls_conf.proto");
    prost_build::Config::new()
        .compile_fds(rls_conf)
        .expect("generate RateLimitConfig types");
    prost_build::Config::new()
        // `.google.protobuf` is `::prost_types` already, by prost-build's default.
        .extern_path(".envoy", "::envoy_types::pb::envoy")
        .compile_fds(kuadrant)
        .expect("generate Kuadrant's Reserve and Commit types");
}
