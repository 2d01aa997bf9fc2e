//! The caps every listener admits its clients with: a total and a share per client
//! address of one pool (connections, handshakes, unauthenticated connections).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connections per client address.
#[derive(Default)]
pub struct ClientLimit {
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection counted against its client address (released when dropped).
pub struct ClientSlot {
    clients: Arc<ClientLimit>,
    ip: IpAddr,
}

impl ClientLimit {
    /// A slot for one more connection from `ip`, unless it has `max` already.
    pub fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<ClientSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            clients: Arc::clone(self),
            ip,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.clients.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// A total cap and a per-client-address share of one pool (connections, handshakes,
/// unauthenticated connections): what every listener admits its clients with.
#[derive(Clone)]
pub struct Caps {
    total: Arc<Semaphore>,
    clients: Arc<ClientLimit>,
    max_total: usize,
    per_client: usize,
}

/// A place in a [`Caps`] pool (given back when dropped).
pub struct Admission {
    _permit: OwnedSemaphorePermit,
    _slot: Option<ClientSlot>,
}

impl std::fmt::Debug for Caps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caps")
            .field("max_total", &self.max_total)
            .field("per_client", &self.per_client)
            .finish()
    }
}

impl Caps {
    /// `max_total` at once, `per_client` of them from one address (both at least 1).
    pub fn new(max_total: usize, per_client: usize) -> Caps {
        Caps {
            total: Arc::new(Semaphore::new(max_total.max(1))),
            clients: Arc::new(ClientLimit::default()),
            max_total: max_total.max(1),
            per_client: per_client.max(1),
        }
    }

    /// A place for a client at `ip` (`None`: a Unix socket, counted in the total only), or
    /// why not: `TooManyConnections` (the pool is full) or `TooManyFromClient` (this
    /// address has its share).
    pub fn admit(&self, ip: Option<IpAddr>) -> Result<Admission, &'static str> {
        let slot = match ip {
            Some(ip) => Some(
                self.clients
                    .take(ip, self.per_client)
                    .ok_or("TooManyFromClient")?,
            ),
            None => None,
        };
        let permit = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| "TooManyConnections")?;
        Ok(Admission {
            _permit: permit,
            _slot: slot,
        })
    }

    /// The pool's total cap.
    pub fn max_total(&self) -> usize {
        self.max_total
    }

    /// One address's share.
    pub fn per_client(&self) -> usize {
        self.per_client
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_refuse_over_the_share_and_over_the_total_and_give_places_back() {
        let caps = Caps::new(3, 2);
        let (a, b) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let one = caps.admit(Some(a)).unwrap();
        let _two = caps.admit(Some(a)).unwrap();
        assert_eq!(caps.admit(Some(a)).err(), Some("TooManyFromClient"));
        let _three = caps.admit(Some(b)).unwrap();
        assert_eq!(caps.admit(Some(b)).err(), Some("TooManyConnections"));
        assert_eq!(caps.admit(None).err(), Some("TooManyConnections"));
        drop(one);
        assert!(
            caps.admit(Some(b)).is_ok(),
            "a place given back is taken again"
        );
    }
}
