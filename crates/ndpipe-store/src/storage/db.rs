//! A redb database that opens itself again after an I/O failure.
//!
//! After a failed write (a full disk), redb refuses every later operation ("Previous I/O error
//! occurred") until the database is closed and opened again, which repairs it to its last
//! commit. [`Db`] does that: the operation that failed reports its error, and the next one opens
//! the file again, so the index and the feature store work again once space returns, without a
//! restart.

use std::path::{Path, PathBuf};
use std::sync::RwLock;

use ndpipe_util::sync::{read, write};
use redb::Database;
use tracing::{info, warn};

use crate::storage::StoreError;

/// What is open, and how often it was opened (so that two threads seeing the same failure open
/// the file once).
struct Slot {
    db: Option<Database>,
    generation: u64,
}

/// One redb file, opened again after an I/O failure.
pub(crate) struct Db {
    path: PathBuf,
    /// Bytes of pages redb keeps in memory (its default is 1 GiB per file).
    cache_bytes: usize,
    /// Creates the tables of a new file; must not write to a file that has them.
    init: fn(&Database) -> Result<(), StoreError>,
    slot: RwLock<Slot>,
}

impl Db {
    /// Opens (creating if absent) the database at `path`, caching at most `cache_bytes` of
    /// its pages in memory; `init` creates its tables.
    pub(crate) fn open(
        path: &Path,
        cache_bytes: usize,
        init: fn(&Database) -> Result<(), StoreError>,
    ) -> Result<Self, StoreError> {
        let db = open_file(path, cache_bytes, init)?;
        Ok(Db {
            path: path.to_path_buf(),
            cache_bytes,
            init,
            slot: RwLock::new(Slot {
                db: Some(db),
                generation: 0,
            }),
        })
    }

    /// Runs a read; after an I/O failure (its own or an earlier write's) the file is opened
    /// again and the read tried once more.
    pub(crate) fn read<T>(
        &self,
        f: impl Fn(&Database) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match self.attempt(&f) {
            Outcome::Done(result) => result,
            Outcome::Failed(generation, e) => {
                self.reopen(generation, &e)?;
                match self.attempt(&f) {
                    Outcome::Done(result) => result,
                    Outcome::Failed(_, e) => Err(e),
                }
            }
        }
    }

    /// Runs a write. After an I/O failure the file is opened again (to its last commit) and the
    /// error returned: the caller decides what to do about the write.
    pub(crate) fn write<T>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match self.attempt(f) {
            Outcome::Done(result) => result,
            Outcome::Failed(generation, e) => {
                if let Err(reopen) = self.reopen(generation, &e) {
                    warn!(error = %reopen, path = %self.path.display(), "cannot open the database again yet");
                }
                Err(e)
            }
        }
    }

    /// Runs `f` on the open database (no database open counts as an I/O failure).
    fn attempt<T>(&self, f: impl FnOnce(&Database) -> Result<T, StoreError>) -> Outcome<T> {
        let slot = read(&self.slot);
        let result = match slot.db.as_ref() {
            Some(db) => f(db),
            None => Err(StoreError::index(redb::Error::DatabaseClosed)),
        };
        match result {
            Err(e) if e.needs_reopen() => Outcome::Failed(slot.generation, e),
            other => Outcome::Done(other),
        }
    }

    /// Closes the file and opens it again, unless another thread did since `generation`.
    fn reopen(&self, generation: u64, failure: &StoreError) -> Result<(), StoreError> {
        let mut slot = write(&self.slot);
        if slot.generation != generation && slot.db.is_some() {
            return Ok(());
        }
        warn!(error = %failure, path = %self.path.display(), "database I/O failed; opening it again");
        slot.db = None;
        slot.generation += 1;
        slot.db = Some(open_file(&self.path, self.cache_bytes, self.init)?);
        info!(path = %self.path.display(), "database open again");
        Ok(())
    }
}

/// What one attempt gave: a result, or an I/O failure that asks for opening the file again.
enum Outcome<T> {
    Done(Result<T, StoreError>),
    Failed(u64, StoreError),
}

fn open_file(
    path: &Path,
    cache_bytes: usize,
    init: fn(&Database) -> Result<(), StoreError>,
) -> Result<Database, StoreError> {
    let db = redb::Builder::new()
        .set_cache_size(cache_bytes)
        .create(path)
        .map_err(StoreError::index)?;
    init(&db)?;
    Ok(db)
}
