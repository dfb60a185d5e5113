//! The settings that shape a request's way through: what the plan counts and how the answer is
//! written. `settings` fills them; the plan and the answer read them.

use super::request::RequestLimits;

/// Header names for the RateLimit-* response headers (`LIMIT_RESPONSE_HEADERS_ENABLED`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    /// `TURNSTILE_RESPONSE_HEADERS=ietf`: the IETF `RateLimit` and `RateLimit-Policy` fields
    /// (draft-ietf-httpapi-ratelimit-headers-11), the policy named after the limit, instead of
    /// the three below.
    pub ietf: bool,
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

/// The settings that shape answers.
#[derive(Debug, Clone)]
pub struct AnswerSettings {
    pub response_headers: Option<HeaderNames>,
    pub global_shadow_mode: bool,
    pub request_limits: RequestLimits,
    pub counting_rule: CountingRule,
    /// `QUOTA_MODE`: every limit is joint (refuses only when all of them are over).
    pub global_quota_mode: bool,
    /// `RESPONSE_DYNAMIC_METADATA`: dynamic metadata describing the request, and the
    /// `metadata` of the descriptors that passed.
    pub response_dynamic_metadata: bool,
    /// `TURNSTILE_REFUSED_BY_METADATA`: a refused answer's dynamic metadata names the limit
    /// that refused (`refused_by`).
    pub refused_by_metadata: bool,
}

/// Which hits of a refused request count, for the whole process
/// (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`): the rule each op's
/// [`Counting`](crate::limiter::Counting) is drawn from, by what its descriptor carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CountingRule {
    /// Unset: usage reported after the fact, a descriptor with its own `hits_addend` (Envoy's
    /// `hits_addend` on a rate limit, `apply_on_stream_done` reports included), counts in full;
    /// other hits count only when the request is admitted.
    #[default]
    UsageInFull,
    /// `false`: every hit counts, admitted or not (envoyproxy/ratelimit's default).
    Always,
    /// `true`: a refused request consumes nothing, reported usage included.
    IfAdmitted,
}
