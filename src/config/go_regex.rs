//! Go's `regexp` (RE2 syntax) on the `regex` crate: GoCC matches `key_pattern` with
//! `regexp.Compile(p).MatchString(key)` (kivra/GoCC `pkg/config/config.go:163-168`), which is
//! unanchored (a match anywhere in the key) like `Regex::is_match`.
//!
//! Both crates implement RE2's syntax, but a few spellings mean different things; [`translate`]
//! rewrites those so a pattern matches in turnstile exactly the keys it matches in GoCC:
//!
//! - `\d \D \w \W \s \S` and `\b \B` are ASCII in Go, Unicode in the `regex` crate;
//! - inside a class, `[` (not `[:`) and `&&`, `~~` are literals in Go, nesting and set
//!   operations in the `regex` crate;
//! - a `{` that does not start a valid repetition (`{2}`, `{2,}`, `{2,5}`) is a literal in Go
//!   and an error in the `regex` crate;
//! - `\Q...\E` quotes literally in Go and is unknown to the `regex` crate.
//!
//! Octal escapes (`\123`) are Go's too (`RegexBuilder::octal`). What Go refuses and the `regex`
//! crate accepts (`(?x)`, `\<`) is accepted: no pattern valid in Go is lost.

use regex::{Regex, RegexBuilder};

/// Go's Perl classes, as ASCII class bodies.
const DIGIT: &str = "0-9";
const WORD: &str = "0-9A-Za-z_";
/// Go's `\s` is `[\t\n\f\r ]` (no `\v`).
const SPACE: &str = r"\t\n\f\r ";
/// A repetition's braces, named so no function's body holds an unpaired brace character.
const OPEN: char = '{';
const CLOSE: char = '}';

/// Compiles `pattern` as Go's `regexp.Compile` would read it.
pub fn compile(pattern: &str) -> Result<Regex, String> {
    RegexBuilder::new(&translate(pattern))
        .octal(true)
        // The same bound as the rest of a config: a pattern cannot cost unbounded memory.
        .size_limit(1 << 20)
        .build()
        .map_err(|e| e.to_string())
}

/// `pattern` in the `regex` crate's syntax, with Go's meaning (see the module docs).
pub fn translate(pattern: &str) -> String {
    let cs: Vec<char> = pattern.chars().collect();
    let mut out = String::with_capacity(pattern.len() + 8);
    // Inside a class: where it opened (the index of its first member).
    let mut class: Option<usize> = None;
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        if c == '\\' && i + 1 < cs.len() {
            i = escape(&cs, i, class.is_some(), &mut out);
            continue;
        }
        match (class, c) {
            (Some(first), ']') if i > first => {
                class = None;
                out.push(']');
            }
            (Some(_), ']') => out.push_str(r"\]"),
            (Some(_), '[') if cs.get(i + 1) == Some(&':') => {
                // A POSIX class `[:alpha:]`: ASCII in both, copied through its `:]`.
                let end = find(&cs, i + 2, &[':', ']']).map_or(cs.len(), |e| e + 2);
                out.extend(&cs[i..end]);
                i = end;
                continue;
            }
            (Some(_), '[' | '&' | '~') => {
                out.push('\\');
                out.push(c);
            }
            (None, '[') => {
                out.push('[');
                let caret = cs.get(i + 1) == Some(&'^');
                if caret {
                    out.push('^');
                    i += 1;
                }
                class = Some(i + 1);
            }
            (None, OPEN) if !is_repeat(&cs[i..]) => {
                out.push('\\');
                out.push(OPEN);
            }
            _ => out.push(c),
        }
        i += 1;
    }
    out
}

/// Writes the escape at `cs[i]` (a backslash with something after it); returns the index
/// after it.
fn escape(cs: &[char], i: usize, in_class: bool, out: &mut String) -> usize {
    let d = cs[i + 1];
    let perl = |body: &str, negated: bool| match (in_class, negated) {
        (true, false) => body.to_owned(),
        (true, true) => format!("[^{body}]"),
        (false, false) => format!("[{body}]"),
        (false, true) => format!("[^{body}]"),
    };
    match d {
        'd' | 'D' => out.push_str(&perl(DIGIT, d == 'D')),
        'w' | 'W' => out.push_str(&perl(WORD, d == 'W')),
        's' | 'S' => out.push_str(&perl(SPACE, d == 'S')),
        'b' | 'B' if !in_class => {
            out.push_str("(?-u:\\");
            out.push(d);
            out.push(')');
        }
        'Q' => {
            let end = find(cs, i + 2, &['\\', 'E']).unwrap_or(cs.len());
            let quoted: String = cs[i + 2..end].iter().collect();
            out.push_str(&regex::escape(&quoted));
            return (end + 2).min(cs.len());
        }
        // `\p{Greek}`, `\x{263a}`: copied through the closing brace, which is no repetition.
        'p' | 'P' | 'x' if cs.get(i + 2) == Some(&OPEN) => {
            let end = find(cs, i + 3, &[CLOSE]).map_or(cs.len(), |e| e + 1);
            out.extend(&cs[i..end]);
            return end;
        }
        _ => {
            out.push('\\');
            out.push(d);
        }
    }
    i + 2
}

/// The index where `needle` next starts in `cs`, from `from`.
fn find(cs: &[char], from: usize, needle: &[char]) -> Option<usize> {
    (from..cs.len()).find(|&j| cs[j..].starts_with(needle))
}

/// Whether `cs` (starting at a `{`) is a repetition Go's parser accepts: `{n}`, `{n,}` or
/// `{n,m}` (Go's `regexp/syntax` `parseRepeat`); anything else is a literal `{` in Go.
fn is_repeat(cs: &[char]) -> bool {
    let mut j = 1;
    let digits = |j: &mut usize| {
        let start = *j;
        while cs.get(*j).is_some_and(|c| c.is_ascii_digit()) {
            *j += 1;
        }
        *j > start
    };
    if !digits(&mut j) {
        return false;
    }
    if cs.get(j) == Some(&',') {
        j += 1;
        digits(&mut j);
    }
    cs.get(j) == Some(&CLOSE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, key: &str) -> bool {
        compile(pattern)
            .unwrap_or_else(|e| panic!("{pattern}: {e}"))
            .is_match(key)
    }

    #[test]
    fn unanchored_as_match_string() {
        // GoCC's README example `^user-.*`, and a pattern without anchors matching inside.
        assert!(m("^user-.*", "user-1"));
        assert!(!m("^user-.*", "superuser-1"));
        assert!(m("user", "superuser-1"));
        assert!(m("", "anything"));
    }

    #[test]
    fn perl_classes_and_boundaries_are_ascii() {
        assert!(m(r"^\d+$", "123"));
        assert!(!m(r"^\d+$", "١٢٣"), "Arabic-Indic digits are not \\d in Go");
        assert!(!m(r"^\w+$", "café"));
        assert!(m(r"^\W$", "é"));
        assert!(!m(r"\s", "a\u{a0}b"), "NBSP is not \\s in Go");
        assert!(!m(r"\s", "a\u{b}b"), "\\v is not \\s in Go");
        assert!(m(r"^[\d-]+$", "1-2"));
        assert!(m(r"^[^\D]$", "7"));
        assert!(
            m(r"\bé", "aé"),
            "é is no word character, so a\\bé has a boundary"
        );
        assert!(m(r"(?i)^\w$", "K"));
    }

    #[test]
    fn go_literals_the_regex_crate_reads_otherwise() {
        assert!(m(r"^user-{id}$", "user-{id}"));
        assert!(m(r"^a{2}$", "aa"));
        assert!(m(r"^a{2,}$", "aaa"));
        assert!(m(r"^a{,2}$", "a{,2}"));
        assert!(m(r"^[a&&b]+$", "a&&b"));
        assert!(m(r"^[[]$", "["));
        assert!(m(r"^[]a]+$", "]a"));
        assert!(m(r"^[[:alpha:]]+$", "abc"));
        assert!(m(r"^\Qa.b\E$", "a.b"));
        assert!(!m(r"^\Qa.b\E$", "axb"));
        assert!(m(r"^\p{Greek}+$", "αβ"));
        assert!(m(r"^\x{263a}$", "☺"));
        assert!(m(r"^\101$", "A"), "octal escapes");
    }

    #[test]
    fn go_errors_are_errors() {
        for bad in ["(", "[a", "a)"] {
            assert!(compile(bad).is_err(), "{bad}");
        }
    }
}
