//! User-supplied text cut to a length fit for an error message or a log line: never splitting a
//! character, and saying how long the whole was. One 10 MB value must not make a 10 MB log line
//! (nor hold that much memory once per copy of the message).

use std::fmt;

/// The longest piece of one value shown, in bytes.
pub const MAX_SHOWN: usize = 512;

/// `s` as it is when short enough, else its first [`MAX_SHOWN`] bytes (to a character
/// boundary) and `…[N bytes]`.
#[derive(Clone, Copy)]
pub struct Clipped<'a>(pub &'a str);

/// As [`Clipped`], the shown part quoted and escaped as `{:?}` does.
#[derive(Clone, Copy)]
pub struct ClippedQuoted<'a>(pub &'a str);

fn cut(s: &str) -> Option<&str> {
    if s.len() <= MAX_SHOWN {
        return None;
    }
    let mut end = MAX_SHOWN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Some(&s[..end])
}

impl fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match cut(self.0) {
            None => f.write_str(self.0),
            Some(head) => write!(f, "{head}…[{} bytes]", self.0.len()),
        }
    }
}

impl fmt::Display for ClippedQuoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match cut(self.0) {
            None => write!(f, "{:?}", self.0),
            Some(head) => write!(f, "{head:?}…[{} bytes]", self.0.len()),
        }
    }
}

/// [`Clipped`] as an owned string; `s` itself when it is short enough.
pub fn clip(s: String) -> String {
    if s.len() <= MAX_SHOWN {
        s
    } else {
        Clipped(&s).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_untouched() {
        assert_eq!(Clipped("abc").to_string(), "abc");
        assert_eq!(ClippedQuoted("a\"b").to_string(), "\"a\\\"b\"");
        assert_eq!(clip("x".repeat(MAX_SHOWN)), "x".repeat(MAX_SHOWN));
    }

    #[test]
    fn long_text_is_cut_on_a_character_boundary_with_its_size() {
        // 'é' is two bytes: the cut at MAX_SHOWN falls inside one.
        let s = format!("a{}", "é".repeat(10_000));
        let shown = Clipped(&s).to_string();
        assert!(shown.ends_with(&format!("…[{} bytes]", s.len())), "{shown}");
        assert!(shown.len() < MAX_SHOWN + 32);
        let q = ClippedQuoted(&s).to_string();
        assert!(q.starts_with("\"aé") && q.ends_with("bytes]"), "{q}");
        assert_eq!(clip(s.clone()), shown);
    }
}
