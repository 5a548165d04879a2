//! Value parsers shared by the server's flags and the plugin's.

use std::time::Duration;

/// The duration form the chart's values take, as the CRD's timeouts do: whole seconds, or
/// digits and a unit (`ms`, `s`, `m`, `h`) repeated, such as `90s` or `1h30m`.
/// [`parse_duration`] reads all of it, so the chart never passes a form the binary
/// refuses, and its templates can add the parts up to check the flag's bounds.
pub const CHART_DURATION_PATTERN: &str = r"^([0-9]+|([0-9]+(ms|s|m|h))+)$";
/// The longest duration string the chart takes (the CRD's limit too).
pub const CHART_DURATION_MAX_LENGTH: u64 = 32;

/// Accepts humantime durations (`90s`, `3m`, `1h30m`, `250ms`) or plain seconds.
/// Out-of-range values are errors, never a wrapped-around number.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let raw = raw.trim();
    if !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) {
        return raw
            .parse()
            .map(Duration::from_secs)
            .map_err(|_| format!("invalid duration {raw:?}: too large"));
    }
    humantime::parse_duration(raw)
        .map_err(|e| format!("invalid duration {raw:?} ({e}): expected e.g. 30s, 3m, 250ms"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("30s", 30_000)]
    #[case("3m", 180_000)]
    #[case("250ms", 250)]
    #[case("2", 2_000)]
    #[case("1h", 3_600_000)]
    #[case("1h30m", 5_400_000)]
    #[case("1d", 86_400_000)]
    fn durations_parse(#[case] raw: &str, #[case] millis: u64) {
        assert_eq!(parse_duration(raw).unwrap(), Duration::from_millis(millis));
    }

    #[rstest]
    #[case("")]
    #[case("3 furlongs")]
    #[case("-1s")]
    #[case("1x")]
    #[case("99999999999999999999")]
    // Would overflow a hand-rolled n * 3600.
    #[case("18446744073709551615h")]
    fn bad_durations_are_errors(#[case] raw: &str) {
        assert!(parse_duration(raw).is_err());
    }
}
