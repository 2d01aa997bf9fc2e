//! Harness for e2e tests (being written).
