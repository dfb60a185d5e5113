use super::*;
use crate::limiter::key::KeyRef;
use crate::limiter::op::test_op;

const SEC: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// An op of a 10-a-second limit.
fn op_of(key: &str, algorithm: Algorithm, local_first: Option<bool>) -> Op {
    Op {
        local_first,
        reserve: crate::limiter::Reservation::None,
        ..test_op(key, algorithm, 10, 1000)
    }
}

/// Local-first: an op of a 10-a-second limit.
fn op(key: &str, algorithm: Algorithm) -> Op {
    op_of(key, algorithm, Some(true))
}

/// Fallback: an op of a 10-a-10-seconds limit.
fn exact(key: &str, algorithm: Algorithm) -> Op {
    Op {
        local_first: Some(false),
        reserve: crate::limiter::Reservation::None,
        ..test_op(key, algorithm, 10, 10_000)
    }
}

/// A local-first ledger synced every 100 ms.
fn local_first(cap: usize) -> (Ledger, Arc<LinkStats>) {
    let stats = Arc::new(LinkStats::default());
    let l = Ledger::new(Mode::LocalFirst, 100 * MS, cap, stats.clone());
    (l, stats)
}

/// A fallback ledger retried every second.
fn fallback(cap: usize) -> (Ledger, Arc<LinkStats>) {
    let stats = Arc::new(LinkStats::default());
    (Ledger::new(Mode::Fallback, SEC, cap, stats.clone()), stats)
}

fn take(l: &mut Ledger, now: u64, ready: bool) -> Vec<SyncOp> {
    let mut out = Vec::new();
    l.take(now, ready, &mut out);
    out
}

fn sent(out: &[SyncOp]) -> Vec<(i64, u64)> {
    let mut v: Vec<(i64, u64)> = out.iter().map(|s| (s.signed_hits(), s.at)).collect();
    v.sort();
    v
}

fn counted(stats: &LinkStats, c: fn(&LinkStats) -> &std::sync::atomic::AtomicU64) -> u64 {
    c(stats).load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn only_local_first_fixed_windows_and_buckets_apply() {
    let l = local_first(100).0.on_by_default(true);
    assert!(l.applies(&op_of("a", Algorithm::FixedWindow, None)));
    assert!(l.applies(&op_of("a", Algorithm::TokenBucket { burst: 3 }, None)));
    assert!(!l.applies(&op_of("a", Algorithm::SlidingWindow, None)));
    assert!(!l.applies(&op_of("a", Algorithm::FixedWindow, Some(false))));
    let l = local_first(100).0;
    assert!(!l.applies(&op_of("a", Algorithm::FixedWindow, None)));
    assert!(l.applies(&op_of("a", Algorithm::FixedWindow, Some(true))));
    assert!(!fallback(100).0.applies(&op("a", Algorithm::FixedWindow)));
}

#[test]
fn a_key_without_a_fresh_count_goes_exact_unless_the_store_is_away() {
    let (mut l, _) = local_first(100);
    let a = op("a", Algorithm::FixedWindow);
    assert!(!l.local(std::slice::from_ref(&a), 10 * SEC, true));
    assert!(l.local(std::slice::from_ref(&a), 10 * SEC, false));
    l.record(&a, 1, 10 * SEC);
    l.entries.get_mut(&KeyRef::of("a")).unwrap().read_at = 10 * SEC;
    assert!(l.local(std::slice::from_ref(&a), 10 * SEC + 150 * MS, true));
    assert!(!l.local(std::slice::from_ref(&a), 10 * SEC + 151 * MS, true));
}

#[test]
fn a_sync_sends_local_hits_and_refreshes_used_keys() {
    let (mut l, _) = local_first(100);
    let a = op("a", Algorithm::FixedWindow);
    let t = 10 * SEC;
    l.record(&a, 1, t);
    l.record(&a, 1, t + MS);
    l.record(&a, -1, t + 2 * MS);
    let due = take(&mut l, t + 3 * MS, true);
    assert_eq!(due.len(), 1);
    assert_eq!((due[0].op.hits, due[0].at), (1, t));
    // Not due again before the interval; an unused key is forgotten at the next sync.
    assert!(take(&mut l, t + 50 * MS, true).is_empty());
    l.entries.get_mut(&KeyRef::of("a")).unwrap().sending = 0;
    assert!(take(&mut l, t + 103 * MS, true).is_empty());
    assert!(l.entries.is_empty());
}

#[test]
fn hits_of_an_ended_window_go_on_their_own_and_are_dropped_if_the_sync_fails_late() {
    let (mut l, stats) = local_first(100);
    let a = op("a", Algorithm::FixedWindow);
    let t = 10 * SEC + 950 * MS;
    l.record(&a, 2, t);
    l.record(&a, 1, t + 100 * MS);
    let due = take(&mut l, t + 110 * MS, true);
    let mut out: Vec<(u64, u64)> = due.iter().map(|d| (d.op.hits, d.at)).collect();
    out.sort();
    assert_eq!(out, vec![(1, t + 100 * MS), (2, t)]);
    // The store was away: the current window's hit waits, the ended window's is dropped.
    for s in due {
        l.failed(s, false, t + 120 * MS);
    }
    assert!(l.late.is_empty());
    assert_eq!(l.entries[&KeyRef::of("a")].delta, 1);
    assert_eq!(counted(&stats, |s| &s.local_first_dropped_hits), 2);
}

#[test]
fn a_sync_that_failed_goes_again_unless_it_was_abandoned_at_the_deadline() {
    let a = op("a", Algorithm::FixedWindow);
    let t = 10 * SEC;
    for (landed, again) in [(false, Some(3)), (true, None)] {
        let (mut l, _) = local_first(100);
        l.record(&a, 3, t);
        for s in take(&mut l, t + MS, true) {
            l.failed(s, landed, t + 2 * MS);
        }
        let next: Vec<u64> = (take(&mut l, t + 150 * MS, true).iter())
            .map(|d| d.op.hits)
            .collect();
        assert_eq!(next, Vec::from_iter(again), "landed {landed}");
    }
}

#[test]
fn local_first_entries_are_bounded_and_hits_without_one_are_counted_as_dropped() {
    let (mut l, stats) = local_first(16);
    for i in 0..1000 {
        l.record(&op(&format!("k{i}"), Algorithm::FixedWindow), 1, SEC);
    }
    assert_eq!(l.entries.len(), 16);
    assert_eq!(counted(&stats, |s| &s.local_first_dropped_hits), 984);
}

#[test]
fn fallback_hits_net_out_refunds_and_wait_for_the_breaker() {
    let (mut l, _) = fallback(100);
    let k = exact("k", Algorithm::FixedWindow);
    let t = 100 * SEC;
    l.record(&k, 5, t);
    l.record(&k, 3, t + 1);
    l.record(&k, -2, t + 2);
    assert_eq!(l.unsynced(&k, t + 3), 6);
    // The breaker is open: nothing goes, and the next try waits a cooldown.
    assert!(take(&mut l, t + 3, false).is_empty());
    assert_eq!(l.due_at(), t + 3 + SEC);
    let out = take(&mut l, t + 3 + SEC, true);
    assert_eq!(sent(&out), vec![(6, t)]);
    // In flight, still unsynced; nothing else waits.
    assert_eq!(l.unsynced(&k, t + 4), 6);
    assert_eq!(l.due_at(), u64::MAX);
}

#[test]
fn a_failed_replay_is_kept_again_unless_it_was_abandoned_at_its_deadline() {
    let (mut l, stats) = fallback(100);
    let k = exact("k", Algorithm::FixedWindow);
    let t = 100 * SEC;
    l.record(&k, 4, t);
    let mut out = take(&mut l, t, true);
    l.record(&k, 1, t + 1);
    l.failed(out.remove(0), false, t + 2);
    assert_eq!(l.unsynced(&k, t + 2), 5);
    let mut again = take(&mut l, t + 2 + SEC, true);
    assert_eq!(sent(&again), vec![(5, t + 1)]);
    l.failed(again.remove(0), true, t + 3);
    assert_eq!(l.unsynced(&k, t + 3), 0);
    assert_eq!(counted(&stats, |s| &s.replayed_hits), 5);
}

#[test]
fn fallback_hits_of_a_window_that_ended_are_dropped_and_counted() {
    let (mut l, stats) = fallback(100);
    let k = exact("k", Algorithm::FixedWindow);
    let s = exact("s", Algorithm::SlidingWindow);
    let t = 100 * SEC;
    l.record(&k, 7, t);
    l.record(&s, 2, t);
    // The next 10 s window: the old hits weigh nothing now.
    l.record(&k, 1, t + 10 * SEC);
    let out = take(&mut l, t + 10 * SEC, true);
    assert_eq!(sent(&out), vec![(1, t + 10 * SEC)]);
    assert_eq!(counted(&stats, |s| &s.replay_dropped_hits), 9);
}

#[test]
fn a_buckets_refilled_tokens_are_not_replayed() {
    let (mut l, _) = fallback(100);
    // 10 tokens a 10 s: one a second.
    let b = exact("b", Algorithm::TokenBucket { burst: 10 });
    let t = 100 * SEC;
    l.record(&b, 6, t);
    assert_eq!(l.unsynced(&b, t + 2 * SEC), 4);
    assert_eq!(l.unsynced(&b, t + 9 * SEC), 0);
}

#[test]
fn fallback_keys_are_bounded_and_what_does_not_fit_is_counted() {
    let (mut l, stats) = fallback(16);
    for i in 0..20 {
        l.record(&exact(&format!("k{i}"), Algorithm::FixedWindow), 3, SEC);
    }
    assert_eq!(l.entries.len(), 16);
    assert!(l.entries.contains_key(&KeyRef::of("k0")));
    assert_eq!(counted(&stats, |s| &s.replay_dropped_hits), 12);
}

#[test]
fn nothing_is_recorded_while_a_batch_the_store_may_count_is_decided() {
    let (mut l, _) = fallback(16);
    let k = exact("k", Algorithm::FixedWindow);
    l.keep(false);
    l.record(&k, 3, SEC);
    l.keep(true);
    assert_eq!(l.unsynced(&k, SEC), 0);
    assert_eq!(l.due_at(), u64::MAX);
}
