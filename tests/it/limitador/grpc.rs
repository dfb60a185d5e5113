//! The RLS port: `ShouldRateLimit` and Kuadrant's `CheckRateLimit` and `Report`, as Limitador
//! answers them.

use super::*;

#[tokio::test]
async fn kuadrant_shaped_limits_admit_the_maximum_per_user_then_refuse() {
    let l = Limitador::start(&[], LIMITS);
    let mut codes = Vec::new();
    for _ in 0..4 {
        let r = unary(&l.grpc(), SHOULD_RATE_LIMIT, toystore("alice"))
            .await
            .unwrap();
        codes.push(code(&r));
        assert!(r.statuses.is_empty(), "Limitador never answers statuses");
        assert!(
            r.response_headers_to_add.is_empty(),
            "no headers without -H"
        );
    }
    assert_eq!(codes, ["OK", "OK", "OK", "OVER_LIMIT"]);
    // Another user has a counter of its own.
    let bob = unary(&l.grpc(), SHOULD_RATE_LIMIT, toystore("bob"))
        .await
        .unwrap();
    assert_eq!(code(&bob), "OK");
}

#[tokio::test]
async fn should_rate_limit_reads_requests_as_limitador_does() {
    let l = Limitador::start(&[], LIMITS);
    let call = |req| unary_owned(l.grpc(), req);
    // An empty domain is UNKNOWN and nothing else; an unknown one, or no applicable limit, OK.
    let empty = call(request("", &[&[("k", "v")]], 0)).await.unwrap();
    assert_eq!((code(&empty), empty.statuses.len()), ("UNKNOWN", 0));
    assert_eq!(
        code(&call(request("nope", &[&[("k", "v")]], 0)).await.unwrap()),
        "OK"
    );
    // hits_addend 5 on a limit of 2 is refused and counts nothing; 0 counts 1.
    let five = call(request("cel", &[&[("method", "GET")]], 5))
        .await
        .unwrap();
    assert_eq!(code(&five), "OVER_LIMIT");
    let codes: Vec<&str> = [
        call(request("cel", &[&[("method", "GET")]], 0))
            .await
            .unwrap(),
        call(request("cel", &[&[("method", "GET")]], 0))
            .await
            .unwrap(),
        call(request("cel", &[&[("method", "GET")]], 0))
            .await
            .unwrap(),
    ]
    .iter()
    .map(code)
    .collect();
    assert_eq!(codes, ["OK", "OK", "OVER_LIMIT"]);
    // A condition on a missing key is false; a variable on one skips its limit.
    for _ in 0..3 {
        let r = call(request("cel", &[&[("kind", "varmissing")]], 0))
            .await
            .unwrap();
        assert_eq!(code(&r), "OK");
    }
    // `in` and `&&` with `startsWith`, as CEL says.
    let gold = request("cel", &[&[("tier", "gold")]], 0);
    assert_eq!(code(&call(gold.clone()).await.unwrap()), "OK");
    assert_eq!(code(&call(gold).await.unwrap()), "OVER_LIMIT");
    assert_eq!(
        code(
            &call(request("cel", &[&[("tier", "bronze")]], 0))
                .await
                .unwrap()
        ),
        "OK"
    );
    // A variable indexing past the descriptors sent fails the call UNAVAILABLE.
    let past = call(request("v1", &[&[("k", "v")]], 0)).await.unwrap_err();
    assert_eq!(past.code(), tonic::Code::Unavailable);
    assert_eq!(past.message(), "Service unavailable");
    // Two descriptors: conditions on descriptors[1] apply.
    let d1 = |user| call(request("d1", &[&[("a", "b")], &[("user", user)]], 0));
    let codes = [
        d1("alice").await,
        d1("alice").await,
        d1("alice").await,
        d1("bob").await,
    ];
    let codes: Vec<&str> = codes.iter().map(|r| code(r.as_ref().unwrap())).collect();
    assert_eq!(codes, ["OK", "OK", "OVER_LIMIT", "OK"]);
    // max_value 0 refuses everything.
    assert_eq!(
        code(&call(request("zero", &[&[("x", "y")]], 0)).await.unwrap()),
        "OVER_LIMIT"
    );
}

#[tokio::test]
async fn a_condition_indexing_past_the_descriptors_is_unavailable_not_a_dropped_stream() {
    // Limitador panics here (limit.rs:162, an unwrap on IndexOutOfBounds): the stream is reset
    // with CANCEL and Envoy gets no status at all. turnstile answers UNAVAILABLE, which Envoy's
    // failure_mode_deny decides.
    let l = Limitador::start(&[], LIMITS);
    let e = unary(
        &l.grpc(),
        SHOULD_RATE_LIMIT,
        request("d1", &[&[("a", "b")]], 0),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
}

#[tokio::test]
async fn draft_03_headers_list_every_counter_tightest_first() {
    let l = Limitador::start(&["--rate-limit-headers", "DRAFT_VERSION_03"], LIMITS);
    let two = || request("two", &[&[("k", "v"), ("u", "x")]], 0);
    let first = unary(&l.grpc(), SHOULD_RATE_LIMIT, two()).await.unwrap();
    let headers: Vec<(String, String)> = (first.response_headers_to_add.iter())
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    let limit = "2, 2;w=60;name=\"tight\", 4;w=10;name=\"loose 'quoted'\", 10;w=3600";
    assert_eq!(headers[0], ("X-RateLimit-Limit".into(), limit.into()));
    assert_eq!(headers[1], ("X-RateLimit-Remaining".into(), "1".into()));
    // Limitador says 0 on the first hit of a counter without variables (it reads the time left
    // of a window not started yet), 59 on later hits; turnstile says the time left, 59.
    assert_eq!(headers[2], ("X-RateLimit-Reset".into(), "59".into()));
    assert_eq!(headers.len(), 3);
    unary(&l.grpc(), SHOULD_RATE_LIMIT, two()).await.unwrap();
    let refused = unary(&l.grpc(), SHOULD_RATE_LIMIT, two()).await.unwrap();
    assert_eq!(code(&refused), "OVER_LIMIT");
    let remaining = &refused.response_headers_to_add[1];
    assert_eq!(
        (remaining.key.as_str(), remaining.value.as_str()),
        ("X-RateLimit-Remaining", "0")
    );
    // No limit applies: no headers.
    let none = unary(
        &l.grpc(),
        SHOULD_RATE_LIMIT,
        request("nope", &[&[("k", "v")]], 0),
    )
    .await;
    assert!(none.unwrap().response_headers_to_add.is_empty());
}

#[tokio::test]
async fn check_counts_nothing_and_report_counts_unchecked() {
    let l = Limitador::start(&[], LIMITS);
    let check = || unary_owned(l.grpc(), toystore("carol")).with(CHECK);
    // CheckRateLimit checks 1 whatever hits_addend says, and counts nothing.
    for _ in 0..3 {
        assert_eq!(code(&check().await.unwrap()), "OK");
    }
    let mut five = toystore("carol");
    five.hits_addend = 5;
    assert_eq!(code(&unary(&l.grpc(), CHECK, five).await.unwrap()), "OK");
    // Report adds hits_addend (0 counts 1) unchecked, and answers OK.
    let mut two = toystore("carol");
    two.hits_addend = 2;
    assert_eq!(code(&unary(&l.grpc(), REPORT, two).await.unwrap()), "OK");
    assert_eq!(code(&check().await.unwrap()), "OK");
    assert_eq!(
        code(&unary(&l.grpc(), REPORT, toystore("carol")).await.unwrap()),
        "OK"
    );
    assert_eq!(code(&check().await.unwrap()), "OVER_LIMIT");
    // Past the maximum, still OK.
    let mut ten = toystore("carol");
    ten.hits_addend = 10;
    assert_eq!(code(&unary(&l.grpc(), REPORT, ten).await.unwrap()), "OK");
    // Empty domain: UNKNOWN for both.
    let empty = request("", &[&[("k", "v")]], 0);
    assert_eq!(
        code(&unary(&l.grpc(), CHECK, empty.clone()).await.unwrap()),
        "UNKNOWN"
    );
    assert_eq!(
        code(&unary(&l.grpc(), REPORT, empty).await.unwrap()),
        "UNKNOWN"
    );
}

/// A call that owns what it borrows, so closures can make them.
fn unary_owned(grpc: String, req: RateLimitRequest) -> Call {
    Call {
        grpc,
        req,
        method: SHOULD_RATE_LIMIT,
    }
}

struct Call {
    grpc: String,
    req: RateLimitRequest,
    method: &'static str,
}

impl Call {
    fn with(mut self, method: &'static str) -> Call {
        self.method = method;
        self
    }
}

impl std::future::IntoFuture for Call {
    type Output = Result<RateLimitResponse, tonic::Status>;
    type IntoFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { unary(&self.grpc, self.method, self.req).await })
    }
}
