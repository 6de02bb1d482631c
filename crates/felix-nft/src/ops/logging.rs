//! Error formatting for logs and the command line: an error with its causes on one line
//! (the cause lives in `#[source]`, not repeated in the text).
//! Logging setup itself is [`super::logfmt`].

use std::error::Error;
use std::fmt::Write as _;

/// An error and its chain of causes on one line: `outer: cause: root cause`.
pub fn chain(err: &(dyn Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let _ = write!(out, ": {s}");
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_joins_causes() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(chain(&e), "outer: inner");
    }
}
