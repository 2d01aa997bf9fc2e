//! Client-side token bucket (QPS with burst), the model of client-go's `QPS`/`Burst`,
//! so a busy principal cannot flood the API server.
//!
//! Written by hand because tower's `RateLimit` is a fixed window without burst and
//! no small, ring-free crate offers a tower layer with burst.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

#[derive(Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// Takes one token, or says how long until one is available.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

/// Tower layer limiting requests to `qps` per second with bursts of up to `burst`.
///
/// Clones of the layer (and of the services it builds) share one bucket.
#[derive(Debug, Clone)]
pub struct TokenBucketLayer {
    bucket: Arc<Mutex<Bucket>>,
}

impl TokenBucketLayer {
    /// A bucket that starts full. `qps` must be positive; `burst` below 1 counts as 1.
    pub fn new(qps: f32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            bucket: Arc::new(Mutex::new(Bucket {
                qps: f64::from(qps).max(f64::MIN_POSITIVE),
                burst,
                tokens: burst,
                last: Instant::now(),
            })),
        }
    }
}

impl<S> Layer<S> for TokenBucketLayer {
    type Service = TokenBucket<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TokenBucket {
            inner,
            bucket: self.bucket.clone(),
            sleep: None,
            has_token: false,
        }
    }
}

/// Service built by [`TokenBucketLayer`]: not ready until a token is available.
pub struct TokenBucket<S> {
    inner: S,
    bucket: Arc<Mutex<Bucket>>,
    sleep: Option<Pin<Box<Sleep>>>,
    has_token: bool,
}

impl<S, R> Service<R> for TokenBucket<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.has_token {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            // A poisoned lock only means another task panicked mid-update; the bucket
            // numbers are still usable.
            let taken = self
                .bucket
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(Instant::now());
            match taken {
                Ok(()) => self.has_token = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.has_token = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use tower::ServiceExt;

    #[tokio::test(start_paused = true)]
    async fn burst_passes_at_once_then_requests_are_spaced_by_qps() {
        let layer = TokenBucketLayer::new(10.0, 3);
        let mut svc = layer.layer(tower::service_fn(|_: ()| async { Ok::<_, Infallible>(()) }));
        let start = Instant::now();
        for _ in 0..3 {
            let ready = svc.ready().await;
            assert!(ready.is_ok());
            let _ = svc.call(()).await;
        }
        assert!(
            start.elapsed() < Duration::from_millis(1),
            "burst must not wait"
        );
        for _ in 0..2 {
            let ready = svc.ready().await;
            assert!(ready.is_ok());
            let _ = svc.call(()).await;
        }
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(199) && waited < Duration::from_millis(250),
            "two requests past the burst at 10 qps take ~200ms, took {waited:?}"
        );
    }
}
