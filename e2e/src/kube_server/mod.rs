//! Kubernetes API test server (being written).
