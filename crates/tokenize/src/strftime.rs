//! transformers' `strftime_now(format)` for chat templates: the current date and time formatted
//! as Python's `datetime.now().strftime(format)` does. Llama 3.2 and 3.3 write "Today Date:
//! 07 Dec 2026" into every system header with it, and fall back to a fixed "26 Jul 2024" where
//! it is not defined: rendered without it, the router's tokens differed from vLLM's at the
//! first block, so every block after it did too, and no engine's cache ever matched.
//!
//! UTC (an engine in a container runs in UTC unless told otherwise). Python's locale-free
//! conversions are covered; any other `%x` is written as it is.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `format` applied to the current time.
pub fn now(format: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    at(format, secs)
}

/// `format` applied to `secs` after the Unix epoch (UTC).
pub fn at(format: &str, secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let in_day = secs.rem_euclid(86_400);
    let (year, month, day) = civil(days);
    let (hour, minute, second) = (in_day / 3600, in_day / 60 % 60, in_day % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = usize::try_from((days + 3).rem_euclid(7)).unwrap_or(0);
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[usize::try_from(month - 1).unwrap_or(0)];
    let day_name = DAYS[weekday];
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('B') => out.push_str(month_name),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(day_name),
            Some('a') => out.push_str(&day_name[..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// (year, month 1-12, day 1-31) of the day `days` after 1970-01-01 (proleptic Gregorian).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days from 1970-01-01 to the given date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_as_python_does() {
        // 2024-07-26 00:00:00 UTC, a Friday: Llama 3.2's own fallback date.
        assert_eq!(at("%d %b %Y", 1_721_952_000), "26 Jul 2024");
        // 2026-12-07 15:04:05 UTC, a Monday.
        let t = 1_796_655_845;
        assert_eq!(
            at("%A %a %d %e %B %b %m %y %Y %j", t),
            "Monday Mon 07  7 December Dec 12 26 2026 341"
        );
        assert_eq!(at("%H:%M:%S %I %p %% %Q", t), "15:04:05 03 PM % %Q");
        assert_eq!(at("%Y-%m-%d %a", 0), "1970-01-01 Thu");
        // A leap day.
        assert_eq!(at("%Y-%m-%d %j", 951_782_400), "2000-02-29 060");
        for days in [-1_000_000i64, -1, 0, 59, 11_016, 20_000, 2_932_896] {
            let (y, m, d) = civil(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
    }
}
