//! Load and chaos against the real principal: the load generator's scenarios and their
//! simulated agents ([`bench`](mod@bench)), and the seeded chaos run ([`chaos`]). Both start
//! the shipped binaries through the test kit's harness.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod bench;
pub mod chaos;
