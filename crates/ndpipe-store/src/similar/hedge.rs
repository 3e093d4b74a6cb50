//! Asking one node of several for something any of them can give (a stored photo's features
//! from its holders, a query photo's features from the live PipeStores): the first is asked,
//! the next as soon as one fails or when those asked have been silent for a while, so that a
//! stopped node, which holds a call until its deadline, does not use up the query's deadline.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use ndpipe_catalog::PlacementNode;

use super::SimilarError;

/// The first success of `ask` over `nodes`, in order, the next started after `stagger` of
/// silence or at once after a failure. A failure `fatal` turns into an error ends the search
/// with it (a client error, which every node would answer); the others are gathered into
/// [`SimilarError::Unavailable`] (`none` when there was no node to ask). The caller bounds the
/// whole by the query's deadline.
pub(super) async fn first_answer<T, Fut>(
    nodes: Vec<PlacementNode>,
    stagger: Duration,
    ask: impl Fn(&PlacementNode) -> Fut,
    fatal: impl Fn(&tonic::Status) -> Option<SimilarError>,
    none: &str,
) -> Result<T, SimilarError>
where
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    let mut waiting = nodes.into_iter();
    let mut running = FuturesUnordered::new();
    let mut failed = Vec::new();
    loop {
        if running.is_empty() {
            match waiting.next() {
                Some(node) => running.push(tagged(node.name.clone(), ask(&node))),
                None if failed.is_empty() => return Err(SimilarError::Unavailable(none.into())),
                None => return Err(SimilarError::Unavailable(failed.join("; "))),
            }
        }
        tokio::select! {
            Some((name, result)) = running.next() => match result {
                Ok(found) => return Ok(found),
                Err(status) => match fatal(&status) {
                    Some(e) => return Err(e),
                    None => failed.push(format!("{name}: {}", status.message())),
                },
            },
            () = tokio::time::sleep(stagger), if waiting.len() > 0 => {
                if let Some(node) = waiting.next() {
                    running.push(tagged(node.name.clone(), ask(&node)));
                }
            }
        }
    }
}

/// A call's result with the name of the node called.
async fn tagged<T>(
    name: String,
    call: impl Future<Output = Result<T, tonic::Status>>,
) -> (String, Result<T, tonic::Status>) {
    (name, call.await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> PlacementNode {
        PlacementNode {
            name: name.into(),
            url: format!("http://{name}"),
            live: true,
            active: true,
            free_bytes: None,
        }
    }

    fn no_fatal(_: &tonic::Status) -> Option<SimilarError> {
        None
    }

    /// "silent" never answers, "down" fails at once, any other name answers itself.
    fn ask(node: &PlacementNode) -> impl Future<Output = Result<String, tonic::Status>> + use<> {
        let name = node.name.clone();
        async move {
            match name.as_str() {
                "silent" => std::future::pending().await,
                "down" => Err(tonic::Status::unavailable("connection refused")),
                _ => Ok(name),
            }
        }
    }

    #[tokio::test]
    async fn a_silent_node_does_not_keep_the_next_from_answering() {
        let nodes = vec![node("silent"), node("down"), node("b")];
        let asked = first_answer(nodes, Duration::from_millis(10), ask, no_fatal, "");
        // A hang guard: without the stagger, the silent node would hold the search forever.
        let found = tokio::time::timeout(Duration::from_secs(30), asked)
            .await
            .expect("the silent node held the search")
            .unwrap();
        assert_eq!(found, "b");
    }

    #[tokio::test]
    async fn failures_are_named_and_a_fatal_one_ends_the_search() {
        let nodes = vec![node("down"), node("down")];
        let e = first_answer(nodes, Duration::from_secs(1), ask, no_fatal, "none")
            .await
            .unwrap_err();
        let both_named = matches!(&e, SimilarError::Unavailable(m)
            if m.matches("connection refused").count() == 2);
        assert!(both_named, "{e}");
        let e = first_answer(
            vec![node("down"), node("b")],
            Duration::from_secs(1),
            ask,
            |_| Some(SimilarError::NotFound(7)),
            "none",
        )
        .await
        .unwrap_err();
        assert!(matches!(e, SimilarError::NotFound(7)), "{e}");
        let e = first_answer(Vec::new(), Duration::from_secs(1), ask, no_fatal, "none")
            .await
            .unwrap_err();
        assert!(
            matches!(&e, SimilarError::Unavailable(m) if m == "none"),
            "{e}"
        );
    }
}
