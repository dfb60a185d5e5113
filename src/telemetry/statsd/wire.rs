//! statsd's text format as lyft/gostats writes it (`net_sink.go`: `name:value|c\n`, `|g\n`,
//! `|ms\n`, tags folded into the name as `.__key=value`), DogStatsD's as datadog-go writes it
//! (`name:value|c|#key:value,...`), and the packing of lines into datagrams of a safe size.

use std::fmt::Write as _;

use super::Mogrifier;

/// gostats' UDP buffer (`net_sink.go`, `defaultBufferSizeUDP`): 1432 bytes fit an Ethernet MTU
/// of 1500 without fragmenting; datadog-go uses the same default.
pub const UDP_PACKET: usize = 1432;
/// gostats' TCP buffer (`defaultBufferSizeTCP`).
pub(super) const TCP_PACKET: usize = 1 << 16;
/// A line longer than this is dropped rather than sent (no UDP datagram could carry it).
pub(super) const MAX_LINE: usize = 65_000;

/// The kind of a stat, and its suffix on the wire.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Counter,
    Gauge,
    /// A timing in milliseconds, seen `1 / rate` times (`|@rate` when below 1).
    Timer {
        rate: f64,
    },
}

impl Kind {
    fn suffix(self) -> &'static str {
        match self {
            Kind::Counter => "c",
            Kind::Gauge => "g",
            Kind::Timer { .. } => "ms",
        }
    }
}

/// Envoy's stat names through envoyproxy/ratelimit's `utils.SanitizeStatName`
/// (`src/utils/utilities.go:65-73`): `:` and `|` become `_`, and so do the dots of anything
/// shaped like an IPv4 address. Control characters also become `_` (a descriptor value with a
/// newline would otherwise start a line of its own).
pub fn sanitize(name: &str) -> String {
    let mut out: Vec<u8> = name
        .bytes()
        .map(|b| match b {
            b':' | b'|' => b'_',
            b if b < 0x20 || b == 0x7f => b'_',
            b => b,
        })
        .collect();
    underscore_ipv4(&mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}` (leftmost, non-overlapping, as Go's
/// `ReplaceAllStringFunc`): the dots of each match become `_`.
fn underscore_ipv4(s: &mut [u8]) {
    let mut i = 0;
    while i < s.len() {
        match ipv4_at(s, i) {
            Some(end) => {
                s[i..end]
                    .iter_mut()
                    .filter(|b| **b == b'.')
                    .for_each(|b| *b = b'_');
                i = end;
            }
            None => i += 1,
        }
    }
}

/// The end of an IPv4-shaped match starting at `at`, digits taken greedily (1 to 3 a group).
fn ipv4_at(s: &[u8], at: usize) -> Option<usize> {
    let mut i = at;
    for group in 0..4 {
        if group > 0 {
            if s.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let digits = s[i.min(s.len())..]
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        i += digits;
    }
    Some(i)
}

/// gostats' `tags.ReplaceChars`: `.`, `:` and `|` in a tag value become `_`.
pub fn tag_value(v: &str) -> String {
    v.replace(['.', ':', '|'], "_")
}

/// How names and tags are written.
#[derive(Debug, Clone, Copy)]
pub enum Format<'a> {
    /// gostats: the tags, sorted by key, folded into the name (`tags.go`, `Serialize`).
    Statsd { tags: &'a [(String, String)] },
    /// DogStatsD: tags after `|#`, the name first rewritten by the first mogrifier that matches.
    Dog {
        tags: &'a [(String, String)],
        mogrifiers: &'a [Mogrifier],
    },
}

impl Format<'_> {
    /// One line, newline-terminated as gostats ends every line.
    pub fn line(&self, out: &mut String, name: &str, kind: Kind, value: f64) {
        let number = Number(value);
        match *self {
            Format::Statsd { tags } => {
                out.push_str(name);
                for (k, v) in tags {
                    let _ = write!(out, ".__{k}={v}");
                }
                let _ = write!(out, ":{number}|{}", kind.suffix());
                rate(out, kind);
            }
            Format::Dog { tags, mogrifiers } => {
                let (name, extra) = super::mogrify(mogrifiers, name);
                let _ = write!(out, "{name}:{number}|{}", kind.suffix());
                rate(out, kind);
                let mut all = tags.iter().map(|(k, v)| (k.as_str(), v.as_str()));
                let mut first = true;
                let mut tag = |out: &mut String, k: &str, v: &str| {
                    out.push_str(if first { "|#" } else { "," });
                    first = false;
                    let _ = write!(out, "{k}:{v}");
                };
                for (k, v) in all.by_ref() {
                    tag(out, k, v);
                }
                for (k, v) in &extra {
                    tag(out, k, v);
                }
            }
        }
        out.push('\n');
    }
}

fn rate(out: &mut String, kind: Kind) {
    if let Kind::Timer { rate } = kind {
        if rate < 1.0 {
            let _ = write!(out, "|@{rate}");
        }
    }
}

/// A value as gostats prints it: whole numbers without a fraction.
struct Number(f64);

impl std::fmt::Display for Number {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.0;
        if v.fract() == 0.0 && (0.0..1.8e19).contains(&v) {
            write!(f, "{}", v as u64)
        } else {
            write!(f, "{v}")
        }
    }
}

/// Lines packed into packets of at most `max` bytes, never splitting a line.
pub(super) fn pack(lines: &[String], max: usize) -> Vec<Vec<u8>> {
    let mut packets = Vec::new();
    let mut cur: Vec<u8> = Vec::with_capacity(max);
    for line in lines.iter().filter(|l| l.len() <= MAX_LINE) {
        if !cur.is_empty() && cur.len() + line.len() > max {
            packets.push(std::mem::replace(&mut cur, Vec::with_capacity(max)));
        }
        cur.extend_from_slice(line.as_bytes());
    }
    if !cur.is_empty() {
        packets.push(cur);
    }
    packets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitizes_as_the_reference() {
        assert_eq!(
            sanitize("d.key_1.2.3.4.total_hits"),
            "d.key_1_2_3_4.total_hits"
        );
        assert_eq!(sanitize("d.a:b|c"), "d.a_b_c");
        assert_eq!(sanitize("d.v\nx:1|c"), "d.v_x_1_c");
        assert_eq!(sanitize("d.1234.5.6.7"), "d.1234_5_6_7");
        assert_eq!(sanitize("d.1.2.3"), "d.1.2.3");
    }

    #[test]
    fn writes_statsd_and_dogstatsd_lines() {
        let tags = vec![
            ("a".to_string(), "1".to_string()),
            ("b".into(), "x_y".into()),
        ];
        let mut out = String::new();
        Format::Statsd { tags: &tags }.line(&mut out, "n.c", Kind::Counter, 3.0);
        Format::Statsd { tags: &[] }.line(&mut out, "n.g", Kind::Gauge, 7.0);
        let timer = Kind::Timer { rate: 0.25 };
        Format::Statsd { tags: &[] }.line(&mut out, "n.t", timer, 2.5);
        let dog = Format::Dog {
            tags: &tags,
            mogrifiers: &[],
        };
        dog.line(&mut out, "n.c", Kind::Counter, 3.0);
        assert_eq!(
            out,
            "n.c.__a=1.__b=x_y:3|c\nn.g:7|g\nn.t:2.5|ms|@0.25\nn.c:3|c|#a:1,b:x_y\n"
        );
    }

    #[test]
    fn packs_lines_under_the_size() {
        let lines: Vec<String> = (0..300).map(|i| format!("name.{i:03}:1|c\n")).collect();
        let packets = pack(&lines, UDP_PACKET);
        assert!(packets.len() > 1);
        assert!(packets.iter().all(|p| p.len() <= UDP_PACKET));
        let joined: Vec<u8> = packets.concat();
        assert_eq!(joined, lines.concat().into_bytes());
    }
}
