//! Go-compatible duration strings: a parser matching Go's `time.ParseDuration`, which is
//! what Consul uses for `TTL`, `LockDelay`, `wait` and check TTLs.

use std::time::Duration;

/// Parses a Go duration string (`"15s"`, `"1h30m"`, `"1.5s"`, `"-2m"`, `"0"`) into signed
/// nanoseconds. Units: `ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`. A number without a unit
/// is an error except the bare `"0"`, exactly as in Go.
pub fn parse_go_duration_ns(input: &str) -> Result<i64, String> {
    let invalid = || format!("time: invalid duration \"{input}\"");
    let mut s = input;
    let mut negative = false;
    if let Some(rest) = s.strip_prefix('-') {
        negative = true;
        s = rest;
    } else if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !s.is_empty() {
        // Integer part.
        let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
        let int_part = &s[..int_len];
        s = &s[int_len..];
        // Optional fraction.
        let mut frac_part = "";
        if let Some(rest) = s.strip_prefix('.') {
            let frac_len = rest.bytes().take_while(u8::is_ascii_digit).count();
            frac_part = &rest[..frac_len];
            s = &rest[frac_len..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid());
        }
        // Unit.
        let unit_len = s
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map(|(i, _)| i)
            .unwrap_or(s.len());
        let unit = &s[..unit_len];
        s = &s[unit_len..];
        if unit.is_empty() {
            return Err(format!("time: missing unit in duration \"{input}\""));
        }
        let mult: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => {
                return Err(format!(
                    "time: unknown unit \"{unit}\" in duration \"{input}\""
                ))
            }
        };
        let int_val: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| invalid())?
        };
        let mut value = int_val.checked_mul(mult).ok_or_else(invalid)?;
        if !frac_part.is_empty() {
            // Keep at most 18 fraction digits: finer than a nanosecond for every unit.
            let digits = &frac_part[..frac_part.len().min(18)];
            let frac: u128 = digits.parse().map_err(|_| invalid())?;
            let scale = 10u128.pow(digits.len() as u32);
            value = value.checked_add(frac * mult / scale).ok_or_else(invalid)?;
        }
        total = total.checked_add(value).ok_or_else(invalid)?;
        if total > i64::MAX as u128 + u128::from(negative) {
            return Err(invalid());
        }
    }
    if negative {
        Ok((total as i128).wrapping_neg() as i64)
    } else {
        Ok(total as i64)
    }
}

/// Parses a Go duration string that must not be negative, as a [`Duration`].
pub fn parse_go_duration(input: &str) -> Result<Duration, String> {
    let ns = parse_go_duration_ns(input)?;
    u64::try_from(ns)
        .map(Duration::from_nanos)
        .map_err(|_| format!("negative duration \"{input}\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_go() {
        assert_eq!(parse_go_duration_ns("0"), Ok(0));
        assert_eq!(parse_go_duration_ns("15s"), Ok(15_000_000_000));
        assert_eq!(parse_go_duration_ns("1h30m"), Ok(5_400_000_000_000));
        assert_eq!(parse_go_duration_ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_go_duration_ns(".5ms"), Ok(500_000));
        assert_eq!(parse_go_duration_ns("-2m"), Ok(-120_000_000_000));
        assert_eq!(parse_go_duration_ns("20ns"), Ok(20));
        assert_eq!(parse_go_duration_ns("3µs"), Ok(3_000));
        assert!(parse_go_duration_ns("20").is_err());
        assert!(parse_go_duration_ns("").is_err());
        assert!(parse_go_duration_ns("s").is_err());
        assert!(parse_go_duration_ns("5d").is_err());
        assert!(parse_go_duration_ns("99999999999999h").is_err());
        assert!(parse_go_duration("-1s").is_err());
    }
}
