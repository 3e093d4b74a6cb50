//! Search in words on a store: a query ("kitty", "coffee cup") maps onto the class names of
//! every task the node serves (the backbone's own for `general`, each head's for a custom task)
//! by the words model ([`ndpipe_model::words`]), and the search then reads each class matched
//! under its task's active version.
//!
//! The matcher is built in the background at start (the class names' embeddings are kept in
//! `DATA/words/`, so only the first start embeds them all) and rebuilt, embedding only new
//! names, when a task gains classes. A store without the words model searches by class name; a
//! query in words then fails with the reason.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ndpipe_model::OTHER;
use ndpipe_model::words::{ClassMatcher, ClassName, Match, MatchOptions, TextEncoder, WordsError};
use ndpipe_util::sync::lock;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::inference::ActiveModel;

/// How long a query waits for the matcher of the first start to be built.
const READY_WAIT: Duration = Duration::from_secs(120);

/// Why a query in words cannot be answered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WordsFailure {
    /// The words model is not there, or the matcher failed to build.
    #[error("search in words is unavailable: {0}")]
    Unavailable(String),
    /// The matcher of the first start is still being built.
    #[error("search in words is starting: the class names are being embedded")]
    Starting,
    /// The query is empty or too long.
    #[error(transparent)]
    Query(WordsError),
}

/// The node's matcher of words onto class names.
pub(crate) struct Words {
    state: watch::Receiver<State>,
    /// The current matcher and the class list it was built from.
    matcher: Mutex<Option<(Vec<ClassName>, Arc<ClassMatcher>)>>,
}

#[derive(Clone)]
enum State {
    Building,
    Ready,
    Failed(String),
}

impl Words {
    /// Loads the words model from `dir` and builds the matcher of `model`'s classes in the
    /// background (embeddings cached in `cache`).
    pub(crate) fn start(
        dir: PathBuf,
        cache: PathBuf,
        options: MatchOptions,
        model: &ActiveModel,
    ) -> Arc<Self> {
        let (tx, rx) = watch::channel(State::Building);
        let words = Arc::new(Words {
            state: rx,
            matcher: Mutex::new(None),
        });
        let classes = classes_of(model);
        let building = words.clone();
        let spawned = std::thread::Builder::new()
            .name("ndpipe-words".into())
            .spawn(move || {
                let built = TextEncoder::load(&dir).and_then(|encoder| {
                    std::fs::create_dir_all(&cache).map_err(|source| WordsError::Write {
                        path: cache.clone(),
                        source,
                    })?;
                    ClassMatcher::build_cached(Arc::new(encoder), options, classes.clone(), &cache)
                });
                match built {
                    Ok(matcher) => {
                        info!(classes = classes.len(), "search in words is ready");
                        *lock(&building.matcher) = Some((classes, Arc::new(matcher)));
                        let _ = tx.send(State::Ready);
                    }
                    Err(e) => {
                        warn!(error = %e, "search in words is off; searches by class name go on");
                        let _ = tx.send(State::Failed(e.to_string()));
                    }
                }
            });
        if let Err(e) = spawned {
            warn!(error = %e, "could not start building the words matcher");
        }
        words
    }

    /// The classes `query` names, for `model`'s tasks (the matcher is rebuilt first when their
    /// classes changed). Blocks: call it off the async runtime.
    pub(crate) fn matches(
        &self,
        query: &str,
        model: &ActiveModel,
    ) -> Result<Vec<Match>, WordsFailure> {
        let mut state = self.state.clone();
        let waited = std::time::Instant::now();
        loop {
            match &*state.borrow_and_update() {
                State::Ready => break,
                State::Failed(why) => return Err(WordsFailure::Unavailable(why.clone())),
                State::Building if waited.elapsed() > READY_WAIT => {
                    return Err(WordsFailure::Starting);
                }
                State::Building => {}
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let matcher = self.current(model)?;
        matcher.match_query(query).map_err(WordsFailure::Query)
    }

    /// The matcher of `model`'s classes, built again (only new names embedded) when they
    /// changed since.
    fn current(&self, model: &ActiveModel) -> Result<Arc<ClassMatcher>, WordsFailure> {
        let classes = classes_of(model);
        let mut guard = lock(&self.matcher);
        let Some((built_from, matcher)) = guard.as_ref() else {
            return Err(WordsFailure::Unavailable(
                "the matcher was not built".into(),
            ));
        };
        if *built_from == classes {
            return Ok(matcher.clone());
        }
        let rebuilt = Arc::new(
            matcher
                .with_classes(classes.clone())
                .map_err(|e| WordsFailure::Unavailable(e.to_string()))?,
        );
        *guard = Some((classes, rebuilt.clone()));
        Ok(rebuilt)
    }
}

/// Every task's class names: the backbone's own for the general task, each head's for a custom
/// task (its `other` left out), in task order.
fn classes_of(model: &ActiveModel) -> Vec<ClassName> {
    let info = model.info();
    let mut classes = Vec::new();
    for task in &model.tasks {
        match &task.head {
            Some(head) => classes.extend(
                head.classes()
                    .iter()
                    .filter(|c| c.as_str() != OTHER)
                    .map(|c| ClassName::new(task.task.as_str(), c.as_str())),
            ),
            None => classes.extend(
                (0..info.num_classes)
                    .filter_map(|i| info.class_name(i))
                    .map(|c| ClassName::new(task.task.as_str(), c)),
            ),
        }
    }
    classes
}
