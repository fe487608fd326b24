//! Sizes and durations as the command line writes them (`64MiB`, `200ms`), and the clock that
//! expiries are kept in.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, in Unix seconds: what the store's and the fleet's expiries are written in.
pub fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A number and the unit right after it, e.g. `64MiB` or `200ms`; the unit's multiple of its
/// base (bytes, milliseconds) is looked up in `units`.
fn scaled_or_zero(text: &str, units: &[(&str, u64)], expected: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let &(_, scale) = units.iter().find(|(name, _)| *name == unit).ok_or(format!("{text:?}: expected {expected}"))?;
    digits.parse::<u64>().ok().and_then(|n| n.checked_mul(scale)).ok_or(format!("{text:?}: not {expected}"))
}

/// As `scaled_or_zero`, refusing zero.
fn scaled(text: &str, units: &[(&str, u64)], expected: &str) -> Result<u64, String> {
    match scaled_or_zero(text, units, expected)? {
        0 => Err(format!("{:?}: must be above zero", text.trim())),
        value => Ok(value),
    }
}

pub fn parse_size(text: &str) -> Result<u64, String> {
    let units = [("", 1), ("B", 1), ("KiB", 1 << 10), ("K", 1 << 10), ("k", 1 << 10), ("MiB", 1 << 20), ("M", 1 << 20),
        ("m", 1 << 20), ("GiB", 1 << 30), ("G", 1 << 30), ("g", 1 << 30)];
    scaled(text, &units, "bytes, or a number with KiB, MiB or GiB")
}

const DURATION_UNITS: [(&str, u64); 5] = [("ms", 1), ("", 1000), ("s", 1000), ("m", 60_000), ("h", 3_600_000)];
const DURATION: &str = "a number with ms, s, m or h";

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    scaled(text, &DURATION_UNITS, DURATION).map(Duration::from_millis)
}

/// A duration where none (`0s`) turns something off.
pub fn parse_duration_or_zero(text: &str) -> Result<Duration, String> {
    scaled_or_zero(text, &DURATION_UNITS, DURATION).map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_parse_as_documented() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("0").is_err() && parse_size("1TB").is_err() && parse_size("").is_err());
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("0s").is_err() && parse_duration("5 days").is_err());
        assert_eq!(parse_duration_or_zero("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration_or_zero("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration_or_zero("-1s").is_err());
        assert!(parse_duration("99999999999999999h").is_err() && parse_size("99999999999GiB").is_err(), "no overflow");
    }
}
