//! The settings read from envoyproxy/ratelimit's environment: defaults, spellings, refusals that
//! name the variable (`environment`), and every setting of docs/settings.md's table refused by
//! the binary when its value is bad (`table`).

mod environment;
mod table;
