//! Waiting on a condition with a deadline: `sluice-testwait`'s helpers, which every crate's tests
//! share, and its `HANG`, the bound only a hang crosses.

pub use sluice_testwait::{wait_until, wait_until_blocking, TimedOut, HANG};
