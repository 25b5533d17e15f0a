//! Units for people: byte counts printed (`58.52 GiB`) and parsed (`80GiB`, `1.5e9`), durations,
//! percentages and copy rates. Every text the command line, the Python package and the HTML pages
//! print goes through these functions, so a figure reads the same everywhere (the Python package
//! exports [`fmt_bytes`] and [`parse_bytes`] as `gpuheap.fmt_bytes` and `gpuheap.parse_bytes`).
//!
//! Conventions: binary units (KiB = 2^10 B ... TiB) when printing bytes; rates in GB/s (10^9 B/s),
//! as memory bandwidths are quoted.

/// Why a byte count, an alignment or the tiered strategy's thresholds could not be parsed. `Display`
/// is one line naming the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// The unit after the number is none of B, K/KiB, M/MiB, G/GiB, T/TiB, kB, MB, GB, TB.
    #[error("unknown unit `{unit}` in byte count `{input}`")]
    UnknownUnit {
        /// The unit as written (lowercased).
        unit: String,
        /// The whole value.
        input: String,
    },
    /// A whole number of bytes above 2^64 − 1.
    #[error("byte count `{0}` is above 2^64 - 1")]
    TooLarge(String),
    /// The number cannot be read.
    #[error("`{0}` is not a byte count (e.g. 80GiB, 1.5e9, 1048576)")]
    NotANumber(String),
    /// A negative, non-finite or too large fractional count.
    #[error("byte count `{0}` is negative or out of range")]
    OutOfRange(String),
    /// An alignment that is not a power of two from 1 B to 1 GiB.
    #[error("alignment {0} B is not a power of two between 1 B and 1 GiB")]
    Alignment(u64),
    /// Tiers not written `SMALL_MAX,LARGE_MIN`.
    #[error("`{0}` is not SMALL_MAX,LARGE_MIN (e.g. 1KiB,1MiB)")]
    TiersFormat(String),
    /// `SMALL_MAX` not a power of two, or not below `LARGE_MIN`.
    #[error("tiers `{0}`: SMALL_MAX must be a power of two and below LARGE_MIN")]
    TiersOrder(String),
}

/// Formats bytes with a binary unit: `512 B`, `1.50 KiB`, `58.52 GiB` (two decimals above 1 KiB).
pub fn fmt_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

/// A duration of `ns` nanoseconds for people: seconds, milliseconds or microseconds (`"3.21 ms"`).
#[doc(hidden)]
pub fn fmt_ns(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.2} s", ns as f64 * 1e-9)
    } else if ns >= 1_000_000 {
        format!("{:.2} ms", ns as f64 * 1e-6)
    } else {
        format!("{:.1} µs", ns as f64 * 1e-3)
    }
}

/// A fraction in [0, 1] as a percentage with one decimal (`0.5` → `"50.0 %"`).
#[doc(hidden)]
pub fn pct(fraction: f64) -> String {
    format!("{:.1} %", fraction * 100.0)
}

/// `part` as a percentage of `whole` with one decimal; `"0.0 %"` when `whole` is 0.
#[doc(hidden)]
pub fn pct_of(part: u64, whole: u64) -> String {
    if whole == 0 {
        "0.0 %".into()
    } else {
        format!("{:.1} %", part as f64 * 100.0 / whole as f64)
    }
}

/// Smallest move (bytes) whose copy rate [`fmt_rate`] prints: below it the kernel time is launch and
/// plan overhead, and a rate would read as a rounded-down "0.00 GB/s"; the time alone is given.
#[doc(hidden)]
pub const MIN_RATE_BYTES: u64 = 1 << 20;

/// `", X GB/s"` (10^9 B/s) for a move of `bytes` in `ns`, or `""` when the move is too small for a rate
/// ([`MIN_RATE_BYTES`]) or the time is zero.
#[doc(hidden)]
pub fn fmt_rate(bytes: u64, ns: u64) -> String {
    if bytes < MIN_RATE_BYTES || ns == 0 {
        String::new()
    } else {
        format!(", {:.2} GB/s", bytes as f64 / ns as f64)
    }
}

/// Parses a byte count: plain bytes (`1048576`), a float (`1.5e9`), or a number with a unit
/// (`80GiB`, `512 MiB`, `2GB`, `4k`; binary units KiB/MiB/GiB/TiB/PiB/EiB and K/M/G/T/P/E = powers of
/// 1024, decimal units kB/MB/GB/TB/PB/EB = powers of 1000). The result is rounded down to whole bytes.
///
/// Used by the command line and the Python package for every byte-valued option.
///
/// # Errors
/// A [`ParseError`] for an empty, negative, non-finite or unparsable value or one above 2^64 − 1.
pub fn parse_bytes(s: &str) -> Result<u64, ParseError> {
    let t = s.trim();
    // The unit starts at the first letter that is not a float's exponent: the `e` of `1e9` or `2.5E-3`
    // is followed by a digit or a signed digit, the `E` of `16EiB` by the rest of a unit.
    let b = t.as_bytes();
    let exponent = |i: usize| {
        let digit = |j: usize| b.get(j).is_some_and(u8::is_ascii_digit);
        i > 0
            && matches!(b[i], b'e' | b'E')
            && (digit(i + 1) || (matches!(b.get(i + 1), Some(b'+' | b'-')) && digit(i + 2)))
    };
    let split = (0..b.len()).find(|&i| b[i].is_ascii_alphabetic() && !exponent(i)).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "p" | "pib" => 1 << 50,
        "e" | "eib" => 1 << 60,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "pb" => 1_000_000_000_000_000,
        "eb" => 1_000_000_000_000_000_000,
        _ => return Err(ParseError::UnknownUnit { unit, input: s.to_string() }),
    };
    // A whole number is exact (a float has 53 bits: 18446744073709551614 would round to 2^64).
    if let Ok(n) = num.trim().parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(|| ParseError::TooLarge(s.to_string()));
    }
    let v: f64 = num.trim().parse().map_err(|_| ParseError::NotANumber(s.to_string()))?;
    bytes_of_float(v * mult as f64).ok_or_else(|| ParseError::OutOfRange(s.to_string()))
}

/// A byte count given as a float (the Python package takes `1.5e9`), rounded down to whole bytes;
/// `None` when it is negative, not finite or at least 2^64.
#[doc(hidden)]
pub fn bytes_of_float(v: f64) -> Option<u64> {
    (v.is_finite() && (0.0..18_446_744_073_709_551_615.0).contains(&v)).then_some(v as u64)
}

/// Checks a request alignment: a power of two from 1 B to 1 GiB.
///
/// # Errors
/// [`ParseError::Alignment`] naming the value.
#[doc(hidden)]
pub fn check_align(a: u64) -> Result<u64, ParseError> {
    if a.is_power_of_two() && a <= 1 << 30 {
        Ok(a)
    } else {
        Err(ParseError::Alignment(a))
    }
}

/// Parses a request alignment: a byte count as for [`parse_bytes`] that [`check_align`] accepts.
///
/// # Errors
/// A [`ParseError`] naming the value.
#[doc(hidden)]
pub fn parse_align(s: &str) -> Result<u64, ParseError> {
    check_align(parse_bytes(s)?)
}

/// Parses the tiered strategy's thresholds: `SMALL_MAX,LARGE_MIN`, each a byte count as for
/// [`parse_bytes`], `SMALL_MAX` a power of two below `LARGE_MIN`. (A `LARGE_MIN` above the capacity is
/// refused by the replay, which knows the capacity.)
///
/// # Errors
/// A [`ParseError`] naming the value.
#[doc(hidden)]
pub fn parse_tiers(s: &str) -> Result<(u64, u64), ParseError> {
    let (a, b) = s.split_once(',').ok_or_else(|| ParseError::TiersFormat(s.to_string()))?;
    check_tiers(parse_bytes(a)?, parse_bytes(b)?).map_err(|_| ParseError::TiersOrder(s.to_string()))
}

/// Checks the tiered strategy's thresholds `(small_max, large_min)`: `small_max` a power of two below
/// `large_min`.
///
/// # Errors
/// [`ParseError::TiersOrder`] naming them.
#[doc(hidden)]
pub fn check_tiers(small_max: u64, large_min: u64) -> Result<(u64, u64), ParseError> {
    if small_max.is_power_of_two() && large_min > small_max {
        Ok((small_max, large_min))
    } else {
        Err(ParseError::TiersOrder(format!("{small_max},{large_min}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_the_documented_forms() {
        assert_eq!(parse_bytes("80GiB"), Ok(80 << 30));
        assert_eq!(parse_bytes("1.5e9"), Ok(1_500_000_000));
        assert_eq!(parse_bytes(" 512 MiB "), Ok(512 << 20));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_bytes("18446744073709551616"), Err(ParseError::OutOfRange("18446744073709551616".into())));
        assert_eq!(parse_bytes("17179869184GiB"), Err(ParseError::TooLarge("17179869184GiB".into())));
        assert!(matches!(parse_bytes("12 parsecs"), Err(ParseError::UnknownUnit { .. })));
        // Exbibytes: 15 EiB fits in a u64, 16 EiB (2^64) does not; an exponent is not a unit.
        assert_eq!(parse_bytes("15EiB"), Ok(15 << 60));
        assert_eq!(parse_bytes("1 PiB"), Ok(1 << 50));
        assert_eq!(parse_bytes("2EB"), Ok(2_000_000_000_000_000_000));
        assert_eq!(parse_bytes("16EiB"), Err(ParseError::TooLarge("16EiB".into())));
        assert_eq!(parse_bytes("1.5e9"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("2.5E-3GiB"), Ok(2_684_354));
        assert_eq!(parse_bytes("1e+3 KiB"), Ok(1_024_000));
        assert_eq!(parse_bytes("-1"), Err(ParseError::OutOfRange("-1".into())));
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(7_612_399_616), "7.09 GiB");
        assert_eq!(parse_align("4KiB"), Ok(4096));
        assert_eq!(parse_align("3000"), Err(ParseError::Alignment(3000)));
        assert_eq!(parse_tiers("1KiB,1MiB"), Ok((1024, 1 << 20)));
        assert_eq!(parse_tiers("3000,65536"), Err(ParseError::TiersOrder("3000,65536".into())));
        assert_eq!(parse_tiers("1KiB"), Err(ParseError::TiersFormat("1KiB".into())));
    }
}
