//! Summaries of repeated measurements, as the benchmarks' tables print them.

/// The `q` quantile (0 to 1) of `values`, interpolated between the two nearest order
/// statistics; NaN for no values.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let position = q * (sorted.len() - 1) as f64;
    let (below, above) = (position.floor() as usize, position.ceil() as usize);
    sorted[below] + (sorted[above] - sorted[below]) * (position - below as f64)
}

/// "median (p25–p75)" of `values`.
pub fn median_iqr(values: &[f64]) -> String {
    format!(
        "{:.3} ({:.3}–{:.3})",
        quantile(values, 0.5),
        quantile(values, 0.25),
        quantile(values, 0.75)
    )
}
