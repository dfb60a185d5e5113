//! Max-min fair shares of one limit's capacity among the buckets that report it.

/// Splits `capacity` (tokens per fill) among demands (tokens per fill; `None`: not known yet,
/// i.e. wants as much as it can get) max-min fairly, in whole tokens, adding up to `capacity`.
///
/// Water-filling: the smallest demands are met in full while they are below an equal split of
/// what is left, and everyone else gets that equal split. Capacity nobody asked for is then
/// spread equally over everyone, so an Envoy whose demand grows is not held to its last
/// report's demand until the next report. Whole tokens by largest remainder (ties to the lower
/// index), so the sum is `capacity` exactly.
pub fn fair_shares(capacity: u32, demands: &[Option<f64>]) -> Vec<u32> {
    let n = demands.len();
    if n == 0 {
        return Vec::new();
    }
    let want = |d: Option<f64>| d.map_or(f64::INFINITY, |d| d.max(0.0));
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| want(demands[a]).total_cmp(&want(demands[b])));
    let mut exact = vec![0.0; n];
    let mut left = f64::from(capacity);
    for (done, &i) in order.iter().enumerate() {
        let split = left / (n - done) as f64;
        let give = want(demands[i]).min(split);
        exact[i] = give;
        left -= give;
    }
    // Rounding can leave a hair below zero.
    let spare = left.max(0.0) / n as f64;
    for e in &mut exact {
        *e += spare;
    }
    round_to_sum(&exact, capacity)
}

/// Whole numbers near `exact` adding up to `total` (largest remainder).
fn round_to_sum(exact: &[f64], total: u32) -> Vec<u32> {
    let mut out: Vec<u32> = exact.iter().map(|e| e.floor() as u32).collect();
    let given: u64 = out.iter().map(|&s| u64::from(s)).sum();
    let mut missing = u64::from(total).saturating_sub(given);
    let mut by_remainder: Vec<usize> = (0..exact.len()).collect();
    // In millionths, so that float noise does not break a tie between equal remainders.
    let remainder = |i: usize| ((exact[i] - exact[i].floor()) * 1e6).round() as i64;
    by_remainder.sort_by(|&a, &b| remainder(b).cmp(&remainder(a)).then(a.cmp(&b)));
    for i in by_remainder.into_iter().cycle() {
        if missing == 0 {
            break;
        }
        out[i] += 1;
        missing -= 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_small_demand_is_met_and_the_rest_goes_to_the_big_one() {
        assert_eq!(fair_shares(20, &[Some(30.0), Some(5.0)]), vec![15, 5]);
        assert_eq!(fair_shares(20, &[Some(30.0), Some(4.8)]), vec![15, 5]);
    }

    #[test]
    fn unknown_demand_claims_an_equal_split() {
        assert_eq!(fair_shares(20, &[Some(30.0), None]), vec![10, 10]);
        assert_eq!(fair_shares(20, &[Some(2.0), None]), vec![2, 18]);
        assert_eq!(fair_shares(7, &[None]), vec![7]);
    }

    #[test]
    fn spare_capacity_is_spread_so_the_shares_add_up_to_the_limit() {
        assert_eq!(fair_shares(20, &[Some(2.0), Some(4.0)]), vec![9, 11]);
        assert_eq!(fair_shares(10, &[Some(0.0), Some(0.0)]), vec![5, 5]);
    }

    #[test]
    fn fewer_tokens_than_buckets_leaves_some_at_zero() {
        assert_eq!(fair_shares(1, &[None, None, None]), vec![1, 0, 0]);
        assert!(fair_shares(5, &[]).is_empty());
    }

    proptest! {
        #[test]
        fn shares_add_up_and_are_max_min_fair(
            cap in 0u32..10_000,
            demands in prop::collection::vec(prop::option::of(0.0f64..20_000.0), 1..12),
        ) {
            let s = fair_shares(cap, &demands);
            prop_assert_eq!(s.iter().map(|&x| u64::from(x)).sum::<u64>(), u64::from(cap));
            // Nobody is below what max-min fairness owes it, give or take the rounding.
            let n = demands.len() as f64;
            for (i, d) in demands.iter().enumerate() {
                let owed = d.unwrap_or(f64::INFINITY).min(f64::from(cap) / n);
                prop_assert!(f64::from(s[i]) + 1.0 > owed.floor(), "{i}: {s:?} {demands:?}");
            }
            // A bucket above its demand got only its part of the spare.
            let total: f64 = demands.iter().map(|d| d.unwrap_or(f64::INFINITY)).sum();
            if total.is_finite() && total <= f64::from(cap) {
                for (i, d) in demands.iter().enumerate() {
                    prop_assert!(f64::from(s[i]) + 1.0 >= d.unwrap());
                }
            }
        }
    }
}
