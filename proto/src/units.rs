//! Human-friendly sizes and durations for flags, env vars and config files.

use std::time::Duration;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UnitError {
    #[error("invalid size {0:?}: expected a number with an optional unit (b, kb, mb, gb, tb; kib..tib also accepted), e.g. 16gb")]
    Size(String),
    #[error("invalid duration {0:?}: expected e.g. 500ms, 10s, 30m, 24h")]
    Duration(String),
}

/// Parses `4096`, `4kb`, `16GB`, `1.5gb`, `64 MiB`. Units are binary (1kb = 1024 bytes),
/// as in Mooncake's configuration.
pub fn parse_size(input: &str) -> Result<u64, UnitError> {
    let s = input.trim().to_ascii_lowercase();
    let err = || UnitError::Size(input.to_string());
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let unit = unit.trim();
    let multiplier: u64 = match unit {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(err()),
    };
    if num.is_empty() {
        return Err(err());
    }
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(multiplier).ok_or_else(err);
    }
    let f: f64 = num.parse().map_err(|_| err())?;
    let bytes = f * multiplier as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes as u64)
}

/// Parses `10s`, `500ms`, `30m`, `1h 30m`; a bare number is seconds.
pub fn parse_duration(input: &str) -> Result<Duration, UnitError> {
    let s = input.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(s).map_err(|_| UnitError::Duration(input.to_string()))
}

/// `bytes` as a size value that [`parse_size`] reads back exactly, in the
/// largest unit that divides it: `16gb`, `1536mb`, `64kb`, `1000`. For
/// messages that tell a user which value to pass.
pub fn size_value(bytes: u64) -> String {
    for (unit, shift) in [("tb", 40), ("gb", 30), ("mb", 20), ("kb", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Formats bytes with a binary unit, for tables and logs.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_values_read_back_exactly() {
        assert_eq!(size_value(16 << 30), "16gb");
        assert_eq!(size_value(1536 << 20), "1536mb");
        assert_eq!(size_value(64 << 10), "64kb");
        assert_eq!(size_value(3 << 40), "3tb");
        assert_eq!(size_value((1 << 30) + 4096), "1048580kb");
        assert_eq!(size_value(1000), "1000");
        for b in [16u64 << 30, 1536 << 20, 64 << 10, (1 << 30) + 4096, 1000, 0] {
            assert_eq!(parse_size(&size_value(b)), Ok(b));
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4kb"), Ok(4096));
        assert_eq!(parse_size("16GB"), Ok(16 << 30));
        assert_eq!(parse_size("64 MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1.5gb"), Ok(3 << 29));
        assert!(parse_size("").is_err());
        assert!(parse_size("gb").is_err());
        assert!(parse_size("12xb").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999tb").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(10), "10 B");
        assert_eq!(format_size(4096), "4.0 KiB");
    }
}
