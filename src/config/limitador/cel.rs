//! A limit's conditions and variables: CEL, compiled once at load by the `cel` crate (the
//! interpreter Limitador uses), evaluated as Limitador evaluates them. The two shapes Kuadrant
//! writes, `descriptors[N]["key"] == "value"` and `descriptors[N]["key"]`, are recognised at
//! load and read straight from the descriptor's entries: the same answer, without building a
//! CEL context; the limits index the first kind (`Namespace`).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use cel::{Context, ExecutionError, Program, Value};
use regex::Regex;

/// The only binding besides `limit`: the request's descriptors, a list of string maps.
const DESCRIPTORS: &str = "descriptors";

/// `descriptors[N]["key"]`, with a key written without escapes, in either quotes.
static ENTRY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"^\s*descriptors\s*\[\s*(\d{1,4})\s*\]\s*\[\s*(?:"([^"\\]*)"|'([^'\\]*)')\s*\]\s*$"#,
    )
    .expect("a valid pattern")
});

/// `<entry> == "value"`, the value written without escapes, in either quotes.
static EQUALS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"^(.*?)==\s*(?:"([^"\\]*)"|'([^'\\]*)')\s*$"#).expect("a valid pattern")
});

/// One entry of one descriptor: `descriptors[index][key]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntryRef {
    pub index: usize,
    pub key: String,
}

impl EntryRef {
    fn parse(text: &str) -> Option<EntryRef> {
        let c = ENTRY.captures(text)?;
        let key = c.get(2).or_else(|| c.get(3))?.as_str().to_owned();
        Some(EntryRef {
            index: c[1].parse().ok()?,
            key,
        })
    }
}

/// What a call's descriptors are to the conditions: each a list of entries in the order sent
/// (a key sent twice: the last wins, as in Limitador's map).
pub trait Entries {
    /// How many descriptors the call sent.
    fn descriptors(&self) -> usize;
    /// The value of `key` in descriptor `index`, the last one sent; `None` when absent.
    fn get(&self, index: usize, key: &str) -> Option<&str>;
    /// Calls `f` with every `(key, value)` of descriptor `index`, in the order sent.
    fn each(&self, index: usize, f: &mut dyn FnMut(&str, &str));
}

/// Evaluation failed the way Limitador fails a call (an index past the descriptors sent, a
/// value of the wrong type): the call is answered UNAVAILABLE.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text}: {message}")]
pub struct EvalError {
    pub text: String,
    pub message: String,
}

/// A condition: true, false, or an error that fails the call.
#[derive(Debug)]
pub enum Condition {
    /// `descriptors[N]["key"] == "value"`.
    Equals {
        entry: EntryRef,
        value: String,
        text: String,
    },
    Cel(Compiled),
}

/// A variable: the value its counter is kept for, none (the limit does not apply to the call),
/// or an error that fails the call.
#[derive(Debug)]
pub enum Variable {
    /// `descriptors[N]["key"]`.
    Entry {
        entry: EntryRef,
        text: String,
    },
    Cel(Compiled),
}

/// A CEL expression compiled, with the names it reads.
#[derive(Debug)]
pub struct Compiled {
    text: String,
    program: Program,
    /// Top-level names the expression reads besides `limit`: a name not bound (anything but
    /// `descriptors`) makes a condition false, as in Limitador.
    unbound: bool,
    /// Reads `limit.name` or `limit.id`: evaluated in a scope that binds them.
    reads_limit: bool,
}

impl Compiled {
    fn new(text: &str) -> Result<Compiled, String> {
        let program = Program::compile(text).map_err(|e| format!("couldn't parse {text}: {e}"))?;
        let references = program.references();
        let names = references.variables();
        let unbound = names.iter().any(|v| *v != DESCRIPTORS && *v != "limit");
        let reads_limit = names.contains(&"limit");
        drop(references);
        Ok(Compiled {
            text: text.to_owned(),
            program,
            unbound,
            reads_limit,
        })
    }

    fn resolve(&self, cx: &Bindings, limit: LimitNames<'_>) -> Result<Value, ExecutionError> {
        if !self.reads_limit {
            return self.program.execute(&cx.context);
        }
        let mut scope = cx.context.new_inner_scope();
        let name = |v: Option<&str>| v.map_or(Value::Null, |s| Value::from(s.to_owned()));
        let map = HashMap::from([("name", name(limit.name)), ("id", name(limit.id))]);
        scope.add_variable_from_value("limit", Value::from(map));
        self.program.execute(&scope)
    }

    fn error(&self, message: impl ToString) -> EvalError {
        EvalError {
            text: self.text.clone(),
            message: message.to_string(),
        }
    }
}

impl Condition {
    pub fn parse(text: &str) -> Result<Condition, String> {
        // Compiled even when recognised: a text CEL refuses is refused, whatever its shape.
        let compiled = Compiled::new(text)?;
        let equals = EQUALS.captures(text).and_then(|c| {
            let entry = EntryRef::parse(c.get(1)?.as_str())?;
            let value = c.get(2).or_else(|| c.get(3))?.as_str().to_owned();
            Some((entry, value))
        });
        Ok(match equals {
            Some((entry, value)) => Condition::Equals {
                entry,
                value,
                text: text.to_owned(),
            },
            None => Condition::Cel(compiled),
        })
    }

    pub fn text(&self) -> &str {
        match self {
            Condition::Equals { text, .. } => text,
            Condition::Cel(c) => &c.text,
        }
    }

    /// Whether the condition holds for the call: a missing key is false, an index past the
    /// descriptors sent an error.
    pub fn holds(
        &self,
        d: &dyn Entries,
        cx: &mut Lazy,
        limit: LimitNames<'_>,
    ) -> Result<bool, EvalError> {
        match self {
            Condition::Equals { entry, value, text } => {
                Ok(entry_of(d, entry, text)? == Some(value.as_str()))
            }
            Condition::Cel(c) if c.unbound => Ok(false),
            Condition::Cel(c) => match c.resolve(cx.get(d), limit) {
                Ok(Value::Bool(b)) => Ok(b),
                Ok(v) => Err(c.error(format!("unexpected value of type {}", kind(&v)))),
                Err(ExecutionError::NoSuchKey(_)) => Ok(false),
                Err(e) => Err(c.error(e)),
            },
        }
    }
}

impl Variable {
    pub fn parse(text: &str) -> Result<Variable, String> {
        let compiled = Compiled::new(text)?;
        Ok(match EntryRef::parse(text) {
            Some(entry) => Variable::Entry {
                entry,
                text: text.to_owned(),
            },
            None => Variable::Cel(compiled),
        })
    }

    pub fn text(&self) -> &str {
        match self {
            Variable::Entry { text, .. } => text,
            Variable::Cel(c) => &c.text,
        }
    }

    /// The variable's value for the call, as Limitador writes it into a counter: strings as
    /// they are, numbers and booleans in decimal, null as `null`. `None`: a key the call did
    /// not send, so the limit does not apply.
    pub fn value(
        &self,
        d: &dyn Entries,
        cx: &mut Lazy,
        limit: LimitNames<'_>,
    ) -> Result<Option<String>, EvalError> {
        match self {
            Variable::Entry { entry, text } => Ok(entry_of(d, entry, text)?.map(str::to_owned)),
            Variable::Cel(c) if c.unbound => Ok(None),
            Variable::Cel(c) => match c.resolve(cx.get(d), limit) {
                Ok(Value::String(s)) => Ok(Some(s.to_string())),
                Ok(Value::Int(i)) => Ok(Some(i.to_string())),
                Ok(Value::UInt(u)) => Ok(Some(u.to_string())),
                Ok(Value::Float(f)) => Ok(Some(f.to_string())),
                Ok(Value::Bool(b)) => Ok(Some(b.to_string())),
                Ok(Value::Null) => Ok(Some("null".to_owned())),
                Ok(v) => Err(c.error(format!("unexpected value of type {}", kind(&v)))),
                Err(ExecutionError::NoSuchKey(_)) => Ok(None),
                Err(e) => Err(c.error(e)),
            },
        }
    }
}

/// `descriptors[N][key]` read from the entries: absent is `None`, an index past the
/// descriptors sent is CEL's `IndexOutOfBounds`.
fn entry_of<'d>(
    d: &'d dyn Entries,
    e: &EntryRef,
    text: &str,
) -> Result<Option<&'d str>, EvalError> {
    if e.index >= d.descriptors() {
        return Err(EvalError {
            text: text.to_owned(),
            message: format!("Index out of bounds: {}", e.index),
        });
    }
    Ok(d.get(e.index, &e.key))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::List(_) => "list",
        Value::Map(_) => "map",
        Value::Int(_) => "integer",
        Value::UInt(_) => "unsigned integer",
        Value::Float(_) => "float",
        Value::String(_) => "string",
        Value::Bytes(_) => "bytes",
        Value::Bool(_) => "bool",
        Value::Null => "null",
        _ => "function",
    }
}

/// A limit's `name` and `id`, which its expressions may read as `limit.name` and `limit.id`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LimitNames<'a> {
    pub name: Option<&'a str>,
    pub id: Option<&'a str>,
}

/// A call's CEL bindings, built only when a limit that needs them is evaluated.
pub(super) struct Bindings {
    context: Context<'static, 'static>,
}

/// The bindings of one call, made the first time an expression needs them.
#[derive(Default)]
pub struct Lazy {
    made: Option<Bindings>,
}

impl Lazy {
    fn get(&mut self, d: &dyn Entries) -> &Bindings {
        self.made.get_or_insert_with(|| {
            let list: Vec<Value> = (0..d.descriptors())
                .map(|i| {
                    let mut map: HashMap<String, String> = HashMap::new();
                    d.each(i, &mut |k, v| {
                        map.insert(k.to_owned(), v.to_owned());
                    });
                    Value::from(map)
                })
                .collect();
            let mut context = Context::default();
            context.add_variable_from_value(DESCRIPTORS, Value::List(Arc::new(list)));
            Bindings { context }
        })
    }
}

/// `--metric-labels-default`: an expression giving a map, whose string entries label a call's
/// metrics. Kuadrant's, `descriptors[1]` (the wasm-shim's metric labels), is read straight from
/// the descriptor's entries: the same map, without a CEL context.
#[derive(Debug)]
pub enum LabelsExpr {
    /// `descriptors[N]`.
    Descriptor(usize),
    Cel(Compiled),
}

/// `descriptors[N]`.
static DESCRIPTOR: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\s*descriptors\s*\[\s*(\d{1,4})\s*\]\s*$").expect("a valid pattern")
});

impl LabelsExpr {
    pub fn parse(text: &str) -> Result<LabelsExpr, String> {
        let compiled = Compiled::new(text)?;
        let index = (DESCRIPTOR.captures(text)).and_then(|c| c[1].parse().ok());
        Ok(match index {
            Some(n) => LabelsExpr::Descriptor(n),
            None => LabelsExpr::Cel(compiled),
        })
    }

    /// The labels of a call sending `d`, sorted by name: none when the expression fails (an
    /// index past the descriptors sent) or is not a map.
    pub fn labels(&self, d: &dyn Entries) -> Vec<(String, String)> {
        let c = match self {
            LabelsExpr::Descriptor(n) if *n >= d.descriptors() => return Vec::new(),
            LabelsExpr::Descriptor(n) => {
                let mut out: Vec<(String, String)> = Vec::new();
                d.each(*n, &mut |k, v| {
                    // A key sent twice: the last wins, as in the map CEL sees.
                    out.retain(|(seen, _)| seen != k);
                    out.push((k.to_owned(), v.to_owned()));
                });
                out.sort();
                return out;
            }
            LabelsExpr::Cel(c) => c,
        };
        let mut cx = Lazy::default();
        let Ok(Value::Map(map)) = c.resolve(cx.get(d), LimitNames::default()) else {
            return Vec::new();
        };
        let mut out: Vec<(String, String)> = (map.map.iter())
            .filter_map(|(k, v)| match (k, v) {
                (cel::objects::Key::String(k), Value::String(v)) => {
                    Some((k.to_string(), v.to_string()))
                }
                _ => None,
            })
            .collect();
        out.sort();
        out
    }
}

/// One label of a `-L` file: its value for a call, as a variable's (a missing key, or any
/// error, leaves the label out, as Limitador leaves it out).
#[derive(Debug)]
pub struct LabelValue(Variable);

impl LabelValue {
    pub fn parse(text: &str) -> Result<LabelValue, String> {
        Variable::parse(text).map(LabelValue)
    }

    pub fn value(&self, d: &dyn Entries) -> Option<String> {
        let mut cx = Lazy::default();
        self.0
            .value(d, &mut cx, LimitNames::default())
            .ok()
            .flatten()
    }
}
