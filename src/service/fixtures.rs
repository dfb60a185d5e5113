//! What the service's unit tests build their requests from: the answer settings a default
//! start has, a descriptor of key-value pairs, a request of domain `d`.

use super::request::{Descriptor, Request};
use super::settings::{AnswerSettings, CountingRule};
use crate::descriptor::Entry;

pub(super) fn default_settings() -> AnswerSettings {
    AnswerSettings {
        response_headers: None,
        global_shadow_mode: false,
        request_limits: Default::default(),
        counting_rule: CountingRule::default(),
        global_quota_mode: false,
        response_dynamic_metadata: false,
        refused_by_metadata: false,
    }
}

pub(super) fn desc(pairs: &[(&'static str, &'static str)]) -> Descriptor<'static> {
    Descriptor {
        entries: pairs
            .iter()
            .map(|&(key, value)| Entry { key, value })
            .collect(),
        ..Default::default()
    }
}

pub(super) fn request_of(descriptors: Vec<Descriptor<'static>>) -> Request<'static> {
    Request {
        domain: "d",
        descriptors: descriptors.into_iter().collect(),
        hits_addend: 0,
    }
}
