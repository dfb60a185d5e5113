//! Reading one YAML config file into the builder. The deserializer reads the file as its
//! parser goes, and each top-level descriptor is built into the tree as soon as it is read
//! (when `domain` comes before `descriptors`, as files write it), so a load holds the text, the
//! tree built so far and one descriptor's parsed form: neither the whole file's events nor all
//! its parsed descriptors.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::build::{Builder, OpenDomain};
use super::raw::{opt_scalar, RawDescriptor, RawRateApi};
use super::{ConfigError, LoadOptions};

/// The deepest nesting of lists and mappings read: 31 levels of descriptors (a level is a list
/// and a mapping). The parse recurses once a level; a reload parses on a thread of 8 MiB of
/// stack.
const MAX_DEPTH: usize = 64;

/// The keys of a file's top level.
const FIELDS: &[&str] = &["name", "domain", "descriptors", "rate_api"];

/// Reads `text`, the YAML of `file`, into `builder`. Type errors and unknown keys name the path
/// and line where they are; rule violations are reported as the builder finds them.
pub(super) fn add_file(
    builder: &mut Builder,
    file: &str,
    text: &str,
    opts: LoadOptions,
) -> Result<(), ConfigError> {
    let mut reading = Reading::new(builder, file, opts);
    let read = serde_saphyr::with_deserializer_from_str_with_options(text, options(), |de| {
        reading.read(de)
    });
    reading.end(read, || Some(text.to_owned()))
}

/// As [`add_file`], reading the file at `path` as the parser goes: a load never holds a file's
/// whole text.
pub(super) fn add_path(
    builder: &mut Builder,
    file: &str,
    path: &std::path::Path,
    opts: LoadOptions,
) -> Result<(), ConfigError> {
    let reader = std::fs::File::open(path).map_err(|e| ConfigError {
        file: file.to_owned(),
        path: String::new(),
        message: format!("cannot read: {e}"),
    })?;
    let reader = std::io::BufReader::with_capacity(64 * 1024, reader);
    let mut reading = Reading::new(builder, file, opts);
    let read = serde_saphyr::with_deserializer_from_reader_with_options(reader, options(), |de| {
        reading.read(de)
    });
    // The text is read again for an error's message only.
    reading.end(read, || std::fs::read_to_string(path).ok())
}

/// One file being read into the builder, and where the parser is in it.
struct Reading<'a> {
    builder: &'a mut Builder,
    file: &'a str,
    opts: LoadOptions,
    /// The builder's error, when it refused a descriptor.
    refused: Option<ConfigError>,
    track: serde_path_to_error::Track,
}

impl<'a> Reading<'a> {
    fn new(builder: &'a mut Builder, file: &'a str, opts: LoadOptions) -> Reading<'a> {
        Reading {
            builder,
            file,
            opts,
            refused: None,
            track: serde_path_to_error::Track::new(),
        }
    }

    fn read(&mut self, de: serde_saphyr::Deserializer<'_, '_>) -> Result<(), serde_saphyr::Error> {
        let seed = FileSeed {
            builder: &mut *self.builder,
            file: self.file,
            opts: self.opts,
            refused: &mut self.refused,
        };
        seed.deserialize(serde_path_to_error::Deserializer::new(de, &mut self.track))
    }

    /// The error the read ended with, if any: the builder's, or the parser's with its path.
    fn end(
        self,
        read: Result<(), serde_saphyr::Error>,
        text: impl FnOnce() -> Option<String>,
    ) -> Result<(), ConfigError> {
        if let Some(e) = self.refused {
            return Err(e);
        }
        read.map_err(|e| ConfigError {
            file: self.file.to_owned(),
            path: String::new(),
            message: message(&self.track.path().to_string(), &e, text),
        })
    }
}

/// The YAML that files are read as: YAML 1.2's scalars (`yes` is a string, `0123` too, as
/// serde_yaml read them), a key twice in a mapping refused by the field it names, merge keys
/// (`<<`) expanded as envoyproxy/ratelimit's YAML library does, and no limit on the input's
/// size (the file is the operator's) but on its nesting. The statsd mapping file is read so too.
pub fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_reader_input_bytes: None,
            max_events: usize::MAX,
            max_nodes: usize::MAX,
            max_total_scalar_bytes: usize::MAX,
            max_depth: MAX_DEPTH,
        },
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::PassThrough,
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        with_snippet: false,
    }
}

/// The parser's message, after the path where it arose (`descriptors[0].rate_limit.unit: ...`),
/// which says the line and column.
pub(super) fn message(
    path: &str,
    e: &serde_saphyr::Error,
    text: impl FnOnce() -> Option<String>,
) -> String {
    let at = |l: serde_saphyr::Location| format!("at line {}, column {}", l.line(), l.column());
    let msg = match e.without_snippet() {
        serde_saphyr::Error::MultipleDocuments { location, .. } => format!(
            "a config file holds one YAML document, and a second one starts {}",
            at(*location)
        ),
        // A scalar that is not of the field's type: what was found, as written.
        serde_saphyr::Error::InvalidScalar { ty, location } => {
            let span = location.span();
            let text = text().unwrap_or_default();
            let found: String = (text.chars().skip(span.offset() as usize))
                .take(span.len() as usize)
                .collect();
            let found = Some(found).filter(|t| !t.is_empty() && t.len() <= 64 && !t.contains('\n'));
            match found {
                Some(t) => format!("invalid {ty}: found `{t}` {}", at(*location)),
                None => format!("invalid {ty} {}", at(*location)),
            }
        }
        serde_saphyr::Error::Budget {
            breach: serde_saphyr::budget::BudgetBreach::Depth { .. },
            location,
        } => format!(
            "nested too deep (at most {MAX_DEPTH} lists and mappings, {} levels of descriptors) {}",
            (MAX_DEPTH - 1) / 2,
            at(*location)
        ),
        serde_saphyr::Error::IOError { cause } => return format!("cannot read: {cause}"),
        _ => e.to_string(),
    };
    let msg = if msg.contains("unknown field") {
        format!("unknown key: {msg}")
    } else {
        msg
    };
    match path {
        "" | "." | "?" => msg,
        _ => format!("{path}: {msg}"),
    }
}

/// The file's top level: `name`, `domain`, `descriptors`, `rate_api`.
struct FileSeed<'a> {
    builder: &'a mut Builder,
    file: &'a str,
    opts: LoadOptions,
    /// The builder's error, when it refused a descriptor: the parse stops with it.
    refused: &'a mut Option<ConfigError>,
}

/// Where read descriptors go: built into the open domain, or kept until the file names its
/// domain (a file that lists `descriptors` before `domain`).
enum DescriptorSink {
    Open(OpenDomain),
    Pending(Vec<RawDescriptor>),
}

impl<'de> DeserializeSeed<'de> for FileSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_struct("RawFile", FIELDS, self)
    }
}

impl<'de> Visitor<'de> for FileSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a config file (a mapping of domain, descriptors and rate_api)")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.end(None, None, None)
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        let (mut name, mut domain, mut rate_api) = (None, None, None);
        let mut target: Option<DescriptorSink> = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "name" => once(&mut name, "name", map.next_value_seed(Scalar)?)?,
                "domain" => once(&mut domain, "domain", map.next_value_seed(Scalar)?)?,
                "rate_api" => once(&mut rate_api, "rate_api", map.next_value()?)?,
                "descriptors" => {
                    if target.is_some() {
                        return Err(de::Error::duplicate_field("descriptors"));
                    }
                    // Built as read once the domain is known; kept until then.
                    let named = domain.clone().flatten().filter(|d: &String| !d.is_empty());
                    let open = match named {
                        Some(d) => DescriptorSink::Open(self.open(d)?),
                        None => DescriptorSink::Pending(Vec::new()),
                    };
                    let seed = DescriptorsSeed {
                        target: open,
                        refused: &mut *self.refused,
                    };
                    target = map.next_value_seed(seed)?;
                }
                other => return Err(de::Error::unknown_field(other, FIELDS)),
            }
        }
        self.end(domain.flatten(), rate_api.flatten(), target)
    }
}

/// A top-level key given once.
fn once<T, E: de::Error>(slot: &mut Option<T>, field: &'static str, value: T) -> Result<(), E> {
    if slot.replace(value).is_some() {
        return Err(de::Error::duplicate_field(field));
    }
    Ok(())
}

impl FileSeed<'_> {
    fn open<E: de::Error>(&mut self, domain: String) -> Result<OpenDomain, E> {
        let opened = self.builder.open_domain(self.file, domain, self.opts);
        opened.map_err(|e| self.refuse(e))
    }

    fn refuse<E: de::Error>(&mut self, e: ConfigError) -> E {
        let shown = E::custom(&e);
        *self.refused = Some(e);
        shown
    }

    /// The file read: its `rate_api`, then its domain.
    fn end<E: de::Error>(
        mut self,
        domain: Option<String>,
        rate_api: Option<RawRateApi>,
        target: Option<DescriptorSink>,
    ) -> Result<(), E> {
        let domain = domain.unwrap_or_default();
        if let Some(api) = rate_api {
            let added = self.builder.add_rate_api(self.file, api);
            added.map_err(|e| self.refuse(e))?;
            if domain.is_empty() && target.is_none() {
                return Ok(());
            }
        }
        let open = match target {
            Some(DescriptorSink::Open(open)) => open,
            Some(DescriptorSink::Pending(raws)) => {
                let mut open = self.open(domain)?;
                for raw in raws {
                    open.add(raw).map_err(|e| self.refuse(e))?;
                }
                open
            }
            None => self.open(domain)?,
        };
        self.builder.close_domain(open);
        Ok(())
    }
}

/// A scalar read as text (see [`opt_scalar`]).
struct Scalar;

impl<'de> DeserializeSeed<'de> for Scalar {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        opt_scalar(d)
    }
}

/// The top-level `descriptors` list, each element handed to its target as it is read.
struct DescriptorsSeed<'a> {
    target: DescriptorSink,
    refused: &'a mut Option<ConfigError>,
}

impl<'de> DeserializeSeed<'de> for DescriptorsSeed<'_> {
    /// The target, or none when the file says `descriptors: ~`.
    type Value = Option<DescriptorSink>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<DescriptorSink>, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for DescriptorsSeed<'_> {
    type Value = Option<DescriptorSink>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of descriptors")
    }

    fn visit_none<E: de::Error>(self) -> Result<Option<DescriptorSink>, E> {
        self.visit_unit()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Option<DescriptorSink>, E> {
        // An open domain stays open (the file named it), with no descriptors.
        match self.target {
            DescriptorSink::Open(open) => Ok(Some(DescriptorSink::Open(open))),
            DescriptorSink::Pending(_) => Ok(None),
        }
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<DescriptorSink>, D::Error> {
        d.deserialize_seq(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(
        mut self,
        mut seq: A,
    ) -> Result<Option<DescriptorSink>, A::Error> {
        while let Some(raw) = seq.next_element::<RawDescriptor>()? {
            match &mut self.target {
                DescriptorSink::Open(open) => {
                    if let Err(e) = open.add(raw) {
                        let shown = de::Error::custom(&e);
                        *self.refused = Some(e);
                        return Err(shown);
                    }
                }
                DescriptorSink::Pending(raws) => raws.push(raw),
            }
        }
        Ok(Some(self.target))
    }
}
