//! GoCC's key file (`CONFIG_FILE`), read as kivra/GoCC `pkg/config/config.go` reads it.

use std::time::Duration;

use crate::config::{GoccKeys, KeyLimits};

const BASE: KeyLimits = KeyLimits {
    max_requests: 100,
    max_in_queue: 400,
    window: Duration::from_millis(1000),
};

/// GoCC's README example file.
const README: &str = r#"{
  "keys": [
    {"key_pattern": "^user-.*", "key_pattern_is_regex": true,
     "max_requests_per_window": 100, "max_requests_in_queue": 50, "window_millis": 60000},
    {"key_pattern": "^admin-.*", "key_pattern_is_regex": true,
     "max_requests_per_window": 200, "max_requests_in_queue": 100, "window_millis": 30000},
    {"key_pattern": "guest", "key_pattern_is_regex": false,
     "max_requests_per_window": 10, "max_requests_in_queue": 5, "window_millis": 120000},
    {"key_pattern": "user-cjk", "key_pattern_is_regex": false, "max_requests_per_window": 1}
  ]
}"#;

fn limits(r: u32, q: u32, ms: u64) -> KeyLimits {
    KeyLimits {
        max_requests: r,
        max_in_queue: q,
        window: Duration::from_millis(ms),
    }
}

#[test]
fn readme_file_merges_every_match_in_order() {
    let g = GoccKeys::parse("gocc.json", README).unwrap();
    assert!(g.warnings.is_empty());
    // limiter_manager.go:238-252: every match applied in order, 0 = unset.
    assert_eq!(g.apply("user-cjk", BASE), limits(1, 50, 60_000));
    assert_eq!(g.apply("user-1", BASE), limits(100, 50, 60_000));
    assert_eq!(g.apply("guest", BASE), limits(10, 5, 120_000));
    assert_eq!(
        g.apply("guest-1", BASE),
        BASE,
        "exact patterns are the whole key"
    );
    assert_eq!(g.apply("other", BASE), BASE);
}

#[test]
fn go_json_rules() {
    // encoding/json: case-insensitive names, unknown fields skipped, null = zero value.
    let g = GoccKeys::parse(
        "f",
        r#"{"Keys": [null, {"KEY_PATTERN": "a", "Max_Requests_Per_Window": 3, "note": "x",
            "window_millis": null}], "comment": 1}"#,
    )
    .unwrap();
    assert_eq!(g.apply("a", BASE), limits(3, 400, 1000));
    assert_eq!(g.warnings.len(), 2, "{:?}", g.warnings);
    assert!(GoccKeys::parse("f", "null").unwrap().entries.is_empty());
    assert!(GoccKeys::parse("f", "{}").unwrap().entries.is_empty());
}

#[test]
fn unanchored_regexes_as_go_match_string() {
    let g = GoccKeys::parse(
        "f",
        r#"{"keys": [{"key_pattern": "api", "key_pattern_is_regex": true,
                      "max_requests_per_window": 7}]}"#,
    )
    .unwrap();
    assert_eq!(g.apply("my-api-key", BASE).max_requests, 7);
}

#[test]
fn bad_files_name_the_entry_and_field() {
    for (json, want) in [
        ("[1]", "expected an object"),
        ("{\"keys\": 3}", "keys: expected a list"),
        ("{\"keys\": [1]}", "keys[0]: expected an object"),
        (
            r#"{"keys": [{"key_pattern": "(", "key_pattern_is_regex": true}]}"#,
            "keys[0].key_pattern: \"(\" is not a valid Go regular expression",
        ),
        (
            r#"{"keys": [{"key_pattern": "a", "window_millis": -5}]}"#,
            "keys[0].window_millis: -5 is negative",
        ),
        (
            r#"{"keys": [{"key_pattern": "a", "max_requests_per_window": 1.5}]}"#,
            "keys[0].max_requests_per_window: 1.5 is not a whole number",
        ),
        (
            r#"{"keys": [{"key_pattern": "a", "max_requests_in_queue": 1000000001}]}"#,
            "keys[0].max_requests_in_queue: 1000000001 is over 1000000000",
        ),
        (
            r#"{"keys": [{"key_pattern": "a", "key_pattern_is_regex": "yes"}]}"#,
            "keys[0].key_pattern_is_regex: expected true or false",
        ),
        ("{\"keys\": [", "not valid JSON"),
    ] {
        let e = GoccKeys::parse("gocc.json", json).unwrap_err().to_string();
        assert!(
            e.starts_with("gocc.json: ") && e.contains(want),
            "{json}: {e}"
        );
    }
}
