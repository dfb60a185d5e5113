//! statsd_exporter's glob matches and name and label templates (`pkg/mapper/fsm`): a glob is
//! dot-separated components, each a literal or `*`, and `*` stands for exactly one whole
//! component; `$1` or `${1}` in a template is the first `*`'s component.

use std::sync::OnceLock;

use regex::Regex;

/// A glob match such as `ratelimit.service.rate_limit.*.*.over_limit`.
#[derive(Debug, Clone)]
pub(super) struct Glob {
    /// `None` for `*`.
    parts: Vec<Option<String>>,
}

impl Glob {
    /// `match` as statsd_exporter accepts it (`metricLineRE`): the first component `*` or a name
    /// starting with a letter or `_`, the others `*` or `[a-zA-Z0-9_][a-zA-Z0-9_-]*`.
    pub(super) fn parse(text: &str) -> Result<Glob, String> {
        static LINE: OnceLock<Regex> = OnceLock::new();
        let line = LINE.get_or_init(|| {
            Regex::new(r"^(\*|[a-zA-Z_][a-zA-Z0-9_\-]*)(\.\*|\.[a-zA-Z0-9_][a-zA-Z0-9_\-]*)*$")
                .expect("valid pattern")
        });
        if !line.is_match(text) {
            return Err(format!(
                "invalid glob match \"{text}\": dot-separated names or *, the first not starting \
                 with a digit"
            ));
        }
        let parts = text
            .split('.')
            .map(|p| (p != "*").then(|| p.to_owned()))
            .collect();
        Ok(Glob { parts })
    }

    /// How many `*` the glob has: the captures its templates may name.
    pub(super) fn captures(&self) -> usize {
        self.parts.iter().filter(|p| p.is_none()).count()
    }

    /// Which components are literals, left first: the FSM's preference without ordering.
    pub(super) fn literals(&self) -> Vec<bool> {
        self.parts.iter().map(Option::is_some).collect()
    }

    /// The components `*` stood for, when `name` has as many components as the glob and each
    /// literal is equal.
    pub(super) fn matches<'a>(&self, name: &'a str) -> Option<Vec<&'a str>> {
        let mut captures = Vec::with_capacity(self.captures());
        let mut fields = name.split('.');
        for part in &self.parts {
            let field = fields.next()?;
            match part {
                None => captures.push(field),
                Some(lit) if lit == field => {}
                Some(_) => return None,
            }
        }
        fields.next().is_none().then_some(captures)
    }
}

/// A glob mapping's name or label value: text with `$N` / `${N}` references to captures.
#[derive(Debug, Clone)]
pub(super) struct Template {
    pieces: Vec<Piece>,
}

#[derive(Debug, Clone)]
enum Piece {
    Text(String),
    /// The capture at this index (0 for `$1`).
    Capture(usize),
}

impl Template {
    /// As `fsm.NewTemplateFormatter`: a reference is `$` then an optional `{`, the longest run
    /// of `[a-zA-Z0-9_$]`, and an optional `}`; one that is not a number from 1 to `captures`
    /// (`$0`, `$3` of two captures, `$1_$2`, read as the one name `1_$2`) becomes nothing.
    pub(super) fn new(text: &str, captures: usize) -> Template {
        static REF: OnceLock<Regex> = OnceLock::new();
        let reference =
            REF.get_or_init(|| Regex::new(r"\$\{?([a-zA-Z0-9_$]+)\}?").expect("valid pattern"));
        let mut pieces = Vec::new();
        let mut last = 0;
        for c in reference.captures_iter(text) {
            let whole = c.get(0).expect("group 0");
            if whole.start() > last {
                pieces.push(Piece::Text(text[last..whole.start()].to_owned()));
            }
            if let Ok(n) = c[1].parse::<usize>() {
                if (1..=captures).contains(&n) {
                    pieces.push(Piece::Capture(n - 1));
                }
            }
            last = whole.end();
        }
        if last < text.len() {
            pieces.push(Piece::Text(text[last..].to_owned()));
        }
        Template { pieces }
    }

    pub(super) fn format(&self, captures: &[&str]) -> String {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Capture(i) => out.push_str(captures.get(*i).copied().unwrap_or("")),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_star_is_one_whole_component() {
        let g = Glob::parse("test.*.*.counter").unwrap();
        assert_eq!(
            g.matches("test.my-dispatcher.morethanone.counter"),
            Some(vec!["my-dispatcher", "morethanone"])
        );
        assert_eq!(g.matches("test.a.b.c.counter"), None);
        assert_eq!(g.matches("test.a.counter"), None);
        assert_eq!(g.matches("test.a.b.gauge"), None);
        assert_eq!(g.matches("test..b.counter"), Some(vec!["", "b"]));
    }

    #[test]
    fn globs_statsd_exporter_refuses() {
        for bad in ["1test.a", "a..b", "a.b.", "a.b*", "a.b c", ""] {
            assert!(Glob::parse(bad).is_err(), "{bad}");
        }
        // Later components may start with a digit (statsd_exporter issue 328).
        assert!(Glob::parse("a.1b.*").is_ok());
    }

    #[test]
    fn templates_as_the_fsm_formatter() {
        let caps = ["dispatcher", "one"];
        let t = |s: &str| Template::new(s, 2).format(&caps);
        assert_eq!(t("${1}_${2}_total"), "dispatcher_one_total");
        // `$2_total` is one reference named `2_total`: nothing.
        assert_eq!(t("${1}_$2_total"), "dispatcher_");
        assert_eq!(t("name_$1"), "name_dispatcher");
        assert_eq!(t("constant"), "constant");
        // Out of range, zero and non-numeric references become nothing.
        assert_eq!(t("a_${3}_b"), "a__b");
        assert_eq!(t("a_$0"), "a_");
        // `$1_$2` is one reference named `1_$2`, as Go's formatter reads it.
        assert_eq!(t("x_$1_$2"), "x_");
    }
}
