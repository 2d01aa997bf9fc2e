//! Load and chaos against the real principal: the load generator's scenarios and their
//! simulated agents ([`bench`]), and the seeded chaos run ([`chaos`]). Both start the shipped
//! binaries through the test kit's harness.
#![forbid(unsafe_code)]

pub mod bench;
pub mod chaos;
