//! The deadline of a request's blocking work that asks the catalog, so that a stalled catalog
//! (a frozen or partitioned PostgreSQL, whose queries the server's own timeouts cannot end)
//! answers 503 `catalog_unavailable` within a few seconds instead of holding the request.
//!
//! The work itself goes on in the blocking pool until the catalog answers or its connection
//! fails (the pool's checkout timeout, the TCP user timeout and keepalive bound that); only
//! the caller stops waiting. The deadline is one per process: the catalog's checkout timeout
//! plus its statement timeout plus a second, armed once at start ([`set`]) by a process whose
//! catalog is PostgreSQL. A SQLite catalog is a local file beside the photos, with no network
//! to stall: there the work is awaited (a request that a loaded machine slows stays slow, not
//! a 503).

use std::sync::OnceLock;
use std::time::Duration;

use ndpipe_catalog::CatalogError;
use tokio::task::JoinError;

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

/// The deadline in force (`None`: none is armed).
pub(crate) fn deadline() -> Option<Duration> {
    DEADLINE.get().copied()
}

/// [`Late`] as the catalog error it stands for.
pub(crate) fn unavailable(late: Late) -> CatalogError {
    CatalogError::Unavailable {
        op: "answer a request in time",
        source: Box::new(late),
    }
}

/// Runs `f` in the blocking pool and waits for it at most [`deadline`], where one is armed:
/// `Err(Late)` after that, else its result (or the failure of its task).
pub(crate) async fn within<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<Result<T, JoinError>, Late> {
    within_limit(deadline(), f).await
}

/// [`within`] for the deadline `limit` (`None`: no deadline).
async fn within_limit<T: Send + 'static>(
    limit: Option<Duration>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<Result<T, JoinError>, Late> {
    let work = tokio::task::spawn_blocking(f);
    match limit {
        Some(limit) => tokio::time::timeout(limit, work)
            .await
            .map_err(|_| Late(limit)),
        None => Ok(work.await),
    }
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
    async fn work_past_the_deadline_is_late_and_work_within_it_or_without_one_answers() {
        let limit = Some(Duration::from_millis(300));
        assert_eq!(within_limit(limit, || 7).await.unwrap().unwrap(), 7);
        assert_eq!(within_limit(None, || 8).await.unwrap().unwrap(), 8);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let stalled = within_limit(limit, move || rx.recv().is_ok()).await;
        drop(tx);
        let Err(late) = stalled else {
            panic!("a stalled call is late: {stalled:?}");
        };
        assert!(matches!(
            unavailable(late),
            CatalogError::Unavailable { .. }
        ));
    }
}
