//! The HTTP port: Limitador's routes, JSON and status codes.

use super::*;

async fn post(l: &Limitador, path: &str, body: &str) -> (u16, String, String) {
    let r = reqwest::Client::new()
        .post(l.http(path))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let headers = format!("{:?}", r.headers());
    (status, headers, r.text().await.unwrap())
}

async fn get(l: &Limitador, path: &str) -> (u16, String) {
    let r = reqwest::get(l.http(path)).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn status_and_limits_answer_limitador_json() {
    let l = Limitador::start(&[], LIMITS);
    let (code, body) = get(&l, "/status").await;
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    // Fields in Limitador's order; times UTC without a zone, as chrono's NaiveDateTime writes
    // them (`"2026-12-01T22:02:27.989445522"`).
    let order = [
        "started_at",
        "config_applied_at",
        "config_version",
        "config_err_since",
    ];
    let at: Vec<usize> = order.iter().map(|k| body.find(k).unwrap()).collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{body}");
    assert_eq!(
        (v["config_version"].as_u64(), v["config_err_since"].as_u64()),
        (Some(0), Some(0))
    );
    let t = v["started_at"].as_str().unwrap();
    assert!(
        t.len() >= 20 && t.as_bytes()[10] == b'T' && !t.ends_with('Z'),
        "{t}"
    );
    let (code, body) = get(&l, "/limits/idns").await;
    assert_eq!(code, 200);
    assert_eq!(
        body,
        r#"[{"id":"my-id-1","namespace":"idns","max_value":2,"seconds":60,"name":"with-id","conditions":[],"variables":[]}]"#
    );
    let (_, body) = get(&l, "/limits/ns%2Froute").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let per_route = v
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "per-route")
        .unwrap();
    assert_eq!(
        per_route.to_string(),
        r#"{"conditions":["descriptors[0][\"limit.per_route__deadbeef\"] == \"1\""],"id":null,"max_value":5,"name":"per-route","namespace":"ns/route","seconds":30,"variables":[]}"#
    );
    // Two limits differing only in max_value and name are one: the first in the file.
    assert_eq!(
        get(&l, "/limits/ident").await.1,
        r#"[{"id":null,"namespace":"ident","max_value":2,"seconds":60,"name":"ident-a","conditions":["descriptors[0][\"k\"] == \"v\""],"variables":[]}]"#
    );
    assert_eq!(get(&l, "/limits/does-not-exist").await, (200, "[]".into()));
    assert_eq!(
        get(&l, "/counters/does-not-exist").await,
        (200, "[]".into())
    );
}

#[tokio::test]
async fn check_report_and_check_and_report_answer_as_limitador() {
    let l = Limitador::start(&[], LIMITS);
    let get1 = r#"{"namespace":"cel","values":{"method":"GET"},"delta":1}"#;
    assert_eq!(post(&l, "/check", get1).await.2, "null");
    let (code, _, body) = post(&l, "/check_and_report", get1).await;
    assert_eq!((code, body.as_str()), (200, "null"));
    let (_, body) = get(&l, "/counters/cel").await;
    assert_eq!(
        body,
        r#"[{"limit":{"id":null,"namespace":"cel","max_value":2,"seconds":60,"name":"get","conditions":["descriptors[0][\"method\"] == \"GET\""],"variables":[]},"set_variables":{},"remaining":1,"expires_in_seconds":59}]"#
    );
    // /check of 2 with 1 left: 429, text; /check_and_report refused: 429, null.
    let get2 = r#"{"namespace":"cel","values":{"method":"GET"},"delta":2}"#;
    let (code, headers, body) = post(&l, "/check", get2).await;
    assert_eq!((code, body.as_str()), (429, "Too many requests"));
    assert!(headers.contains("text/plain; charset=utf-8"), "{headers}");
    let (code, headers, body) = post(&l, "/check_and_report", get2).await;
    assert_eq!((code, body.as_str()), (429, "null"));
    assert!(headers.contains("application/json"), "{headers}");
    // /report adds unchecked; past the maximum /counters says 0 left (Limitador wraps below
    // zero: 18446744073709551611 for 7 of 2).
    let five = r#"{"namespace":"cel","values":{"method":"GET"},"delta":5}"#;
    assert_eq!(post(&l, "/report", five).await.0, 200);
    let (_, body) = get(&l, "/counters/cel").await;
    assert!(body.contains(r#""remaining":0,"#), "{body}");
    // Draft 03 headers on request.
    let tier = r#"{"namespace":"cel","values":{"tier":"gold"},"delta":1,"response_headers":"DraftVersion03"}"#;
    let (code, headers, _) = post(&l, "/check_and_report", tier).await;
    assert_eq!(code, 200);
    assert!(
        headers.contains(r#""x-ratelimit-limit": "1, 1;w=60;name=\"tier\"""#),
        "{headers}"
    );
    assert!(
        headers.contains(r#""x-ratelimit-remaining": "0""#),
        "{headers}"
    );
    // No limit applies: 200.
    let none = r#"{"namespace":"nope","values":{},"delta":1}"#;
    assert_eq!(post(&l, "/check_and_report", none).await.0, 200);
}

#[tokio::test]
async fn bad_bodies_are_refused_naming_what_is_wrong() {
    let l = Limitador::start(&[], LIMITS);
    let (code, _, body) = post(
        &l,
        "/check_and_report",
        r#"{"namespace":"cel","values":{}}"#,
    )
    .await;
    assert_eq!(code, 400);
    assert!(
        body.starts_with("Json deserialize error: ") && body.contains("missing field `delta`"),
        "{body}"
    );
    let (code, _, body) = post(
        &l,
        "/check",
        r#"{"namespace":"cel","values":{"method":1},"delta":1}"#,
    )
    .await;
    assert_eq!(code, 400);
    assert!(
        body.contains("invalid type: integer `1`, expected a string"),
        "{body}"
    );
    let r = reqwest::Client::new()
        .post(l.http("/check"))
        .header("content-type", "text/plain")
        .body(r#"{"namespace":"cel","values":{},"delta":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.status().as_u16(), r.text().await.unwrap()),
        (400, "Content type error".into())
    );
}

#[tokio::test]
async fn metrics_carry_limitador_names_and_labels() {
    let l = Limitador::start(&["--limit-name-in-labels"], LIMITS);
    let with_user = request(
        "ns/route",
        &[
            &[
                ("limit.toystore_get__1a2b3c4d", "1"),
                ("auth.identity.userid", "a"),
            ],
            &[("user", "alice")],
        ],
        0,
    );
    for _ in 0..4 {
        unary(&l.grpc(), SHOULD_RATE_LIMIT, with_user.clone())
            .await
            .unwrap();
    }
    let zero = request("zero", &[&[("x", "y")]], 0);
    unary(&l.grpc(), SHOULD_RATE_LIMIT, zero).await.unwrap();
    let (_, text) = get(&l, "/metrics").await;
    // The labels of descriptors[1] (clear on loopback), the namespace, and with -l the name.
    assert!(
        text.contains(
            "# HELP authorized_calls Authorized calls\n# TYPE authorized_calls counter\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"authorized_calls{limitador_namespace="ns/route",user="alice"} 3"#),
        "{text}"
    );
    assert!(
        text.contains(r#"authorized_hits{limitador_namespace="ns/route",user="alice"} 3"#),
        "{text}"
    );
    assert!(text.contains(r#"limited_calls{limit_name="toystore-get",limitador_namespace="ns/route",user="alice"} 1"#), "{text}");
    assert!(
        text.contains(r#"limited_calls{limit_name="zero",limitador_namespace="zero"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("limitador_up 1\n") && text.contains("datastore_partitioned 0\n"),
        "{text}"
    );
    // turnstile's own series follow.
    assert!(text.contains("ratelimit_service_"), "{text}");
}
