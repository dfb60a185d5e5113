//! The counting rules, case by case and as properties: never more than the limit per window.

use proptest::prelude::*;

use super::*;

const NS: u64 = 1_000_000_000;

const MIN: u64 = 60 * NS;

fn p(alg: Algorithm, rpu: u32, window_secs: u64) -> Params {
    Params {
        requests_per_unit: rpu,
        window_ms: window_secs * 1000,
        algorithm: alg,
        calendar: None,
        tat: super::Tat::Full,
    }
}

/// Feeds `hits` at `now`, committing when admitted, as a shard does.
fn hit(s: &mut State, p: &Params, now: u64, hits: u64) -> Eval {
    let e = s.eval(p, now, hits);
    if !e.over {
        *s = e.next;
    }
    e
}

/// `n` calls of one hit at `now`: (over, remaining) of each.
fn hits_at(s: &mut State, p: &Params, now: u64, n: usize) -> Vec<(bool, u32)> {
    (0..n)
        .map(|_| hit(s, p, now, 1))
        .map(|e| (e.over, e.remaining))
        .collect()
}

// A time well inside a minute window: 1_700_000_000 s is 20 s past a minute boundary.
const T0: u64 = 1_700_000_000 * NS;

#[test]
fn fixed_window_counts_to_the_limit_inclusive() {
    let p = p(Algorithm::FixedWindow, 3, 60);
    let mut s = State::fresh(&p, T0);
    let r = hits_at(&mut s, &p, T0, 4);
    assert_eq!(r, vec![(false, 2), (false, 1), (false, 0), (true, 0)]);
}

#[test]
fn fixed_window_reset_is_the_time_to_the_aligned_end() {
    let p = p(Algorithm::FixedWindow, 3, 60);
    let s = State::fresh(&p, T0);
    // 20 s into the minute: 40 s left. Rounded up to whole seconds (as the service reports it)
    // this is the reference's `unit - now % unit` at any instant within the second.
    assert_eq!(s.eval(&p, T0, 1).reset_ns, 40 * NS);
    assert_eq!(s.eval(&p, T0 + NS / 2, 1).reset_ns, 39 * NS + NS / 2);
    assert_eq!(s.eval(&p, T0 + NS / 2, 1).reset_ns.div_ceil(NS), 40);
    let hour = super::Params {
        window_ms: 3_600_000,
        ..p
    };
    // 1_700_000_000 mod 3600 = 800.
    assert_eq!(
        State::fresh(&hour, T0).eval(&hour, T0, 1).reset_ns,
        2800 * NS
    );
}

#[test]
fn fixed_window_starts_over_at_the_boundary() {
    let p = p(Algorithm::FixedWindow, 1, 60);
    let mut s = State::fresh(&p, T0);
    assert!(!hit(&mut s, &p, T0, 1).over);
    assert!(hit(&mut s, &p, T0 + 39 * NS, 1).over);
    assert!(!hit(&mut s, &p, T0 + 40 * NS, 1).over, "new aligned window");
}

#[test]
fn zero_hits_checks_without_consuming_and_zero_limit_blocks() {
    let p1 = p(Algorithm::FixedWindow, 1, 60);
    let mut s = State::fresh(&p1, T0);
    assert!(!hit(&mut s, &p1, T0, 0).over);
    assert!(!hit(&mut s, &p1, T0, 1).over, "the check took nothing");
    let p0 = p(Algorithm::FixedWindow, 0, 60);
    assert!(State::fresh(&p0, T0).eval(&p0, T0, 1).over);
    let g0 = p(Algorithm::TokenBucket { burst: 0 }, 0, 60);
    assert!(State::fresh(&g0, T0).eval(&g0, T0, 1).over);
}

#[test]
fn refund_gives_back_within_the_window_only() {
    let p = p(Algorithm::FixedWindow, 2, 60);
    let mut s = State::fresh(&p, T0);
    hit(&mut s, &p, T0, 2);
    assert!(s.eval(&p, T0, 1).over);
    s.refund(&p, T0, 1);
    assert_eq!(s.eval(&p, T0, 1).remaining, 0);
    assert!(!s.eval(&p, T0, 1).over);
}

#[test]
fn sliding_window_weighs_the_previous_window() {
    let p = p(Algorithm::SlidingWindow, 10, 60);
    let start = (T0 / MIN) * MIN; // a window boundary
    let mut s = State::fresh(&p, start);
    assert!(!hit(&mut s, &p, start + NS, 10).over);
    // Half-way through the next window, half of the previous 10 still count.
    let mid = start + MIN + 30 * NS;
    let e = s.eval(&p, mid, 5);
    assert!(!e.over);
    assert_eq!(e.remaining, 0);
    assert!(s.eval(&p, mid, 6).over);
    // Two windows later nothing of it is left.
    assert!(!s.eval(&p, start + 2 * MIN, 10).over);
}

#[test]
fn token_bucket_bursts_then_refills_at_the_rate() {
    // 10 per minute = one token every 6 s, burst 3.
    let p = p(Algorithm::TokenBucket { burst: 3 }, 10, 60);
    let mut s = State::fresh(&p, T0);
    let r = hits_at(&mut s, &p, T0, 4);
    assert_eq!(r, vec![(false, 2), (false, 1), (false, 0), (true, 0)]);
    let e = s.eval(&p, T0, 1);
    assert_eq!(e.reset_ns, 18 * NS, "full again after three intervals");
    assert_eq!(e.retry_ns, 6 * NS, "one token back after one interval");
    assert!(hit(&mut s, &p, T0 + 6 * NS - 1, 1).over);
    assert!(!hit(&mut s, &p, T0 + 6 * NS, 1).over);
}

#[test]
fn a_key_full_under_a_limit_is_not_full_under_a_higher_one() {
    let full = p(Algorithm::FixedWindow, 2, 60);
    assert!(p(Algorithm::FixedWindow, 2, 60).no_roomier_than(&full));
    assert!(p(Algorithm::FixedWindow, 1, 60).no_roomier_than(&full));
    assert!(!p(Algorithm::FixedWindow, 100, 60).no_roomier_than(&full));
    assert!(
        !p(Algorithm::FixedWindow, 2, 1).no_roomier_than(&full),
        "other window"
    );
    assert!(!p(Algorithm::SlidingWindow, 2, 60).no_roomier_than(&full));
    let bucket = p(Algorithm::TokenBucket { burst: 2 }, 6, 60);
    assert!(p(Algorithm::TokenBucket { burst: 2 }, 6, 60).no_roomier_than(&bucket));
    assert!(!p(Algorithm::TokenBucket { burst: 5 }, 6, 60).no_roomier_than(&bucket));
}

#[test]
fn min_wait_predicts_whole_windows() {
    let p = p(Algorithm::FixedWindow, 2, 60);
    let mut s = State::fresh(&p, T0);
    hit(&mut s, &p, T0, 2);
    assert_eq!(s.min_wait(&p, T0, 1), Some(40 * NS), "next window");
    assert_eq!(
        s.min_wait(&p, T0, 3),
        Some(40 * NS + MIN),
        "two windows ahead"
    );
    let g = super::Params {
        algorithm: Algorithm::TokenBucket { burst: 2 },
        calendar: None,
        ..p
    };
    let mut s = State::fresh(&g, T0);
    hit(&mut s, &g, T0, 2);
    assert_eq!(
        s.min_wait(&g, T0, 2),
        Some(60 * NS),
        "two tokens at 30 s each"
    );
    let zero = super::Params {
        requests_per_unit: 0,
        ..p
    };
    assert_eq!(State::fresh(&zero, T0).min_wait(&zero, T0, 1), None);
}

/// Arrivals: (gap in ms since the previous one, hits).
fn arrivals() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..3_000, 1u64..4), 1..300)
}

fn run(alg: Algorithm, rpu: u32, secs: u64, seq: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let p = p(alg, rpu, secs);
    let mut now = T0;
    let mut s = State::fresh(&p, now);
    let mut admitted = Vec::new();
    for &(gap, hits) in seq {
        now += gap * 1_000_000;
        if !s.fits(&p) {
            s = State::fresh(&p, now);
        }
        if !hit(&mut s, &p, now, hits).over {
            admitted.push((now, hits));
        }
    }
    admitted
}

/// The most admitted within any span `[t, t + len)`.
fn max_in_span(admitted: &[(u64, u64)], len: u64) -> u64 {
    let mut best = 0;
    let mut sum = 0;
    let mut lo = 0;
    for hi in 0..admitted.len() {
        sum += admitted[hi].1;
        while admitted[hi].0 - admitted[lo].0 >= len {
            sum -= admitted[lo].1;
            lo += 1;
        }
        best = best.max(sum);
    }
    best
}

proptest! {
    #[test]
    fn fixed_window_never_admits_more_than_the_limit_per_aligned_window(seq in arrivals(), rpu in 1u32..20) {
        let admitted = run(Algorithm::FixedWindow, rpu, 1, &seq);
        let mut per: std::collections::HashMap<u64, u64> = Default::default();
        for (t, h) in admitted {
            *per.entry(t / NS).or_default() += h;
        }
        prop_assert!(per.values().all(|&n| n <= u64::from(rpu)));
    }

    #[test]
    fn sliding_window_stays_within_its_documented_bounds(seq in arrivals(), rpu in 1u32..20) {
        let admitted = run(Algorithm::SlidingWindow, rpu, 1, &seq);
        // Never more than the limit in an aligned window...
        let mut per: std::collections::HashMap<u64, u64> = Default::default();
        for (t, h) in &admitted {
            *per.entry(t / NS).or_default() += h;
        }
        prop_assert!(per.values().all(|&n| n <= u64::from(rpu)));
        // ...and never more than twice the limit in any window-long span.
        prop_assert!(max_in_span(&admitted, NS) <= 2 * u64::from(rpu));
    }

    #[test]
    fn token_bucket_admits_at_most_burst_plus_rate_times_span(seq in arrivals(), rpu in 1u32..20, burst in 1u32..10) {
        let admitted = run(Algorithm::TokenBucket { burst }, rpu, 1, &seq);
        let interval = NS / u64::from(rpu);
        for span_ms in [100u64, 1_000, 5_000] {
            let span = span_ms * 1_000_000;
            let bound = u64::from(burst) + span / interval + 1;
            prop_assert!(max_in_span(&admitted, span) <= bound);
        }
    }

    #[test]
    fn token_bucket_agrees_with_a_plain_bucket_model(seq in arrivals(), rpu in 1u32..20, burst in 1u32..10) {
        let params = p(Algorithm::TokenBucket { burst }, rpu, 1);
        let interval = NS / u64::from(rpu);
        let capacity = interval * u64::from(burst);
        // The model: a level of "token-nanoseconds", full at capacity, drained by hits × interval.
        let mut level = capacity;
        let mut now = T0;
        let mut last = T0;
        let mut s = State::fresh(&params, now);
        for (gap, hits) in seq {
            now += gap * 1_000_000;
            level = (level + (now - last)).min(capacity);
            last = now;
            let model_ok = level >= hits * interval;
            if model_ok {
                level -= hits * interval;
            }
            let e = hit(&mut s, &params, now, hits);
            prop_assert_eq!(!e.over, model_ok);
            if model_ok {
                prop_assert_eq!(u64::from(e.remaining), level / interval);
            }
        }
    }
}

/// Usage counted in full (`State::add`) passes the limit: `past` says by how much, and a check
/// (0 hits) is over while it is.
#[test]
fn usage_past_the_limit_is_measured_and_refuses_checks() {
    for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let lim = p(alg, 10, 60);
        let s = State::fresh(&lim, T0).add(&lim, T0, 8);
        let e = s.eval(&lim, T0, 5);
        assert_eq!((e.over, e.remaining, e.past), (true, 0, 3), "{alg:?}");
        let s = s.add(&lim, T0, 5);
        assert_eq!(s.eval(&lim, T0, 0).past, 3, "{alg:?}");
        assert!(
            s.eval(&lim, T0, 0).over,
            "{alg:?}: a check over a passed budget"
        );
    }
    // Fixed: room again when the window ends (40 s on); sliding: once the 13 of this window,
    // weighing on the next, have decayed to 10 (13.85 s into it).
    let retry = |alg| {
        let lim = p(alg, 10, 60);
        let s = State::fresh(&lim, T0).add(&lim, T0, 13);
        s.eval(&lim, T0, 0).retry_ns
    };
    assert_eq!(retry(Algorithm::FixedWindow), 40 * NS);
    assert_eq!(
        retry(Algorithm::SlidingWindow),
        40 * NS + 60 * NS - 600 * NS / 13
    );
    // A token bucket of 10 a minute (6 s a token) 15 tokens in: 5 tokens of debt, which
    // refuses until 30 s have refilled them, then admits a check.
    let lim = p(Algorithm::TokenBucket { burst: 10 }, 10, 60);
    let s = State::fresh(&lim, T0).add(&lim, T0, 15);
    let e = s.eval(&lim, T0, 0);
    assert_eq!((e.over, e.past), (true, 5));
    assert!(s.eval(&lim, T0 + 29 * NS, 0).over);
    let e = s.eval(&lim, T0 + 30 * NS, 0);
    assert_eq!((e.over, e.remaining, e.past), (false, 0, 0));
}

/// What a look-up reports as used agrees with what a check (hits 0) leaves: used + remaining is
/// the limit (the burst for a bucket) while within it, for every algorithm and at any time.
#[test]
fn used_and_remaining_add_up_to_the_limit() {
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket { burst: 10 },
    ] {
        let lim = p(alg, 10, 60);
        let mut s = State::fresh(&lim, T0);
        assert_eq!(s.used(&lim, T0), 0, "{alg:?}");
        for (i, dt) in [0, 1, 7, 30, 45, 61, 95, 130].into_iter().enumerate() {
            let now = T0 + dt * NS;
            hit(&mut s, &lim, now, 1 + i as u64 % 3);
            let e = s.eval(&lim, now, 0);
            if !e.over {
                assert_eq!(
                    s.used(&lim, now) + u64::from(e.remaining),
                    10,
                    "{alg:?} at +{dt}s"
                );
            }
        }
    }
    // The fixed window counts only its own window; usage in full passes the limit.
    let lim = p(Algorithm::FixedWindow, 10, 60);
    let s = State::fresh(&lim, T0).add(&lim, T0, 13);
    assert_eq!(s.used(&lim, T0), 13);
    assert_eq!(s.used(&lim, T0 + 40 * NS), 0);
}

// ------------------------------------------------------------------------------------------
// Windows of N units and calendar windows.

fn calendar(alg: Algorithm, rpu: u32, zone: &str, unit: crate::config::Unit) -> Params {
    let c = crate::config::Calendar::new(zone, unit, 1).unwrap();
    Params {
        calendar: Some(c),
        ..p(alg, rpu, unit.seconds())
    }
}

#[test]
fn a_five_minute_window_is_aligned_to_multiples_of_300_s() {
    let five = p(Algorithm::FixedWindow, 2, 300);
    // 1_700_000_000 s is 200 s into its 5-minute window.
    let t0 = 1_700_000_000 * NS;
    let mut s = State::fresh(&five, t0);
    assert_eq!(
        hits_at(&mut s, &five, t0, 3),
        [(false, 1), (false, 0), (true, 0)]
    );
    assert_eq!(s.eval(&five, t0, 1).reset_ns, 100 * NS);
    assert_eq!(s.eval(&five, t0, 1).retry_ns, 100 * NS);
    assert_eq!(hits_at(&mut s, &five, t0 + 100 * NS, 1), [(false, 1)]);
    // A bucket of 5 per 5 minutes takes a minute a token.
    let bucket = p(Algorithm::TokenBucket { burst: 1 }, 5, 300);
    assert_eq!(bucket.interval_ns(), 60 * NS);
}

#[test]
fn a_calendar_day_lasts_23_hours_when_the_clocks_spring_forward() {
    let day = calendar(
        Algorithm::FixedWindow,
        1,
        "Europe/Berlin",
        crate::config::Unit::Day,
    );
    // 2026-03-29 in Berlin: 2026-03-28T23:00Z to 2026-03-29T22:00Z.
    let start = 1_774_738_800 * NS;
    let mut s = State::fresh(&day, start);
    assert_eq!(hits_at(&mut s, &day, start, 2), [(false, 0), (true, 0)]);
    let e = s.eval(&day, start, 1);
    assert_eq!((e.reset_ns, e.retry_ns), (23 * 3600 * NS, 23 * 3600 * NS));
    assert_eq!(s.expires_at(&day, start), start + 23 * 3600 * NS);
    assert!(s.eval(&day, start + 23 * 3600 * NS - 1, 1).over);
    assert!(!s.eval(&day, start + 23 * 3600 * NS, 1).over);
}

#[test]
fn a_calendar_sliding_month_weighs_the_last_month_by_this_ones_share() {
    let month = calendar(
        Algorithm::SlidingWindow,
        28,
        "UTC",
        crate::config::Unit::Month,
    );
    // February 2026 (28 days) full, then a quarter into March (31 days): 28 × 3/4 = 21 weigh.
    let feb = 1_769_904_000 * NS;
    let mar = 1_772_323_200 * NS;
    let mut s = State::fresh(&month, feb);
    hit(&mut s, &month, feb, 28);
    assert!(s.eval(&month, mar, 1).over);
    let quarter = mar + 31 * 86_400 * NS / 4;
    assert_eq!(s.used(&month, quarter), 21);
    assert_eq!(s.eval(&month, quarter, 7).remaining, 0);
    assert!(s.eval(&month, quarter, 8).over);
    // Kept until the end of March, where February no longer weighs.
    assert_eq!(s.expires_at(&month, feb), 1_775_001_600 * NS);
}

proptest! {
    #[test]
    fn calendar_windows_reset_at_their_end(
        secs in 400_000_000u64..4_000_000_000,
        zone in prop_oneof![Just("UTC"), Just("America/New_York"), Just("Australia/Lord_Howe")],
        unit in prop_oneof![
            Just(crate::config::Unit::Day),
            Just(crate::config::Unit::Week),
            Just(crate::config::Unit::Month),
            Just(crate::config::Unit::Year),
        ],
    ) {
        let p = calendar(Algorithm::FixedWindow, 1, zone, unit);
        let now = secs * NS;
        let span = p.span(now);
        let mut s = State::fresh(&p, now);
        let e = hit(&mut s, &p, now, 1);
        prop_assert_eq!(e.reset_ns, span.end - now);
        prop_assert!(s.eval(&p, span.end - 1, 1).over);
        prop_assert!(!s.eval(&p, span.end, 1).over);
        prop_assert_eq!(s.expires_at(&p, now), span.end);
    }
}

/// Limitador's window: it starts at the key's first hit, not at a multiple of its length.
#[test]
fn a_window_from_the_first_hit_starts_there_and_ends_a_length_later() {
    let p = Params {
        requests_per_unit: 2,
        window_ms: 60_000,
        algorithm: Algorithm::FromFirstHit,
        calendar: None,
        tat: Tat::Full,
    };
    let s = 1_000_000_000;
    let t0 = 1_700_000_017 * s;
    let fresh = State::fresh(&p, t0);
    // A check starts no window.
    assert_eq!(fresh.eval(&p, t0, 0).next, fresh);
    let first = fresh.eval(&p, t0, 1);
    assert!(!first.over);
    assert_eq!((first.remaining, first.reset_ns), (1, 60 * s));
    let second = first.next.eval(&p, t0 + 59 * s, 1);
    assert!(!second.over);
    assert_eq!(second.reset_ns, s);
    let third = second.next.eval(&p, t0 + 59 * s, 1);
    assert!(third.over);
    assert_eq!(third.retry_ns, s);
    // At its end a new window starts with the next hit.
    let again = second.next.eval(&p, t0 + 60 * s, 1);
    assert!(!again.over);
    assert_eq!((again.remaining, again.reset_ns), (1, 60 * s));
    assert_eq!(second.next.used(&p, t0 + 60 * s), 0);
    assert_eq!(second.next.expires_at(&p, t0), t0 + 60 * s);
    // More than the limit never fits.
    assert_eq!(fresh.eval(&p, t0, 3).retry_ns, u64::MAX);
    assert_eq!(fresh.min_wait(&p, t0, 3), Some(60 * s));
}
