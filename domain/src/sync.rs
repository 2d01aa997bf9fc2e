//! Locking shared state: one poison-ignoring [`lock`] for every crate above domain.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning: a panic while the lock was held is reported by its own
/// task, and the state it guards stays usable (every writer leaves it consistent).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
