//! Shutdown: SIGTERM under load answers every call and exits 0 (`under_load`); the process exits
//! at the grace's end and health answers 500 until the drain ends (`grace`).

mod grace;
mod under_load;
