//! Keys gRPC does not define (the fields it defines in each object are in that object's
//! table), near misses ("did you mean"), and the [`IgnoredKey`] report of a parse.

use std::fmt;

use serde_json::{Map, Value};

use super::{ConfigError, MAX_IGNORED_KEYS, MAX_KEY_CHARS};

/// A key of a service config that gRPC does not define, which the parse ignored (as gRPC
/// does): where it was, the key, and the field it is a near miss of, if any.
///
/// [`ServiceConfig::ignored`](super::ServiceConfig::ignored) lists them;
/// [`ServiceConfig::from_json_strict`](super::ServiceConfig::from_json_strict) refuses them.
///
/// ```
/// use tower_retry_hedge::config::ServiceConfig;
///
/// let config = ServiceConfig::from_json(r#"{"methodConfig": [{
///     "name": [{"service": "pkg.Search"}],
///     "hedgingPolicy": {"maxAttempts": 3, "hedgeDelay": "0.05s"}
/// }]}"#)?;
/// let [ignored] = config.ignored() else { panic!("one ignored key") };
/// assert_eq!(ignored.path(), "methodConfig[0].hedgingPolicy.hedgeDelay");
/// assert_eq!(ignored.key(), "hedgeDelay");
/// assert_eq!(ignored.suggestion(), Some("hedgingDelay"));
/// assert_eq!(
///     ignored.to_string(),
///     "methodConfig[0].hedgingPolicy.hedgeDelay (did you mean hedgingDelay?)"
/// );
/// # Ok::<(), tower_retry_hedge::config::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IgnoredKey {
    path: String,
    key: String,
    suggestion: Option<&'static str>,
}

impl IgnoredKey {
    fn new(parent: &str, key: &str, known: impl Known) -> IgnoredKey {
        IgnoredKey {
            path: key_path(parent, key),
            key: cut(key),
            suggestion: suggest(key, known),
        }
    }

    /// The JSON path of the key, such as `methodConfig[0].hedgingPolicy.hedgeDelay`. A key
    /// that is not a plain word (letters, digits, `_`, `-`, `$`, `@`) is written in brackets,
    /// quoted and escaped: `methodConfig[0]["odd key"]`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The key as written, cut to 64 characters (then ending in `…`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The field gRPC defines in the same object whose name is closest to the key, if it
    /// is close enough to be a likely misspelling (an edit distance, ignoring case, of at
    /// most a third of the key's length, and at least 1): `hedgingDelay` for `hedgeDelay`,
    /// `maxAttempts` for `MaxAttempts` or `max_attempts`.
    pub fn suggestion(&self) -> Option<&'static str> {
        self.suggestion
    }
}

impl fmt::Display for IgnoredKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path)?;
        if let Some(suggestion) = self.suggestion {
            write!(f, " (did you mean {suggestion}?)")?;
        }
        Ok(())
    }
}

/// The fields gRPC defines in one object, by their proto3 JSON names, in its table's order
/// (the order of near-miss ties), whether or not this crate reads them.
pub(super) trait Known: Iterator<Item = &'static str> + Clone {}

impl<I: Iterator<Item = &'static str> + Clone> Known for I {}

/// What a parse does with keys gRPC does not define.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Unknown {
    /// Count them and keep the first 100, for
    /// [`ServiceConfig::ignored`](super::ServiceConfig::ignored).
    #[default]
    Keep,
    /// Refuse them: a strict parse.
    Refuse,
    /// Not even look: outlier detection's JSON, whose other keys gRPC ignores.
    Ignore,
}

/// The keys gRPC does not define that a parse met.
#[derive(Debug, Default)]
pub(super) struct UnknownKeys {
    mode: Unknown,
    pub(super) kept: Vec<IgnoredKey>,
    pub(super) count: usize,
}

impl UnknownKeys {
    pub(super) fn new(mode: Unknown) -> UnknownKeys {
        UnknownKeys {
            mode,
            ..UnknownKeys::default()
        }
    }

    /// Checks the keys of `object`, found at `path`, against the fields gRPC defines there.
    /// Work: a few string comparisons per key, and one near-miss search for each key kept.
    pub(super) fn check(
        &mut self,
        object: &Map<String, Value>,
        path: &str,
        known: impl Known,
    ) -> Result<(), ConfigError> {
        if self.mode == Unknown::Ignore {
            return Ok(());
        }
        for key in object.keys() {
            if known.clone().any(|field| field == key) {
                continue;
            }
            if self.mode == Unknown::Refuse {
                return Err(ConfigError::unknown_field(
                    key_path(path, key),
                    suggest(key, known),
                ));
            }
            self.count = self.count.saturating_add(1);
            if self.kept.len() < MAX_IGNORED_KEYS {
                self.kept.push(IgnoredKey::new(path, key, known.clone()));
            }
        }
        Ok(())
    }
}

/// The key of `object` that looks like a misspelling of the absent field `missing`: the
/// first of its first 100 unknown keys whose suggestion is `missing`,
/// cut to 64 characters.
pub(super) fn near_miss(
    object: &Map<String, Value>,
    known: impl Known,
    missing: &'static str,
) -> Option<String> {
    object
        .keys()
        .filter(|key| !known.clone().any(|field| field == *key))
        .take(MAX_IGNORED_KEYS)
        .find(|key| suggest(key, known.clone()) == Some(missing))
        .map(|key| cut(key))
}

/// The field of `known` nearest to `key` (edit distance, ignoring ASCII case), if at most
/// `max(1, chars / 3)` edits away; the first in `known` on a tie. `None` for keys longer
/// than 64 characters, which no field name comes near.
fn suggest(key: &str, known: impl Known) -> Option<&'static str> {
    // Four bytes per character at most: no need to count the characters of a longer key.
    if key.len() > 4 * MAX_KEY_CHARS {
        return None;
    }
    let chars = key.chars().count();
    if chars > MAX_KEY_CHARS {
        return None;
    }
    let max = (chars / 3).max(1);
    known
        .map(|field| (distance(key, field), field))
        .filter(|(d, _)| *d <= max)
        .min_by_key(|(d, _)| *d)
        .map(|(_, field)| field)
}

/// The Levenshtein distance between `a` and `b`, ignoring ASCII case. Quadratic: only for
/// short strings.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().map(|c| c.to_ascii_lowercase()).collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, ca) in a.chars().map(|c| c.to_ascii_lowercase()).enumerate() {
        current[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

/// `key`, cut to 64 characters, with `…` when cut.
fn cut(key: &str) -> String {
    match key.char_indices().nth(MAX_KEY_CHARS) {
        Some((end, _)) => format!("{}\u{2026}", &key[..end]),
        None => key.to_owned(),
    }
}

/// The path of `key` in the object at `parent`: `parent.key`, or `parent["key"]` (escaped)
/// for a key that is not a plain word. The key is cut to 64 characters.
fn key_path(parent: &str, key: &str) -> String {
    let key = cut(key);
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '$' | '@'));
    match (plain, parent.is_empty()) {
        (true, true) => key,
        (true, false) => format!("{parent}.{key}"),
        (false, _) => format!("{parent}[{key:?}]"),
    }
}

/// Up to this many ignored keys are named in the warning a parse logs.
const MAX_LOGGED_KEYS: usize = 10;

/// Logs, once, the keys a parse ignored: one `WARN` event.
pub(super) fn warn(kept: &[IgnoredKey], count: usize) {
    if count == 0 {
        return;
    }
    tracing::warn!(
        count,
        keys = %Listing { kept, count },
        "service config: unknown fields ignored"
    );
}

/// The first [`MAX_LOGGED_KEYS`] ignored keys, and how many more there were.
struct Listing<'a> {
    kept: &'a [IgnoredKey],
    count: usize,
}

impl fmt::Display for Listing<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self.kept.len().min(MAX_LOGGED_KEYS);
        for (i, key) in self.kept[..shown].iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{key}")?;
        }
        if self.count > shown {
            write!(f, ", and {} more", self.count - shown)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::objects::{HEDGING_POLICY, METHOD_CONFIG, NAME, RETRY_POLICY, ROOT};
    use crate::config::table::keys;

    #[test]
    fn distance_ignores_ascii_case() {
        assert_eq!(distance("hedgeDelay", "hedgingDelay"), 3);
        assert_eq!(distance("MAXATTEMPTS", "maxAttempts"), 0);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("abc", ""), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("é", "e"), 1);
    }

    #[test]
    fn near_misses_are_suggested_and_others_are_not() {
        let suggest = |key| suggest(key, keys(RETRY_POLICY));
        assert_eq!(suggest("maxAttempt"), Some("maxAttempts"));
        assert_eq!(suggest("MaxAttempts"), Some("maxAttempts"));
        assert_eq!(suggest("max_attempts"), Some("maxAttempts"));
        assert_eq!(suggest("retryableStatusCode"), Some("retryableStatusCodes"));
        assert_eq!(suggest("initialbackof"), Some("initialBackoff"));
        assert_eq!(suggest("comment"), None);
        assert_eq!(suggest("x"), None);
        assert_eq!(suggest(""), None);
        assert_eq!(
            super::suggest("hedgeDelay", keys(HEDGING_POLICY)),
            Some("hedgingDelay")
        );
        assert_eq!(super::suggest("methdo", keys(NAME)), Some("method"));
        assert_eq!(
            super::suggest("retry_policy", keys(METHOD_CONFIG)),
            Some("retryPolicy")
        );
        // Too long to be a near miss of anything: not even compared.
        assert_eq!(suggest(&"maxAttempts".repeat(100)), None);
    }

    #[test]
    fn paths_quote_odd_keys_and_cut_long_ones() {
        assert_eq!(key_path("", "future"), "future");
        assert_eq!(key_path("a[0].b", "x-y_z$1@"), "a[0].b.x-y_z$1@");
        assert_eq!(key_path("a", "two words"), r#"a["two words"]"#);
        assert_eq!(key_path("a", "q\"\n"), r#"a["q\"\n"]"#);
        assert_eq!(key_path("", ""), r#"[""]"#);
        let long = "k".repeat(10_000);
        let path = key_path("a", &long);
        assert_eq!(
            path,
            format!("a[\"{}\u{2026}\"]", "k".repeat(MAX_KEY_CHARS))
        );
        assert_eq!(cut(&long).chars().count(), MAX_KEY_CHARS + 1);
        assert_eq!(cut("short"), "short");
        // Cut on characters, never inside one.
        assert_eq!(
            cut(&"é".repeat(100)),
            format!("{}\u{2026}", "é".repeat(MAX_KEY_CHARS))
        );
    }

    #[test]
    fn the_listing_is_bounded() {
        let kept: Vec<IgnoredKey> = (0..20)
            .map(|i| IgnoredKey::new("", &format!("k{i}"), keys(ROOT)))
            .collect();
        let listing = Listing {
            kept: &kept,
            count: 5000,
        }
        .to_string();
        assert!(listing.starts_with("k0, k1, "), "{listing}");
        assert!(listing.ends_with("k9, and 4990 more"), "{listing}");
        let one = Listing {
            kept: &kept[..1],
            count: 1,
        };
        assert_eq!(one.to_string(), "k0");
    }
}
