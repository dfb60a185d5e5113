//! xDS settings and the client's backoff.
use super::client::{backoff, node};
use super::*;

fn settings(vars: &[(&str, &str)]) -> Result<Option<XdsSettings>, String> {
    crate::settings::Settings::from_env(|k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
    .map(|s| s.xds)
}

fn xds(vars: &[(&str, &str)]) -> XdsSettings {
    let mut all = vec![("CONFIG_TYPE", "GRPC_XDS_SOTW")];
    all.extend_from_slice(vars);
    settings(&all).unwrap().unwrap()
}

#[test]
fn file_config_is_not_xds() {
    assert_eq!(settings(&[]), Ok(None));
    assert_eq!(settings(&[("CONFIG_TYPE", "FILE")]), Ok(None));
    assert!(settings(&[("CONFIG_TYPE", "GRPC_XDS_DELTA")])
        .unwrap_err()
        .contains("CONFIG_TYPE=GRPC_XDS_DELTA is not supported"));
}

#[test]
fn the_overlay_is_for_pushed_limits_only() {
    assert_eq!(xds(&[]).overlay, None);
    let s = xds(&[("TURNSTILE_XDS_OVERLAY", "/etc/turnstile/overlay")]);
    assert_eq!(s.overlay, Some(PathBuf::from("/etc/turnstile/overlay")));
    let e = settings(&[("TURNSTILE_XDS_OVERLAY", "/etc/turnstile/overlay")]).unwrap_err();
    assert!(
        e.starts_with("TURNSTILE_XDS_OVERLAY=/etc/turnstile/overlay adds turnstile's fields"),
        "{e}"
    );
}

#[test]
fn defaults_are_the_reference_defaults() {
    let s = xds(&[("CONFIG_TYPE", "grpc_xds_sotw")]);
    assert_eq!(s.server, "localhost:18000");
    assert_eq!(s.node_id, "default");
    assert_eq!(s.tls, None);
    assert_eq!(
        (s.backoff_initial, s.backoff_max),
        (Duration::from_secs(10), Duration::from_secs(60))
    );
    assert_eq!(s.backoff_jitter, 0.5);
    assert_eq!(s.max_message_bytes, None);
    assert!(!s.force_start_without_initial_config);
    assert!(!s.healthy_before_first_config());
    assert_eq!(s.load, LoadOptions::default());
}

#[test]
fn envoy_gateway_settings() {
    let s = xds(&[
        ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ]);
    assert_eq!(s.server, "envoy-gateway:18001");
    assert_eq!(s.node_id, "envoy-ratelimit");
    assert_eq!(
        s.tls,
        Some(XdsTls {
            ca_cert: "/certs/ca.crt".into(),
            client_identity: Some(ClientIdentity {
                cert: "/certs/tls.crt".into(),
                key: "/certs/tls.key".into(),
            }),
            server_name: None,
        })
    );
    assert!(s.healthy_before_first_config());
    let s = xds(&[
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
    ]);
    assert!(!s.healthy_before_first_config());
}

#[test]
fn tls_needs_a_ca_and_a_whole_identity() {
    let ca = ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ca.crt");
    let on = ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "1");
    let err = |vars: &[(&str, &str)]| {
        let mut all = vec![("CONFIG_TYPE", "GRPC_XDS_SOTW")];
        all.extend_from_slice(vars);
        settings(&all).unwrap_err()
    };
    assert!(err(&[on]).contains("needs CONFIG_GRPC_XDS_SERVER_TLS_CACERT"));
    assert!(err(&[on, ca, ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c")])
        .contains("CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/c needs CONFIG_GRPC_XDS_CLIENT_TLS_KEY"));
    let s = xds(&[on, ca, ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.internal")]);
    let tls = s.tls.unwrap();
    assert_eq!(tls.client_identity, None);
    assert_eq!(tls.server_name.as_deref(), Some("xds.internal"));
    // Files are read when connecting, so a missing one is a connection error, not a panic.
    let s = xds(&[
        on,
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/nonexistent/ca.crt"),
    ]);
    assert!(s
        .endpoint()
        .unwrap_err()
        .contains("cannot read /nonexistent/ca.crt"));
}

#[test]
fn urls_metadata_headers_and_limits() {
    for (given, want) in [
        ("xds:18000", "xds:18000"),
        ("http://xds:18000/", "xds:18000"),
        ("https://xds:18000", "xds:18000"),
        ("dns:///xds:18000", "xds:18000"),
    ] {
        assert_eq!(xds(&[("CONFIG_GRPC_XDS_SERVER_URL", given)]).server, want);
    }
    let s = xds(&[
        ("CONFIG_GRPC_XDS_NODE_METADATA", "cluster:gw, zone=eu-1"),
        (
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "x-team:rl,authorization:Bearer t",
        ),
        ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "8388608"),
        ("XDS_CLIENT_BACKOFF_JITTER", "false"),
        ("MERGE_DOMAIN_CONFIG", "true"),
    ]);
    assert_eq!(
        s.node_metadata,
        [
            ("cluster".into(), "gw".into()),
            ("zone".into(), "eu-1".into())
        ]
    );
    assert_eq!(
        s.headers,
        [
            ("x-team".into(), "rl".into()),
            ("authorization".into(), "Bearer t".into())
        ]
    );
    assert_eq!(s.max_message_bytes, Some(8 << 20));
    assert_eq!(s.backoff_jitter, 0.0);
    assert!(s.load.merge_domains);
    let n = node(&s);
    assert_eq!(n.metadata.unwrap().fields.len(), 2);
    for bad in [
        ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "novalue"),
        ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "bad key:v"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1s"),
        ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2"),
        ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "0"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "yes please"),
    ] {
        let mut all = vec![("CONFIG_TYPE", "GRPC_XDS_SOTW")];
        all.push(bad);
        assert!(settings(&all).is_err(), "{bad:?} is refused");
    }
}

#[test]
fn backoff_doubles_up_to_the_maximum_and_jitters_within_it() {
    let mut s = xds(&[
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1s"),
        ("XDS_CLIENT_BACKOFF_JITTER", "false"),
    ]);
    let ms = |s: &XdsSettings, n| backoff(s, n).as_millis();
    assert_eq!(
        (0..6).map(|n| ms(&s, n)).collect::<Vec<_>>(),
        [100, 200, 400, 800, 1000, 1000]
    );
    assert_eq!(ms(&s, u32::MAX), 1000);
    s.backoff_jitter = 0.5;
    for n in 0..200 {
        let d = ms(&s, n % 3);
        let base = 100u128 << (n % 3);
        assert!(d >= base / 2 && d <= base * 3 / 2, "{d} around {base}");
    }
    for _ in 0..50 {
        assert!(ms(&s, 10) >= 500 && ms(&s, 10) <= 1000);
    }
}
