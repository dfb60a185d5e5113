//! See benches/weigh.rs.
