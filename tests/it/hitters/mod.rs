//! Who is limited, as an operator sees it on the debug port: `/debug/top` and its filters,
//! `/debug/status`, and the status page in a real browser.

pub mod status_page;
mod top;
