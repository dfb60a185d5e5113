//! The operating settings read from envoyproxy/ratelimit's environment: defaults, spellings,
//! and refusals that name the variable.

use std::path::PathBuf;
use std::time::Duration;

use turnstile::config::grammar::parse_duration as parse_go_duration;
use turnstile::settings::{Settings, TlsSettings};
use turnstile::telemetry::OtlpProtocol;

fn settings(vars: &[(&str, &str)]) -> Result<Settings, String> {
    Settings::from_env(|k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
}

fn ok(vars: &[(&str, &str)]) -> Settings {
    settings(vars).unwrap_or_else(|e| panic!("{vars:?}: {e}"))
}

fn err(vars: &[(&str, &str)]) -> String {
    match settings(vars) {
        Ok(_) => panic!("{vars:?} accepted"),
        Err(e) => e,
    }
}

#[test]
fn defaults_match_envoyproxy_ratelimit() {
    // envoyproxy/ratelimit's `src/settings/settings.go` (f2fb157), line by line.
    let s = ok(&[]);
    assert_eq!(s.http_addr, "0.0.0.0:8080".parse().unwrap()); // HOST, PORT: 18-19
    assert_eq!(s.debug_addr, Some("0.0.0.0:6070".parse().unwrap())); // DEBUG_*: 20-21
    assert_eq!(s.grpc_addr, "0.0.0.0:8081".parse().unwrap()); // GRPC_HOST, _PORT: 27-28
    assert_eq!(s.grpc_uds, None); // GRPC_UDS: 26
    assert_eq!(s.grpc_max_connection_age, Duration::from_secs(24 * 3600)); // 33
    assert_eq!(s.grpc_max_connection_age_grace, Duration::from_secs(3600)); // 35
    assert_eq!(s.tls, None); // GRPC_SERVER_USE_TLS false: 37
    assert!(!s.log.json); // LOG_FORMAT text: 50
    let p = s
        .prometheus
        .expect("Prometheus on by default (turnstile's choice, below)");
    assert_eq!(p.addr, "0.0.0.0:9090".parse().unwrap()); // PROMETHEUS_ADDR :9090: 94
    assert_eq!(p.path, "/metrics"); // PROMETHEUS_PATH: 95
    assert_eq!(s.runtime_root, PathBuf::from("/srv/runtime_data/current")); // RUNTIME_ROOT: 100
    assert!(s.watch_root); // RUNTIME_WATCH_ROOT true: 104
    assert_eq!(s.near_limit_ratio, 0.8); // NEAR_LIMIT_RATIO: 109
    assert!(!s.global_shadow_mode && !s.global_quota_mode); // SHADOW_MODE, QUOTA_MODE false
    assert!(!s.response_dynamic_metadata); // RESPONSE_DYNAMIC_METADATA false: 235
    assert!(!s.healthy_only_with_config); // HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: 124
    assert!(s.ignored.is_empty());
}

/// Where turnstile's defaults are its own (docs/settings.md): Prometheus is served without
/// `USE_PROMETHEUS=true` (the reference's default is false and statsd), the config is polled
/// every second, and tracing is off until asked for.
#[test]
fn defaults_of_turnstiles_own() {
    let s = ok(&[]);
    assert!(s.prometheus.is_some());
    assert_eq!(s.reload_interval, Duration::from_secs(1));
    assert_eq!(s.tracing, None);
}

#[test]
fn ports_logs_reload_and_uds() {
    let s = ok(&[
        ("DEBUG_HOST", "::"),
        ("DEBUG_PORT", "7000"),
        ("PROMETHEUS_ADDR", ":19001"),
        ("PROMETHEUS_PATH", "/stats/prometheus"),
        ("LOG_FORMAT", "JSON"),
        ("LOG_LEVEL", "WARN"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("TURNSTILE_RELOAD_INTERVAL_MS", "250"),
        ("GRPC_UDS", "/tmp/rls.sock"),
        ("GRPC_MAX_CONNECTION_AGE", "1h30m"),
        ("GRPC_MAX_CONNECTION_AGE_GRACE", "90s"),
    ]);
    assert_eq!(s.debug_addr, Some("[::]:7000".parse().unwrap()));
    let p = s.prometheus.unwrap();
    assert_eq!(p.addr, "0.0.0.0:19001".parse().unwrap());
    assert_eq!(p.path, "/stats/prometheus");
    assert!(s.log.json);
    assert_eq!(s.log.level, "warn");
    assert!(!s.watch_root);
    assert_eq!(s.reload_interval, Duration::from_millis(250));
    assert_eq!(s.grpc_uds, Some(PathBuf::from("/tmp/rls.sock")));
    assert_eq!(s.grpc_max_connection_age, Duration::from_secs(5400));
    assert_eq!(s.grpc_max_connection_age_grace, Duration::from_secs(90));
    // Anything but json is text, as in envoyproxy/ratelimit.
    assert!(!ok(&[("LOG_FORMAT", "logfmt")]).log.json);
    assert!(ok(&[("USE_PROMETHEUS", "false")]).prometheus.is_none());
}

#[test]
fn tls_settings_and_both_ca_names() {
    let base = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ];
    assert_eq!(
        ok(&base).tls,
        Some(TlsSettings {
            cert: "/certs/tls.crt".into(),
            key: "/certs/tls.key".into(),
            client_ca: None,
            client_san: None,
        })
    );
    let mut v = base.to_vec();
    v.push(("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"));
    assert_eq!(
        ok(&v).tls.unwrap().client_ca,
        Some(PathBuf::from("/certs/ca.crt"))
    );
    let mut v = base.to_vec();
    v.push(("GRPC_CLIENT_TLS_CACERT", "/ca/client.pem"));
    v.push(("GRPC_CLIENT_TLS_SAN", "envoy"));
    let t = ok(&v).tls.unwrap();
    assert_eq!(t.client_ca, Some(PathBuf::from("/ca/client.pem")));
    assert_eq!(t.client_san.as_deref(), Some("envoy"));
    // Files given but TLS off: plaintext.
    assert_eq!(ok(&base[1..]).tls, None);
    assert!(err(&base[..2]).contains("GRPC_SERVER_TLS_KEY"));
}

#[test]
fn tracing_settings() {
    let s = ok(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_SERVICE_NAMESPACE", "gateway"),
        ("TRACING_SAMPLING_RATE", "0.25"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318/"),
    ]);
    let t = s.tracing.unwrap();
    assert_eq!(t.service_name, "RateLimit");
    assert_eq!(t.service_namespace.as_deref(), Some("gateway"));
    assert_eq!(t.sampling_rate, 0.25);
    assert_eq!(t.protocol, OtlpProtocol::Http);
    assert_eq!(t.endpoint.as_deref(), Some("http://otel:4318/v1/traces"));
    let t = ok(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4317"),
    ])
    .tracing
    .unwrap();
    assert_eq!(t.protocol, OtlpProtocol::Grpc);
    assert_eq!(t.endpoint.as_deref(), Some("http://otel:4317"));
    let t = ok(&[
        ("TRACING_ENABLED", "true"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://otel:4318/custom",
        ),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored"),
    ])
    .tracing
    .unwrap();
    assert_eq!(t.endpoint.as_deref(), Some("http://otel:4318/custom"));
    assert!(ok(&[("TRACING_SAMPLING_RATE", "0.5")]).tracing.is_none());
    assert!(
        err(&[("TRACING_ENABLED", "true"), ("TRACING_SAMPLING_RATE", "2")])
            .contains("TRACING_SAMPLING_RATE")
    );
    assert!(err(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "zipkin")
    ])
    .contains("TRACING_EXPORTER_PROTOCOL"));
}

#[test]
fn heavy_hitters_per_limit_default_to_20_and_are_bounded() {
    assert_eq!(ok(&[]).top_n, 20);
    assert_eq!(ok(&[("TURNSTILE_TOP_N", "0")]).top_n, 0);
    assert_eq!(ok(&[("TURNSTILE_TOP_N", "50")]).top_n, 50);
    let e = err(&[("TURNSTILE_TOP_N", "5000")]);
    assert!(
        e.contains("TURNSTILE_TOP_N") && e.contains("from 0 to 1000"),
        "{e}"
    );
    assert_eq!(ok(&[]).top_sample, 8);
    assert_eq!(ok(&[("TURNSTILE_TOP_SAMPLE", "1")]).top_sample, 1);
    let e = err(&[("TURNSTILE_TOP_SAMPLE", "0")]);
    assert!(e.contains("TURNSTILE_TOP_SAMPLE"), "{e}");
}

#[test]
fn refusals_and_warnings() {
    assert!(err(&[("PROMETHEUS_ADDR", "9090")]).contains("PROMETHEUS_ADDR"));
    assert!(err(&[("PROMETHEUS_PATH", "metrics")]).contains("PROMETHEUS_PATH"));
    assert!(err(&[("DEBUG_PORT", "x")]).contains("DEBUG_PORT"));
    assert!(err(&[("RUNTIME_WATCH_ROOT", "sometimes")]).contains("RUNTIME_WATCH_ROOT"));
    assert!(err(&[("GRPC_MAX_CONNECTION_AGE", "1 day")]).contains("GRPC_MAX_CONNECTION_AGE"));
    // Envoy Gateway's and Istio's statsd switches: off is silent, and so is on (it is honoured).
    assert!(ok(&[("USE_STATSD", "false")]).ignored.is_empty());
    // Envoy Gateway's mapping file is read and honoured: no warning; a missing one is refused.
    let eg = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/it/telemetry/data/eg-statsd-conf.yaml"
    );
    let s = ok(&[("USE_STATSD", "true"), ("PROMETHEUS_MAPPER_YAML", eg)]);
    assert!(s.ignored.is_empty(), "{:?}", s.ignored);
    let e = err(&[("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml")]);
    assert!(
        e.contains("PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml"),
        "{e}"
    );
    // The unit switch changes the default mapping only.
    let s = ok(&[
        ("PROMETHEUS_MAPPER_YAML", eg),
        ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true"),
    ]);
    assert!(s.ignored[0].contains("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS"));
}

#[test]
fn statsd_settings_as_the_reference_reads_them() {
    use turnstile::telemetry::statsd::Protocol;
    // Off unless asked for or a statsd is named; on, the reference's defaults.
    assert!(ok(&[]).statsd.is_none());
    let s = ok(&[("USE_STATSD", "true")]).statsd.unwrap();
    assert_eq!((s.host.as_str(), s.port), ("localhost", 8125));
    assert_eq!(s.protocol, Protocol::Tcp);
    assert_eq!(s.flush_interval, Duration::from_secs(10));
    assert!(s.dog.is_none() && s.extra_tags.is_empty());
    let s = ok(&[("STATSD_HOST", "statsd"), ("STATSD_PORT", "9125")]);
    let s = s.statsd.expect("a named statsd turns the push on");
    assert_eq!((s.host.as_str(), s.port), ("statsd", 9125));
    assert!(ok(&[("STATSD_HOST", "statsd"), ("USE_STATSD", "false")])
        .statsd
        .is_none());
    assert!(ok(&[("USE_STATSD", "true"), ("DISABLE_STATS", "true")])
        .statsd
        .is_none());
    let s = ok(&[("USE_STATSD", "1"), ("EXTRA_TAGS", "b:x.y,a:1,c:")])
        .statsd
        .unwrap();
    let tags: Vec<(&str, &str)> = s
        .extra_tags
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(tags, [("a", "1"), ("b", "x_y")]);
    let dog = ok(&[("USE_DOG_STATSD", "true"), ("STATSD_HOST", "dd")])
        .statsd
        .unwrap();
    assert!(dog.dog.is_some_and(|m| m.is_empty()));
    // Bad input names what is wrong.
    let e = err(&[("USE_STATSD", "true"), ("USE_DOG_STATSD", "true")]);
    assert!(
        e.contains("USE_DOG_STATSD") && e.contains("USE_STATSD=false"),
        "{e}"
    );
    assert!(err(&[("USE_STATSD", "yes please")]).contains("USE_STATSD"));
    assert!(err(&[("STATSD_PORT", "0")]).contains("STATSD_PORT"));
    assert!(err(&[("STATSD_PORT", "x")]).contains("STATSD_PORT"));
    assert!(err(&[("USE_STATSD", "1"), ("STATSD_PROTOCOL", "quic")]).contains("STATSD_PROTOCOL"));
    assert!(err(&[("USE_STATSD", "1"), ("STATS_FLUSH_INTERVAL", "10")])
        .contains("STATS_FLUSH_INTERVAL"));
    assert!(err(&[("USE_STATSD", "1"), ("STATS_FLUSH_INTERVAL", "0s")]).contains("at least 1ms"));
    assert!(err(&[("USE_STATSD", "1"), ("EXTRA_TAGS", "novalue")]).contains("EXTRA_TAGS"));
    let dog = [
        ("USE_DOG_STATSD", "true"),
        ("USE_DOG_STATSD_MOGRIFIERS", "m"),
    ];
    let with = |more: &[(&'static str, &'static str)]| {
        let mut v = dog.to_vec();
        v.extend_from_slice(more);
        v
    };
    assert!(err(&dog).contains("DOG_STATSD_MOGRIFIER_M_PATTERN"));
    let e = err(&with(&[("DOG_STATSD_MOGRIFIER_M_PATTERN", "(")]));
    assert!(e.contains("DOG_STATSD_MOGRIFIER_M_PATTERN=("), "{e}");
    let e = err(&with(&[("DOG_STATSD_MOGRIFIER_M_PATTERN", "^a(.*)$")]));
    assert!(e.contains("DOG_STATSD_MOGRIFIER_M_NAME"), "{e}");
    let named = [
        ("DOG_STATSD_MOGRIFIER_M_PATTERN", "^a(.*)$"),
        ("DOG_STATSD_MOGRIFIER_M_NAME", "a"),
    ];
    let e = err(&with(&[
        named[0],
        named[1],
        ("DOG_STATSD_MOGRIFIER_M_TAGS", "k:"),
    ]));
    assert!(e.contains("tag k has no value"), "{e}");
    let s = ok(&with(&[
        named[0],
        named[1],
        ("DOG_STATSD_MOGRIFIER_M_TAGS", "k:$1"),
    ]));
    assert_eq!(
        s.statsd.unwrap().dog.unwrap()[0].tags,
        [("k".to_string(), "$1".to_string())]
    );
}

#[test]
fn go_durations() {
    assert_eq!(parse_go_duration("24h"), Ok(Duration::from_secs(86_400)));
    assert_eq!(parse_go_duration("1h30m"), Ok(Duration::from_secs(5_400)));
    assert_eq!(parse_go_duration("1.5s"), Ok(Duration::from_millis(1_500)));
    assert_eq!(parse_go_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
    for bad in ["", "5", "1d", "h", "-1s", "1h 30m"] {
        assert!(parse_go_duration(bad).is_err(), "{bad:?}");
    }
}

/// docs/settings.md says, for every setting of envoyproxy/ratelimit at its current head,
/// whether it is honoured, honoured differently or not, and why: each is named there by its
/// own name (a wildcard such as `REDIS_PERSECOND_*` does not count).
#[test]
fn the_settings_page_names_every_setting_of_the_reference() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let names = std::fs::read_to_string(root.join("tests/it/reference/data/settings.txt")).unwrap();
    let page = std::fs::read_to_string(root.join("docs/settings.md")).unwrap();
    let missing: Vec<&str> = (names.lines())
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter(|n| !page.contains(&format!("`{n}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/settings.md does not name {missing:?}"
    );
}

#[test]
fn client_values_are_digests_by_default_with_a_key_long_enough_when_set() {
    let c = ok(&[]).client_values;
    assert!(c.digest_key.is_none() && !c.show_clear, "{c:?}");
    let c = ok(&[
        ("TURNSTILE_CLIENT_DIGEST_KEY", "0123456789abcdef"),
        ("TURNSTILE_SHOW_CLIENT_VALUES", "true"),
    ])
    .client_values;
    assert!(c.digest_key.is_some() && c.show_clear);
    assert!(!format!("{c:?}").contains("0123456789abcdef"), "{c:?}");
    let e = err(&[("TURNSTILE_CLIENT_DIGEST_KEY", "short")]);
    assert!(
        e.contains("TURNSTILE_CLIENT_DIGEST_KEY") && e.contains("16"),
        "{e}"
    );
}
