//! Authentication: bearer tokens, one per kubeconfig user, as a cluster with a static token
//! file would check them. A request without a token, or with one the server did not issue or
//! register, is 401 `Unauthorized`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use http::{HeaderMap, header};

use super::status::ApiError;

/// A user and its bearer token, registered with [`crate::ServerOptions::users`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// User name, as `RecordedRequest::user` and `SelfSubjectReview` report it.
    pub name: String,
    /// The bearer token that authenticates it.
    pub token: String,
}

impl User {
    /// A user with a fixed token.
    pub fn new(name: &str, token: &str) -> Self {
        Self {
            name: name.into(),
            token: token.into(),
        }
    }
}

#[derive(Default)]
struct Inner {
    by_token: BTreeMap<String, String>,
    by_name: BTreeMap<String, String>,
}

/// The users the server knows.
#[derive(Default)]
pub struct Users {
    inner: Mutex<Inner>,
}

impl Users {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Both maps are updated together under the lock; a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `user`; a later registration of the same name replaces its token.
    pub fn register(&self, user: &User) {
        let mut g = self.lock();
        if let Some(old) = g.by_name.insert(user.name.clone(), user.token.clone()) {
            g.by_token.remove(&old);
        }
        g.by_token.insert(user.token.clone(), user.name.clone());
    }

    /// The token of `name`, issuing a random one on first use.
    pub fn token_for(&self, name: &str) -> String {
        let mut g = self.lock();
        if let Some(t) = g.by_name.get(name) {
            return t.clone();
        }
        let token = format!("kts-{}", uuid::Uuid::new_v4().simple());
        g.by_name.insert(name.to_string(), token.clone());
        g.by_token.insert(token.clone(), name.to_string());
        token
    }

    /// The user a request's `Authorization: Bearer` header names, or 401.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<String, ApiError> {
        let unauthorized = || ApiError::new(401, "Unauthorized", "Unauthorized");
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, rest) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or_else(unauthorized)?;
        self.lock()
            .by_token
            .get(token)
            .cloned()
            .ok_or_else(unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(t: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {t}").parse().expect("header"),
        );
        h
    }

    #[test]
    fn issued_and_registered_tokens_authenticate_their_user() {
        let users = Users::default();
        let t = users.token_for("principal");
        assert_eq!(users.token_for("principal"), t, "one token per user");
        users.register(&User::new("agent", "fixed"));
        assert_eq!(users.authenticate(&bearer(&t)).as_deref(), Ok("principal"));
        assert_eq!(users.authenticate(&bearer("fixed")).as_deref(), Ok("agent"));
        assert_eq!(
            users.authenticate(&bearer("wrong")).map_err(|e| e.code),
            Err(401)
        );
        assert_eq!(
            users.authenticate(&HeaderMap::new()).map_err(|e| e.code),
            Err(401)
        );
        users.register(&User::new("agent", "rotated"));
        assert_eq!(
            users.authenticate(&bearer("fixed")).map_err(|e| e.code),
            Err(401)
        );
    }
}
