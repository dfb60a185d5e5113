//! A limits file as written: a YAML list of limits, read with the line of every limit and of
//! every condition and variable, so an error names where it is.

use serde::Deserialize;
use serde_saphyr::Spanned;

/// One limit as written. Keys Limitador does not know are ignored, as it ignores them.
#[derive(Debug, Deserialize)]
pub(super) struct RawLimit {
    pub(super) namespace: Option<String>,
    pub(super) max_value: Option<u64>,
    pub(super) seconds: Option<u64>,
    pub(super) name: Option<String>,
    /// Accepted and shown by `/limits`, as Limitador does; not part of a limit's identity.
    pub(super) id: Option<String>,
    /// Required, as Limitador requires them; written empty (`conditions:`), null or `[]`, none.
    #[serde(deserialize_with = "required_list")]
    pub(super) conditions: Vec<Spanned<String>>,
    #[serde(deserialize_with = "required_list")]
    pub(super) variables: Vec<Spanned<String>>,
}

/// A list that must be written but may be empty or null (a missing key is serde's error).
fn required_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Spanned<String>>, D::Error> {
    let v: Option<Vec<Spanned<String>>> = Option::deserialize(d)?;
    Ok(v.unwrap_or_default())
}

/// The file's top level: a list of limits (an empty file is no limits).
pub(super) fn parse(text: &str) -> Result<Vec<Spanned<RawLimit>>, serde_saphyr::Error> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let read: Option<Vec<Spanned<RawLimit>>> =
        serde_saphyr::from_str_with_options(text, super::super::yaml_options())?;
    Ok(read.unwrap_or_default())
}

/// The limit (its index and first line) that line `line` of `text` belongs to: the last list
/// item begun at or before it, at the indentation of the file's first item.
pub(super) fn limit_at(text: &str, line: usize) -> Option<(usize, usize)> {
    let item = |l: &str| {
        let t = l.trim_start();
        (t == "-" || t.starts_with("- ")).then(|| l.len() - t.len())
    };
    let indent = text.lines().find_map(item)?;
    let starts = (text.lines().enumerate())
        .take(line)
        .filter(|(_, l)| item(l) == Some(indent))
        .map(|(n, _)| n + 1);
    let (i, first) = starts.enumerate().last()?;
    Some((i, first))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_line_belongs_to_the_last_limit_begun() {
        let text = "# limits\n- namespace: a\n  max_value: 1\n- namespace: b\n  max_value: -3\n";
        assert_eq!(super::limit_at(text, 3), Some((0, 2)));
        assert_eq!(super::limit_at(text, 5), Some((1, 4)));
        assert_eq!(super::limit_at(text, 1), None);
        let nested = "  - namespace: a\n    conditions:\n      - x\n  - namespace: b\n";
        assert_eq!(super::limit_at(nested, 3), Some((0, 1)));
        assert_eq!(super::limit_at(nested, 4), Some((1, 4)));
    }
}
