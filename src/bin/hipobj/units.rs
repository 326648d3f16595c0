//! Sizes and rates as people write them.

/// `64KiB`, `1MiB`, `16M`, `1G`, `4096`: bytes (K, M, G, T and their `iB`
/// forms are powers of 1024; `KB`, `MB`, ... powers of 1000).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (like 4096, 64KiB, 16MiB, 1G)"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "{other:?} is not a size unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ))
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// `1.5 GiB`, `64.0 KiB`, `10 B`.
pub fn human(bytes: u64) -> String {
    hipobj::doctor::human(bytes)
}

/// `38.1 MiB/s`, `12.0 KiB/s`, `350 B/s` for `bytes` in `seconds`: the
/// unit that keeps the figure at 1 or more.
pub fn rate(bytes: u64, seconds: f64) -> String {
    if seconds <= 0.0 {
        return "-".to_owned();
    }
    const UNITS: [&str; 5] = ["B/s", "KiB/s", "MiB/s", "GiB/s", "TiB/s"];
    let mut value = bytes as f64 / seconds;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// MiB per second.
pub fn mib_per_s(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64 / seconds.max(f64::MIN_POSITIVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_and_decimal_units_and_refuse_the_rest() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("3GiB"), Ok(3 << 30));
        assert_eq!(parse_size("5MB"), Ok(5_000_000));
        for bad in ["", "MiB", "-1", "1.5M", "12 parsecs", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rates_take_the_unit_that_keeps_them_readable() {
        assert_eq!(rate(10, 0.5), "20 B/s");
        assert_eq!(rate(3 << 10, 1.0), "3.0 KiB/s");
        assert_eq!(rate(100 << 20, 2.0), "50.0 MiB/s");
        assert_eq!(rate(3 << 30, 1.0), "3.0 GiB/s");
        assert_eq!(rate(1, 0.0), "-");
    }
}
