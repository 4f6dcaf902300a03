//! Parsers of the numeric arguments of `nx`: each refuses what it cannot serve (zero, negative,
//! past a bound, not a number) with one line naming the value and the range, before any work.

/// A whole number in `lo..=hi`.
fn whole(text: &str, lo: usize, hi: usize) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!("{text:?} is not a whole number from {lo} to {hi}")),
    }
}

/// Seconds in `lo..=hi` (fractions allowed), finite; `open`: `lo` itself excluded.
fn seconds(text: &str, lo: f64, hi: f64, open: bool) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s <= hi && (s > lo || (!open && s == lo)) => Ok(s),
        _ => Err(format!(
            "{text:?} is not a number of seconds {} {lo} and at most {hi}",
            if open { "above" } else { "from" }
        )),
    }
}

/// Ranks of `nx run` and of the collectives benchmark: 1 to 4096.
pub fn ranks(text: &str) -> Result<usize, String> {
    whole(text, 1, 4096)
}

/// Elements of the kernel benchmark's arrays: 1 to 2³⁴ (64 GiB of f32).
pub fn elements(text: &str) -> Result<usize, String> {
    whole(text, 1, 1 << 34)
}

/// The edge of the benchmark's square matmuls: 1 to 65,536.
pub fn edge(text: &str) -> Result<usize, String> {
    whole(text, 1, 1 << 16)
}

/// Timed runs of a benchmark: 1 to 100,000.
pub fn repeats(text: &str) -> Result<usize, String> {
    whole(text, 1, 100_000)
}

/// The collectives benchmark's largest size: 4 KiB (its smallest) to 64 GiB.
pub fn max_bytes(text: &str) -> Result<usize, String> {
    whole(text, 4096, 1 << 36)
}

/// `nx run --timeout`: above 0 and at most 10⁹ seconds (about 31 years).
pub fn timeout(text: &str) -> Result<f64, String> {
    seconds(text, 0.0, 1e9, true)
}

/// `nx run --grace`: 0 to 10⁶ seconds.
pub fn grace(text: &str) -> Result<f64, String> {
    seconds(text, 0.0, 1e6, false)
}
