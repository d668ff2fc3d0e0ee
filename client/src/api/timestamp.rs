//! Timestamps as the hot wire types write them: exactly chrono's RFC 3339 (`…T…Z`, with 0, 3,
//! 6 or 9 fraction digits), written digit by digit into a buffer. chrono's own `Serialize`
//! goes through `collect_str` and the formatting machinery, which was most of the time of an
//! answer's three timestamps per job on the router and the Director. Reading them stays
//! chrono's (`#[serde(serialize_with)]` only).

use chrono::{DateTime, Datelike, Timelike, Utc};
use serde::{Serialize, Serializer};

/// The longest form: `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ`.
const LONGEST: usize = 30;

/// Writes `t` as chrono does into `out`, returning its length; `None` for what the fast form
/// does not cover (a year outside 0..=9999, a leap second), which chrono then writes.
fn write(t: &DateTime<Utc>, out: &mut [u8; LONGEST]) -> Option<usize> {
    let year = u32::try_from(t.year()).ok().filter(|y| *y <= 9999)?;
    let nanos = t.nanosecond();
    if nanos >= 1_000_000_000 {
        return None;
    }
    put(&mut out[0..4], year);
    out[4] = b'-';
    put(&mut out[5..7], t.month());
    out[7] = b'-';
    put(&mut out[8..10], t.day());
    out[10] = b'T';
    put(&mut out[11..13], t.hour());
    out[13] = b':';
    put(&mut out[14..16], t.minute());
    out[16] = b':';
    put(&mut out[17..19], t.second());
    let (fraction, width) = match nanos {
        0 => (0, 0),
        n if n % 1_000_000 == 0 => (n / 1_000_000, 3),
        n if n % 1_000 == 0 => (n / 1_000, 6),
        n => (n, 9),
    };
    let mut end = 19;
    if width > 0 {
        out[19] = b'.';
        end = 20 + width;
        put(&mut out[20..end], fraction);
    }
    out[end] = b'Z';
    Some(end + 1)
}

/// Writes `value`'s last `out.len()` decimal digits into `out`, zero-padded.
fn put(out: &mut [u8], mut value: u32) {
    for digit in out.iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// Serializes a timestamp (`#[serde(serialize_with = "timestamp::serialize")]`).
pub fn serialize<S: Serializer>(t: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
    let mut buf = [0u8; LONGEST];
    match write(t, &mut buf).and_then(|n| std::str::from_utf8(&buf[..n]).ok()) {
        Some(text) => serializer.serialize_str(text),
        None => t.serialize(serializer),
    }
}

/// Serializes an optional timestamp (`#[serde(serialize_with = "timestamp::option")]`).
pub fn option<S: Serializer>(t: &Option<DateTime<Utc>>, serializer: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => serializer.serialize_some(&Fast(t)),
        None => serializer.serialize_none(),
    }
}

/// A timestamp that serializes through [`serialize`].
struct Fast<'a>(&'a DateTime<Utc>);

impl Serialize for Fast<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize(self.0, serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn fast(t: &DateTime<Utc>) -> String {
        let mut out = serde_json::Serializer::new(Vec::new());
        serialize(t, &mut out).unwrap();
        String::from_utf8(out.into_inner()).unwrap()
    }

    #[test]
    fn writes_exactly_what_chrono_writes() {
        let mut seconds: i64 = -62_167_219_200; // 0000-01-01
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let fractions = |r: u64| match r % 5 {
            0 => 0,
            1 => (r >> 8) as u32 % 1000 * 1_000_000,
            2 => (r >> 8) as u32 % 1_000_000 * 1_000,
            3 => (r >> 8) as u32 % 1_000_000_000,
            _ => 1_000_000_000 + (r >> 8) as u32 % 1000, // a leap second
        };
        for _ in 0..20_000 {
            let r = next();
            seconds = (seconds + (r % 40_000_000_000) as i64) % 253_402_300_800; // < 10000-01-01
            let t = Utc
                .timestamp_opt(seconds, fractions(r))
                .single()
                .or_else(|| Utc.timestamp_opt(seconds, 0).single())
                .unwrap();
            assert_eq!(fast(&t), serde_json::to_string(&t).unwrap(), "{t:?}");
        }
        for t in [
            Utc.with_ymd_and_hms(0, 1, 1, 0, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap(),
            Utc.with_ymd_and_hms(10_000, 1, 1, 0, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(-1, 1, 1, 0, 0, 0).unwrap(),
        ] {
            assert_eq!(fast(&t), serde_json::to_string(&t).unwrap(), "{t:?}");
        }
    }

    #[test]
    fn an_option_writes_null_or_the_timestamp() {
        let t = Utc.with_ymd_and_hms(2026, 12, 1, 10, 30, 0).unwrap();
        let mut out = serde_json::Serializer::new(Vec::new());
        option(&Some(t), &mut out).unwrap();
        assert_eq!(out.into_inner(), br#""2026-12-01T10:30:00Z""#);
        let mut out = serde_json::Serializer::new(Vec::new());
        option(&None, &mut out).unwrap();
        assert_eq!(out.into_inner(), b"null");
    }
}
