//! Time as the tree records it: nanoseconds since the epoch in records,
//! RFC 3339 in `.meta.json` and events.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

pub fn now_ms() -> u64 {
    (now_ns() / 1_000_000).max(0) as u64
}

pub fn time_of(ns: i128) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH
    }
}

pub fn ns_of(t: SystemTime) -> i128 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

pub fn rfc3339(ns: i128) -> String {
    humantime::format_rfc3339_seconds(time_of(ns)).to_string()
}

/// With milliseconds: event times, from which the index lag is measured.
pub fn rfc3339_ms(ns: i128) -> String {
    humantime::format_rfc3339_millis(time_of(ns)).to_string()
}

/// Nanoseconds in one day.
const DAY_NS: i128 = 86_400_000_000_000;

/// The UTC day (days since the epoch) of `ns`.
pub fn day_of(ns: i128) -> u64 {
    (ns.max(0) / DAY_NS) as u64
}

/// Start of the next UTC day, in ns since the epoch.
pub fn next_day_ns(ns: i128) -> i128 {
    (day_of(ns) as i128 + 1) * DAY_NS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days() {
        assert_eq!(day_of(-5), 0);
        assert_eq!(day_of(DAY_NS - 1), 0);
        assert_eq!(day_of(DAY_NS), 1);
        assert_eq!(next_day_ns(DAY_NS + 7), 2 * DAY_NS);
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_ms(1_500_000), "1970-01-01T00:00:00.001Z");
    }
}
