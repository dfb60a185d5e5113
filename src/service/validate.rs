//! The bounds on one request, so a hostile or broken client cannot make the service do
//! unbounded work; bad input gets INVALID_ARGUMENT naming what is wrong.

use super::{Request, RlsError};

/// Bounds on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    pub max_descriptors: usize,
    pub max_entries: usize,
    pub max_key_len: usize,
    pub max_value_len: usize,
    pub max_message_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_descriptors: 64,
            max_entries: 32,
            max_key_len: 256,
            max_value_len: 4096,
            max_message_bytes: 1 << 20,
        }
    }
}

/// Bad input gets INVALID_ARGUMENT naming what is wrong.
pub fn validate(req: &Request<'_>, limits: &RequestLimits) -> Result<(), RlsError> {
    let bad = |m: String| Err(RlsError::InvalidArgument(m));
    if req.domain.is_empty() {
        return bad("domain must not be empty".into());
    }
    if req.descriptors.is_empty() {
        return bad("descriptors must not be empty".into());
    }
    if req.descriptors.len() > limits.max_descriptors {
        return bad(format!(
            "too many descriptors: {} (limit {})",
            req.descriptors.len(),
            limits.max_descriptors
        ));
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.is_empty() {
            return bad(format!("descriptors[{i}] has no entries"));
        }
        if d.entries.len() > limits.max_entries {
            return bad(format!(
                "descriptors[{i}] has too many entries: {} (limit {})",
                d.entries.len(),
                limits.max_entries
            ));
        }
        for (j, e) in d.entries.iter().enumerate() {
            if e.key.is_empty() {
                return bad(format!(
                    "descriptors[{i}].entries[{j}].key must not be empty"
                ));
            }
            if e.key.len() > limits.max_key_len {
                return bad(format!(
                    "descriptors[{i}].entries[{j}].key is {} bytes (limit {})",
                    e.key.len(),
                    limits.max_key_len
                ));
            }
            if e.value.len() > limits.max_value_len {
                return bad(format!(
                    "descriptors[{i}].entries[{j}].value is {} bytes (limit {})",
                    e.value.len(),
                    limits.max_value_len
                ));
            }
        }
    }
    Ok(())
}
