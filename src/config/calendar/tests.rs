use proptest::prelude::*;

use super::*;

/// ns since the epoch of an RFC 3339 instant.
fn at(s: &str) -> u64 {
    let ts: Timestamp = s.parse().expect("an RFC 3339 instant");
    u64::try_from(ts.as_nanosecond()).expect("after 1970")
}

/// The window of `n` × `unit` in `zone` holding `now`, as RFC 3339 instants in UTC.
fn window(zone: &str, unit: Unit, n: u32, now: &str) -> (String, String) {
    let s = Calendar::new(zone, unit, n).unwrap().compute(at(now));
    let show = |ns: u64| {
        Timestamp::from_second((ns / NS) as i64)
            .unwrap()
            .to_string()
    };
    (show(s.start), show(s.end))
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_owned(), b.to_owned())
}

#[test]
fn days_follow_daylight_saving() {
    // Berlin springs forward on 2026-03-29 (a 23-hour day) and falls back on 2026-10-25 (25).
    assert_eq!(
        window("Europe/Berlin", Unit::Day, 1, "2026-03-29T12:00:00Z"),
        pair("2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z")
    );
    assert_eq!(
        window("Europe/Berlin", Unit::Day, 1, "2026-10-25T12:00:00Z"),
        pair("2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z")
    );
    // New York, 2026-03-08 and 2026-11-01.
    assert_eq!(
        window("America/New_York", Unit::Day, 1, "2026-03-08T15:00:00Z"),
        pair("2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z")
    );
    assert_eq!(
        window("America/New_York", Unit::Day, 1, "2026-11-01T15:00:00Z"),
        pair("2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z")
    );
    // Lord Howe Island moves its clocks by half an hour.
    assert_eq!(
        window("Australia/Lord_Howe", Unit::Day, 1, "2026-04-05T03:00:00Z"),
        pair("2026-04-04T13:00:00Z", "2026-04-05T13:30:00Z")
    );
}

#[test]
fn a_day_whose_midnight_is_skipped_starts_when_its_clocks_do() {
    // Santiago de Chile sprang forward at midnight on 2024-09-08: the day began at 01:00 (-03).
    assert_eq!(
        window("America/Santiago", Unit::Day, 1, "2024-09-08T12:00:00Z"),
        pair("2024-09-08T04:00:00Z", "2024-09-09T03:00:00Z")
    );
}

#[test]
fn months_end_on_their_last_day() {
    let utc = |now| window("UTC", Unit::Month, 1, now);
    assert_eq!(
        utc("2026-02-14T00:00:00Z"),
        pair("2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z")
    );
    // 2024 is a leap year, 2100 is not, 2000 was.
    assert_eq!(
        utc("2024-02-29T23:59:59Z"),
        pair("2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z")
    );
    assert_eq!(
        utc("2100-02-28T12:00:00Z"),
        pair("2100-02-01T00:00:00Z", "2100-03-01T00:00:00Z")
    );
    assert_eq!(
        utc("2000-02-29T12:00:00Z"),
        pair("2000-02-01T00:00:00Z", "2000-03-01T00:00:00Z")
    );
    assert_eq!(
        utc("2026-04-30T23:59:59Z"),
        pair("2026-04-01T00:00:00Z", "2026-05-01T00:00:00Z")
    );
    assert_eq!(
        utc("2026-01-31T00:00:00Z"),
        pair("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z")
    );
    // New York's March holds the spring change: 31 days less an hour.
    assert_eq!(
        window("America/New_York", Unit::Month, 1, "2026-03-20T00:00:00Z"),
        pair("2026-03-01T05:00:00Z", "2026-04-01T04:00:00Z")
    );
}

#[test]
fn blocks_of_months_start_in_january() {
    assert_eq!(
        window("UTC", Unit::Month, 3, "2026-05-15T00:00:00Z"),
        pair("2026-04-01T00:00:00Z", "2026-07-01T00:00:00Z")
    );
    assert_eq!(
        window("Asia/Kolkata", Unit::Month, 3, "2026-12-31T19:00:00Z"),
        pair("2026-12-31T18:30:00Z", "2027-03-31T18:30:00Z")
    );
    assert_eq!(
        window("UTC", Unit::Month, 6, "2026-06-30T23:59:59Z"),
        pair("2026-01-01T00:00:00Z", "2026-07-01T00:00:00Z")
    );
    assert_eq!(
        Calendar::new("UTC", Unit::Month, 5).err(),
        Some(CalendarError::MonthBlocks(5))
    );
}

#[test]
fn years_turn_at_the_zones_new_year() {
    // 23:30 UTC on New Year's Eve is already 2027 in Tokyo, still 2026 in Los Angeles.
    assert_eq!(
        window("Asia/Tokyo", Unit::Year, 1, "2026-12-31T23:30:00Z"),
        pair("2026-12-31T15:00:00Z", "2027-12-31T15:00:00Z")
    );
    assert_eq!(
        window("America/Los_Angeles", Unit::Year, 1, "2026-12-31T23:30:00Z"),
        pair("2026-01-01T08:00:00Z", "2027-01-01T08:00:00Z")
    );
    assert_eq!(
        window("UTC", Unit::Year, 2, "2027-06-01T00:00:00Z"),
        pair("2026-01-01T00:00:00Z", "2028-01-01T00:00:00Z")
    );
}

#[test]
fn weeks_are_iso_weeks_from_monday() {
    // Thursday 2026-11-26: the week of Monday the 23rd.
    assert_eq!(
        window("UTC", Unit::Week, 1, "2026-11-26T10:00:00Z"),
        pair("2026-11-23T00:00:00Z", "2026-11-30T00:00:00Z")
    );
    // A week across a year end, and one holding Berlin's autumn change (7 days and an hour).
    assert_eq!(
        window("UTC", Unit::Week, 1, "2027-01-01T00:00:00Z"),
        pair("2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z")
    );
    assert_eq!(
        window("Europe/Berlin", Unit::Week, 1, "2026-10-25T12:00:00Z"),
        pair("2026-10-18T22:00:00Z", "2026-10-25T23:00:00Z")
    );
    // Weeks count from Monday 1969-12-29, fortnights too: the second week of 1970 starts on
    // the 5th, the second fortnight on the 12th.
    assert_eq!(
        window("UTC", Unit::Week, 1, "1970-01-06T00:00:00Z"),
        pair("1970-01-05T00:00:00Z", "1970-01-12T00:00:00Z")
    );
    assert_eq!(
        window("UTC", Unit::Week, 2, "1970-01-13T00:00:00Z"),
        pair("1970-01-12T00:00:00Z", "1970-01-26T00:00:00Z")
    );
}

#[test]
fn bad_calendars_say_what_is_wrong() {
    let e = Calendar::new("Mars/Olympus_Mons", Unit::Day, 1)
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .contains("unknown time zone \"Mars/Olympus_Mons\""),
        "{e}"
    );
    let e = Calendar::new("UTC", Unit::Hour, 1).err().unwrap();
    assert!(e.to_string().contains("not hour"), "{e}");
}

#[test]
fn the_zone_database_is_bundled() {
    // The container image has no /usr/share/zoneinfo; the zones come with the binary.
    let zones = [
        "Europe/Berlin",
        "America/Argentina/Buenos_Aires",
        "Pacific/Chatham",
    ];
    for z in zones {
        assert!(Calendar::new(z, Unit::Day, 1).is_ok(), "{z}");
    }
}

#[test]
fn the_cached_window_is_the_computed_one() {
    let c = Calendar::new("Europe/Paris", Unit::Day, 1).unwrap();
    let t = at("2026-06-01T10:00:00Z");
    assert_eq!(c.span(t), c.compute(t));
    assert_eq!(c.span(t + 3600 * NS), c.compute(t));
    let next = c.compute(t).end;
    assert_eq!(c.span(next).idx, c.compute(t).idx + 1);
}

const ZONES: [&str; 8] = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Asia/Kolkata",
    "Australia/Lord_Howe",
    "America/Santiago",
    "Pacific/Kiritimati",
    "America/St_Johns",
];

fn calendars() -> impl Strategy<Value = Calendar> {
    let unit = prop_oneof![
        (1u32..=10).prop_map(|n| (Unit::Day, n)),
        (1u32..=4).prop_map(|n| (Unit::Week, n)),
        prop_oneof![Just(1u32), Just(2), Just(3), Just(4), Just(6), Just(12)]
            .prop_map(|n| (Unit::Month, n)),
        (1u32..=3).prop_map(|n| (Unit::Year, n)),
    ];
    (0..ZONES.len(), unit).prop_map(|(z, (u, n))| Calendar::new(ZONES[z], u, n).unwrap())
}

proptest! {
    #[test]
    fn a_window_holds_now_and_windows_tile_time(c in calendars(), secs in 400_000_000u64..7_000_000_000) {
        let now = secs * NS + secs % 997;
        let s = c.compute(now);
        prop_assert!(s.start <= now && now < s.end, "{c:?} {s:?} at {now}");
        let next = c.compute(s.end);
        prop_assert_eq!(next.start, s.end);
        prop_assert_eq!(next.idx, s.idx.wrapping_add(1));
        let prev = c.compute(s.start - 1);
        prop_assert_eq!(prev.end, s.start);
        prop_assert_eq!(prev.idx.wrapping_add(1), s.idx);
        prop_assert_eq!(c.compute(s.start), s);
        prop_assert_eq!(c.compute(s.end - 1), s);
    }

    #[test]
    fn civil_days_round_trip(days in -1_000_000i64..1_000_000) {
        let (y, m, d) = civil_from_days(days);
        prop_assert_eq!(days_from_civil(y, m, d), days);
    }

    #[test]
    fn epoch_windows_hold_now(w in 1u64..100_000_000_000_000, now in 0u64..u64::MAX / 2) {
        let s = Span::aligned(now, w);
        prop_assert!(s.start <= now && now < s.end);
        prop_assert_eq!(Span::aligned(s.end, w).start, s.end);
    }
}

#[test]
fn civil_days_match_jiff() {
    for days in [-100_000i64, -1, 0, 59, 11_016, 20_000, 2_000_000] {
        let (y, m, d) = civil_from_days(days);
        let date = Date::new(y as i16, m as i8, d as i8).unwrap();
        let ts = TimeZone::UTC.to_timestamp(DateTime::from(date)).unwrap();
        assert_eq!(ts.as_second(), days * 86_400, "{days}");
    }
}
