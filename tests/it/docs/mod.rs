//! What the docs and examples promise, checked: every relative link and repository path they
//! name exists, every example config passes `turnstile check`, Envoy's examples pass Envoy's
//! validation, and the lines the docs quote are the ones the binary prints.

mod examples;
mod links;
