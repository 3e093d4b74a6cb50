//! The deadline of a request's blocking work that asks the catalog, so that a stalled catalog
//! (a frozen or partitioned PostgreSQL, whose queries the server's own timeouts cannot end)
//! answers 503 `catalog_unavailable` within a few seconds instead of holding the request.
//!
//! The work itself goes on in the blocking pool until the catalog answers or its connection
//! fails (the pool's checkout timeout, the TCP user timeout and keepalive bound that); only
//! the caller stops waiting. The deadline is one per process: the catalog's checkout timeout
//! plus its statement timeout plus a second, set once at start ([`set`]).

use std::sync::OnceLock;
use std::time::Duration;

use ndpipe_catalog::CatalogError;
use tokio::task::JoinError;

/// The deadline until [`set`] is called: the catalog's default timeouts (2 s + 3 s) and 1 s.
const DEFAULT: Duration = Duration::from_secs(6);

static DEADLINE: OnceLock<Duration> = OnceLock::new();

/// Work that did not finish within the deadline.
#[derive(Debug, thiserror::Error)]
#[error("no answer within {} ms: the catalog does not answer", .0.as_millis())]
pub(crate) struct Late(Duration);

/// Sets the deadline from the catalog's settings (in ms); the first call of a process wins.
pub(crate) fn set(checkout_ms: u64, statement_ms: u64) {
    let deadline = Duration::from_millis(checkout_ms.saturating_add(statement_ms))
        .saturating_add(Duration::from_secs(1));
    let _ = DEADLINE.set(deadline);
}

/// The deadline in force.
pub(crate) fn deadline() -> Duration {
    DEADLINE.get().copied().unwrap_or(DEFAULT)
}

/// [`Late`] as the catalog error it stands for.
pub(crate) fn unavailable(late: Late) -> CatalogError {
    CatalogError::Unavailable {
        op: "answer a request in time",
        source: Box::new(late),
    }
}

/// Runs `f` in the blocking pool and waits for it at most [`deadline`]: `Err(Late)` after
/// that, else its result (or the failure of its task).
pub(crate) async fn within<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<Result<T, JoinError>, Late> {
    let limit = deadline();
    tokio::time::timeout(limit, tokio::task::spawn_blocking(f))
        .await
        .map_err(|_| Late(limit))
}

/// [`within`] for catalog work, as an error type that takes a catalog error and a task
/// failure: too late is [`CatalogError::Unavailable`].
pub(crate) async fn catalog<T, E>(
    f: impl FnOnce() -> Result<T, CatalogError> + Send + 'static,
) -> Result<T, E>
where
    T: Send + 'static,
    E: From<CatalogError> + From<JoinError>,
{
    match within(f).await {
        Ok(Ok(result)) => Ok(result?),
        Ok(Err(join)) => Err(join.into()),
        Err(late) => Err(unavailable(late).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_past_the_deadline_is_unavailable_and_work_within_it_answers() {
        let quick: Result<_, crate::replication::ReplicationError> = catalog(|| Ok(7)).await;
        assert_eq!(quick.unwrap(), 7);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let started = std::time::Instant::now();
        let stalled: Result<_, crate::replication::ReplicationError> = catalog(move || {
            let _ = rx.recv();
            Ok(0)
        })
        .await;
        drop(tx);
        let Err(crate::replication::ReplicationError::Catalog(CatalogError::Unavailable {
            ..
        })) = stalled
        else {
            panic!("a stalled call is unavailable: {stalled:?}");
        };
        // A hang guard: the call came back, not much after its deadline.
        assert!(started.elapsed() < deadline() + Duration::from_secs(30));
    }
}
