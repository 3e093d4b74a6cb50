//! A cap on the requests of one kind (uploads) that one client address has in flight at once,
//! so that one client cannot take every decode slot and connection with slow uploads while
//! others wait. A request over the cap is answered at once with 429 and a JSON body; the count
//! is taken before the body is read, and given back when the response is ready.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::extract::{ConnectInfo, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;

use crate::http::error_response;
use crate::sync::lock;

/// Requests in flight per client address, capped at `max` (0: no cap). Clones share the count.
#[derive(Debug, Clone)]
pub struct PerClientLimit {
    max: usize,
    in_flight: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One request counted against its client; dropping it gives the slot back.
#[derive(Debug)]
pub struct ClientPermit {
    limit: PerClientLimit,
    client: IpAddr,
}

impl PerClientLimit {
    /// At most `max` requests in flight per client address; 0 means no cap.
    pub fn new(max: usize) -> Self {
        PerClientLimit {
            max,
            in_flight: Arc::default(),
        }
    }

    /// Counts a request of `client`, or `None` when it has `max` in flight already.
    pub fn try_acquire(&self, client: IpAddr) -> Option<ClientPermit> {
        let mut in_flight = lock(&self.in_flight);
        let count = in_flight.entry(client).or_insert(0);
        if self.max > 0 && *count >= self.max {
            return None;
        }
        *count += 1;
        Some(ClientPermit {
            limit: self.clone(),
            client,
        })
    }

    /// Requests `client` has in flight.
    pub fn in_flight(&self, client: IpAddr) -> usize {
        lock(&self.in_flight).get(&client).copied().unwrap_or(0)
    }
}

impl Drop for ClientPermit {
    fn drop(&mut self) {
        let mut in_flight = lock(&self.limit.in_flight);
        if let Some(count) = in_flight.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                in_flight.remove(&self.client);
            }
        }
    }
}

/// Middleware body: holds a permit of the request's client (its `ConnectInfo<SocketAddr>`, set
/// by [`crate::serve::serve`]) while the request runs, or answers 429 `too_many_uploads`. A
/// request without a client address passes. Use as
/// `middleware::from_fn(move |req, next| limit_per_client(limit.clone(), req, next))`.
pub async fn limit_per_client(limit: PerClientLimit, req: Request, next: Next) -> Response {
    let client = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip());
    let Some(client) = client else {
        return next.run(req).await;
    };
    let Some(permit) = limit.try_acquire(client) else {
        return error_response(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_uploads",
            &format!(
                "{client} has {} uploads in flight, the most one client may have \
                 (--max-uploads-per-client)",
                limit.max
            ),
        );
    };
    let response = next.run(req).await;
    drop(permit);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_has_its_own_count_and_slots_come_back() {
        let limit = PerClientLimit::new(2);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = limit.try_acquire(a).unwrap();
        let _second = limit.try_acquire(a).unwrap();
        assert!(
            limit.try_acquire(a).is_none(),
            "a third upload of one client is refused"
        );
        assert!(limit.try_acquire(b).is_some(), "another client is not");
        drop(first);
        assert_eq!(limit.in_flight(a), 1);
        assert!(limit.try_acquire(a).is_some());
        let unlimited = PerClientLimit::new(0);
        let permits: Vec<_> = (0..100).filter_map(|_| unlimited.try_acquire(a)).collect();
        assert_eq!(permits.len(), 100);
    }
}
