//! The access keys in memory, so that an authorised call needs no catalog query: a snapshot of
//! every key, reloaded from the catalog by a thread of its own every `refresh` (a key revoked
//! on another node counts here within that time; whether any key exists, which opens or
//! closes an open store, too), and updated at once by this process's own creations and
//! deletions. A secret or access key the snapshot does not know is looked up in the catalog
//! (a key just made on another node works at once; an unknown one costs a query, as every
//! call did before).
//!
//! While the catalog does not answer, the last snapshot stays in use (reads with known keys
//! go on through an outage; a key revoked elsewhere in that time counts here once the catalog
//! answers again; an unknown key is a catalog error). Before the first snapshot loads (the
//! catalog was down at start), each call asks the catalog, as without a cache.

use std::collections::HashMap;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use ndpipe_catalog::{AccessKeyRecord, AccessKeys, CatalogError};
use ndpipe_util::sync::{read, write};
use tracing::warn;

/// How often the keys are reloaded unless told otherwise.
pub(crate) const DEFAULT_REFRESH: Duration = Duration::from_secs(3);

/// Every key, by the hash of its secret and by its access key id.
#[derive(Default)]
struct Snapshot {
    by_hash: HashMap<String, AccessKeyRecord>,
    by_access_key: HashMap<String, String>,
}

impl Snapshot {
    fn of(keys: Vec<AccessKeyRecord>) -> Self {
        let mut snapshot = Snapshot::default();
        for key in keys {
            snapshot.insert(key);
        }
        snapshot
    }

    fn insert(&mut self, key: AccessKeyRecord) {
        self.by_access_key
            .insert(key.access_key.clone(), key.secret_sha256.clone());
        self.by_hash.insert(key.secret_sha256.clone(), key);
    }

    fn remove_named(&mut self, name: &str) {
        self.by_hash.retain(|_, k| k.name != name);
        let hashes = &self.by_hash;
        self.by_access_key
            .retain(|_, hash| hashes.contains_key(hash));
    }
}

/// What the refresher thread and the cache share.
struct Shared {
    catalog: Arc<dyn AccessKeys>,
    snapshot: RwLock<Option<Snapshot>>,
}

impl Shared {
    fn reload(&self) -> Result<(), CatalogError> {
        let keys = self.catalog.keys()?;
        *write(&self.snapshot) = Some(Snapshot::of(keys));
        Ok(())
    }
}

/// The keys of a catalog, cached; dropping it stops its refresher thread.
pub(crate) struct KeyCache {
    shared: Arc<Shared>,
    /// Dropped with the cache, which wakes and ends the refresher.
    _stop: Sender<()>,
}

impl KeyCache {
    /// The keys of `catalog`, loaded now when the catalog answers and reloaded every
    /// `refresh` on a thread of their own.
    pub(crate) fn new(catalog: Arc<dyn AccessKeys>, refresh: Duration) -> Self {
        let shared = Arc::new(Shared {
            catalog,
            snapshot: RwLock::new(None),
        });
        if let Err(e) = shared.reload() {
            warn!(error = %e, "access keys not loaded; each call asks the catalog until they are");
        }
        let (stop, stopped) = mpsc::channel::<()>();
        let weak = Arc::downgrade(&shared);
        let spawned = std::thread::Builder::new()
            .name("ndpipe-keys".into())
            .spawn(move || refresh_until_dropped(&weak, refresh, &stopped));
        if let Err(e) = spawned {
            warn!(error = %e, "no thread to refresh the access keys; each call asks the catalog");
            *write(&shared.snapshot) = None;
        }
        KeyCache {
            shared,
            _stop: stop,
        }
    }

    /// The catalog the keys come from (for creating and deleting them).
    pub(crate) fn catalog(&self) -> &dyn AccessKeys {
        &*self.shared.catalog
    }

    /// Whether any key exists.
    pub(crate) fn any(&self) -> Result<bool, CatalogError> {
        match &*read(&self.shared.snapshot) {
            Some(s) => Ok(!s.by_hash.is_empty()),
            None => Ok(self.shared.catalog.count_keys()? > 0),
        }
    }

    /// The key whose secret has the hex SHA-256 `hash`.
    pub(crate) fn by_secret(&self, hash: &str) -> Result<Option<AccessKeyRecord>, CatalogError> {
        let known = read(&self.shared.snapshot)
            .as_ref()
            .and_then(|s| s.by_hash.get(hash).cloned());
        match known {
            Some(key) => Ok(Some(key)),
            None => self.remember(self.shared.catalog.key_by_secret(hash)?),
        }
    }

    /// The key with access key id `access_key`.
    pub(crate) fn by_access_key(
        &self,
        access_key: &str,
    ) -> Result<Option<AccessKeyRecord>, CatalogError> {
        let known = read(&self.shared.snapshot).as_ref().and_then(|s| {
            s.by_access_key
                .get(access_key)
                .and_then(|hash| s.by_hash.get(hash))
                .cloned()
        });
        match known {
            Some(key) => Ok(Some(key)),
            None => self.remember(self.shared.catalog.key(access_key)?),
        }
    }

    /// `found` in the catalog after a miss, kept in the snapshot.
    fn remember(
        &self,
        found: Option<AccessKeyRecord>,
    ) -> Result<Option<AccessKeyRecord>, CatalogError> {
        if let Some(key) = &found {
            self.created(key.clone());
        }
        Ok(found)
    }

    /// Counts `key`, just created in the catalog, at once.
    pub(crate) fn created(&self, key: AccessKeyRecord) {
        if let Some(s) = &mut *write(&self.shared.snapshot) {
            s.insert(key);
        }
    }

    /// Forgets the key named `name`, just deleted from the catalog, at once.
    pub(crate) fn deleted(&self, name: &str) {
        if let Some(s) = &mut *write(&self.shared.snapshot) {
            s.remove_named(name);
        }
    }
}

/// Reloads the keys every `refresh` until the cache is dropped.
fn refresh_until_dropped(shared: &Weak<Shared>, refresh: Duration, stopped: &mpsc::Receiver<()>) {
    let mut failing = false;
    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(refresh) {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        match shared.reload() {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("access keys reloaded from the catalog again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                warn!(error = %e, "access keys not reloaded; the last ones stay in use");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use ndpipe_catalog::{Role, SqliteCatalog};

    use super::*;

    /// A catalog that can be taken down: then every call fails as an unreachable one does.
    struct Flaky {
        inner: SqliteCatalog,
        down: AtomicBool,
    }

    impl Flaky {
        fn check(&self) -> Result<(), CatalogError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(CatalogError::Unavailable {
                    op: "test",
                    source: "down".into(),
                });
            }
            Ok(())
        }
    }

    impl AccessKeys for Flaky {
        fn create_key(&self, key: &AccessKeyRecord) -> Result<(), CatalogError> {
            self.check()?;
            self.inner.create_key(key)
        }
        fn key(&self, access_key: &str) -> Result<Option<AccessKeyRecord>, CatalogError> {
            self.check()?;
            self.inner.key(access_key)
        }
        fn key_by_secret(&self, hash: &str) -> Result<Option<AccessKeyRecord>, CatalogError> {
            self.check()?;
            self.inner.key_by_secret(hash)
        }
        fn keys(&self) -> Result<Vec<AccessKeyRecord>, CatalogError> {
            self.check()?;
            self.inner.keys()
        }
        fn delete_key(&self, name: &str) -> Result<bool, CatalogError> {
            self.check()?;
            self.inner.delete_key(name)
        }
        fn count_keys(&self) -> Result<u64, CatalogError> {
            self.check()?;
            self.inner.count_keys()
        }
    }

    fn record(name: &str, role: Role) -> AccessKeyRecord {
        AccessKeyRecord {
            access_key: format!("AK{name}"),
            name: name.into(),
            role,
            secret_sha256: format!("hash-of-{name}"),
            sealed_secret: vec![1; 20],
            created_ms: 0,
        }
    }

    /// Waits until `cond` holds; fails after 10 s, a hang guard far above the refresh.
    fn wait_until(what: &str, cond: impl Fn() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn catalog(dir: &std::path::Path) -> Arc<Flaky> {
        Arc::new(Flaky {
            inner: SqliteCatalog::open(&dir.join("catalog.sqlite")).unwrap(),
            down: AtomicBool::new(false),
        })
    }

    #[test]
    fn a_key_created_or_revoked_elsewhere_counts_after_a_refresh() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = catalog(dir.path());
        let db = catalog(dir.path());
        let cache = KeyCache::new(db.clone(), Duration::from_millis(50));
        assert!(!cache.any().unwrap());
        elsewhere.create_key(&record("k", Role::Write)).unwrap();
        // A key the snapshot does not know yet is looked up at once.
        let found = cache.by_secret("hash-of-k").unwrap().unwrap();
        assert_eq!(found.role, Role::Write);
        assert_eq!(cache.by_access_key("AKk").unwrap().unwrap().name, "k");
        wait_until("the new key counts as existing", || cache.any().unwrap());
        elsewhere.delete_key("k").unwrap();
        wait_until("the revoked key is refused", || {
            cache.by_secret("hash-of-k").unwrap().is_none()
        });
        assert!(cache.by_access_key("AKk").unwrap().is_none());
    }

    #[test]
    fn keys_are_answered_from_memory_while_the_catalog_is_down() {
        let dir = tempfile::tempdir().unwrap();
        let db = catalog(dir.path());
        db.create_key(&record("r", Role::Read)).unwrap();
        let cache = KeyCache::new(db.clone(), Duration::from_millis(20));
        db.down.store(true, Ordering::SeqCst);
        // Several refreshes fail meanwhile; the last snapshot still answers.
        std::thread::sleep(Duration::from_millis(100));
        assert!(cache.any().unwrap());
        assert_eq!(
            cache.by_secret("hash-of-r").unwrap().unwrap().role,
            Role::Read
        );
        assert!(
            matches!(
                cache.by_secret("hash-of-x"),
                Err(CatalogError::Unavailable { .. })
            ),
            "an unknown key needs the catalog"
        );
        // This process's own revocation counts at once, catalog or not.
        cache.deleted("r");
        assert!(cache.by_secret("hash-of-r").is_err());
        db.down.store(false, Ordering::SeqCst);
        db.inner.delete_key("r").unwrap();
        db.inner.create_key(&record("w", Role::Write)).unwrap();
        wait_until("reloaded after the outage", || {
            cache.by_secret("hash-of-w").unwrap().is_some()
        });
    }

    #[test]
    fn before_the_first_load_each_call_asks_the_catalog() {
        let dir = tempfile::tempdir().unwrap();
        let db = catalog(dir.path());
        db.down.store(true, Ordering::SeqCst);
        let cache = KeyCache::new(db.clone(), Duration::from_secs(3600));
        assert!(matches!(cache.any(), Err(CatalogError::Unavailable { .. })));
        db.down.store(false, Ordering::SeqCst);
        db.inner.create_key(&record("k", Role::Admin)).unwrap();
        assert!(cache.any().unwrap());
        assert_eq!(
            cache.by_secret("hash-of-k").unwrap().unwrap().role,
            Role::Admin
        );
    }
}
