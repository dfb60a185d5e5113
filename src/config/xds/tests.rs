//! Resources as the management server sends them, into a config.
use envoy_types::pb::envoy::service::discovery::v3::Resource;
use envoy_types::pb::google::protobuf::Any;
use prost::Message;

use super::*;
use crate::config::{LiveConfig, LoadOptions};

#[test]
fn wrapped_and_foreign_resources() {
    let config = pb::RateLimitConfig {
        name: "n".into(),
        domain: "d".into(),
        descriptors: vec![],
    };
    let plain = Any {
        type_url: TYPE_URL.into(),
        value: config.encode_to_vec(),
    };
    let wrapped = Any {
        type_url: WRAPPED_TYPE_URL.into(),
        value: Resource {
            name: "n".into(),
            resource: Some(plain.clone()),
            ..Default::default()
        }
        .encode_to_vec(),
    };
    assert_eq!(decode_resource(&wrapped), Ok(config.clone()));
    let c = config_from_resources(
        vec![wrapped],
        LoadOptions::default(),
        &LiveConfig::default(),
        None,
    )
    .unwrap();
    assert!(c.domain("d").is_some());
    let foreign = Any {
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        value: vec![],
    };
    let err = config_from_resources(
        vec![plain, foreign],
        LoadOptions::default(),
        &LiveConfig::default(),
        None,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("resources[1]: unexpected resource type type.googleapis.com/envoy.config.cluster.v3.Cluster (expected {TYPE_URL})")
    );
    let garbage = Any {
        type_url: TYPE_URL.into(),
        value: vec![0xff, 0xff],
    };
    assert!(decode_resource(&garbage)
        .unwrap_err()
        .starts_with("cannot decode RateLimitConfig"));
}
