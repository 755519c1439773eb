//! Wall-clock times for flow log lines. The datapath stamps events with
//! CLOCK_MONOTONIC (the only clock it has cheaply); the reader maps them to
//! CLOCK_REALTIME with the offset between the two clocks when it reads.

/// Nanoseconds since the Unix epoch as RFC 3339 UTC with microseconds,
/// e.g. `2026-12-01T03:41:07.123456Z`.
pub fn format_unix_ns(unix_ns: i128) -> String {
    let secs = unix_ns.div_euclid(1_000_000_000) as i64;
    let micros = (unix_ns.rem_euclid(1_000_000_000) / 1000) as u32;
    let days = secs.div_euclid(86_400);
    let day_secs = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        day_secs / 3600,
        day_secs % 3600 / 60,
        day_secs % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day)
/// (Howard Hinnant's civil_from_days).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct it is given.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

/// CLOCK_REALTIME minus CLOCK_MONOTONIC now: add it to a monotonic stamp
/// for wall-clock time. Taken per batch, so a clock step shows within one.
pub fn realtime_offset_ns() -> i128 {
    clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_MONOTONIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_unix_ns(0), "1970-01-01T00:00:00.000000Z");
        // 2000-02-29 (a leap day of a century leap year) 12:34:56.789012
        assert_eq!(
            format_unix_ns(951_827_696_789_012_345),
            "2000-02-29T12:34:56.789012Z"
        );
        assert_eq!(
            format_unix_ns(1_798_779_600_000_000_000),
            "2027-01-01T05:00:00.000000Z"
        );
        assert_eq!(format_unix_ns(-1_000), "1969-12-31T23:59:59.999999Z");
    }

    #[test]
    fn the_offset_maps_now_to_about_now() {
        let wall = clock_ns(libc::CLOCK_REALTIME);
        let mapped = clock_ns(libc::CLOCK_MONOTONIC) + realtime_offset_ns();
        assert!((mapped - wall).abs() < 1_000_000_000, "{mapped} vs {wall}");
    }
}
