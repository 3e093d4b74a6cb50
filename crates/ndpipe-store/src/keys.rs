//! Access keys and who a request is: [`KeyStore`] creates, lists and deletes keys, and tells
//! the role of a bearer token (`/v1`) or the secret of an S3 access key (SigV4).
//!
//! SigV4 signs with the secret itself, so the server must be able to recover it: a one-way
//! hash cannot verify a signature. Each secret is therefore kept twice in the catalog: its
//! SHA-256 (a bearer token is found and checked by it) and sealed with ChaCha20-Poly1305 under
//! the data directory's master key (`DATA/keys.master`, 32 random bytes, mode 0600, made at
//! the first start), the access key id as associated data. The catalog, its backups and a
//! shared PostgreSQL database hold no usable secret without that file (so the nodes of a
//! cluster on one PostgreSQL catalog need the same `keys.master`). Secrets are 192 random
//! bits, so an unsalted hash of one cannot be searched. Comparisons of secrets and hashes are
//! constant-time. The old bearer token (`--token`) is an admin key: access key
//! `ndpipe-admin` on S3, `Bearer TOKEN` on `/v1`. Keys are looked up in memory
//! ([`KeyCache`], reloaded every few seconds), so that checking one needs no catalog query.

use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use ndpipe_catalog::{AccessKeyRecord, AccessKeys, CatalogError, Role, SqliteCatalog};
use ndpipe_util::http::constant_time_eq;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::warn;

use crate::key_cache::{DEFAULT_REFRESH, KeyCache};

/// The S3 access key whose secret is the bearer token.
pub const ADMIN_ACCESS_KEY: &str = "ndpipe-admin";
/// The master key's file in the data directory.
const MASTER_FILE: &str = "keys.master";
const NONCE_BYTES: usize = 12;

/// Why a key operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The master key file (or another secret file) could not be read or made.
    #[error("{}: {source}", path.display())]
    Master {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The catalog failed (or the name is taken: [`CatalogError::Conflict`]).
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// A sealed secret did not open: another master key sealed it, or it was damaged.
    #[error("the secret of access key {0} cannot be opened with this data directory's master key")]
    Unsealable(String),
    /// This process keeps no master key (a gateway without `keys_master_file`), so it cannot
    /// seal or open a secret.
    #[error(
        "no master key here: give a gateway the cluster's keys.master (--keys-master-file) to check S3 signatures"
    )]
    NoMasterKey,
    /// The system's random source failed.
    #[error("no randomness: {0}")]
    Random(String),
    /// The name is empty, too long or not printable.
    #[error("invalid key name: {0}")]
    InvalidName(String),
}

/// A new key: the only time its secret is shown.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewKey {
    /// The access key id (S3 `aws_access_key_id`).
    pub access_key: String,
    /// The secret (S3 `aws_secret_access_key`, or `Authorization: Bearer SECRET` on `/v1`).
    pub secret_key: String,
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: Role,
}

/// A key as listed: everything but its secret.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyInfo {
    /// The access key id.
    pub access_key: String,
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: i64,
}

/// The access keys of a data directory, and the admin token.
pub struct KeyStore {
    keys: KeyCache,
    /// `None` without a master key: bearer tokens are checked, secrets cannot be sealed or
    /// opened.
    cipher: Option<ChaCha20Poly1305>,
    admin_token: Option<String>,
}

impl KeyStore {
    /// The keys of the data directory `data` (its catalog and master key, made when missing),
    /// for tools that run without a server (`ndpipe keys --data DIR`).
    pub fn open(data: &Path) -> Result<KeyStore, KeyError> {
        std::fs::create_dir_all(data).map_err(|source| KeyError::Master {
            path: data.to_path_buf(),
            source,
        })?;
        let catalog = Arc::new(SqliteCatalog::open(&data.join("catalog.sqlite"))?);
        KeyStore::with_catalog(catalog, data, None, DEFAULT_REFRESH)
    }

    /// The keys in `catalog` (reloaded every `refresh`), sealed with the master key of `data`;
    /// `admin_token`, when set, is an admin key too.
    pub(crate) fn with_catalog(
        catalog: Arc<dyn AccessKeys>,
        data: &Path,
        admin_token: Option<String>,
        refresh: Duration,
    ) -> Result<KeyStore, KeyError> {
        let key = master_key(&data.join(MASTER_FILE))?;
        Ok(KeyStore {
            keys: KeyCache::new(catalog, refresh),
            cipher: Some(ChaCha20Poly1305::new(Key::from_slice(&key))),
            admin_token,
        })
    }

    /// The keys in `catalog` for a process that keeps no data directory (a gateway): with
    /// `master`, the cluster's master key file (a PipeStore's `keys.master`, which must exist),
    /// S3 signatures by access keys are checked; without, bearer tokens are checked by their
    /// hashes, and creating keys and opening secrets fail with [`KeyError::NoMasterKey`]. The
    /// keys are reloaded every `refresh`.
    pub(crate) fn without_data(
        catalog: Arc<dyn AccessKeys>,
        master: Option<&Path>,
        admin_token: Option<String>,
        refresh: Duration,
    ) -> Result<KeyStore, KeyError> {
        let cipher = match master {
            Some(path) => {
                let key = read_master_key(path)?;
                Some(ChaCha20Poly1305::new(Key::from_slice(&key)))
            }
            None => None,
        };
        Ok(KeyStore {
            keys: KeyCache::new(catalog, refresh),
            cipher,
            admin_token,
        })
    }

    /// The keys in `catalog` checked as bearer tokens only (by their hashes; nothing sealed or
    /// opened), with `admin_token` an admin key: a standalone Tuner's guard.
    pub(crate) fn bearer_only(
        catalog: Arc<dyn AccessKeys>,
        admin_token: Option<String>,
    ) -> KeyStore {
        KeyStore {
            keys: KeyCache::new(catalog, DEFAULT_REFRESH),
            cipher: None,
            admin_token,
        }
    }

    fn cipher(&self) -> Result<&ChaCha20Poly1305, KeyError> {
        self.cipher.as_ref().ok_or(KeyError::NoMasterKey)
    }

    /// Creates a key named `name` with `role`; the reply holds its secret.
    pub fn create(&self, name: &str, role: Role) -> Result<NewKey, KeyError> {
        check_name(name)?;
        let access_key = format!(
            "NDP{}",
            random_text(17, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")?
        );
        let secret_key = hex::encode(random_bytes::<24>()?);
        let record = AccessKeyRecord {
            access_key: access_key.clone(),
            name: name.to_string(),
            role,
            secret_sha256: sha256_hex(&secret_key),
            sealed_secret: self.seal(&access_key, &secret_key)?,
            created_ms: ndpipe_util::time::now_ms(),
        };
        self.keys.catalog().create_key(&record)?;
        self.keys.created(record);
        Ok(NewKey {
            access_key,
            secret_key,
            name: name.to_string(),
            role,
        })
    }

    /// Every key, in name order, without secrets.
    pub fn list(&self) -> Result<Vec<KeyInfo>, KeyError> {
        Ok(self
            .keys
            .catalog()
            .keys()?
            .into_iter()
            .map(|k| KeyInfo {
                access_key: k.access_key,
                name: k.name,
                role: k.role,
                created_ms: k.created_ms,
            })
            .collect())
    }

    /// Deletes the key named `name`; whether it existed.
    pub fn delete(&self, name: &str) -> Result<bool, KeyError> {
        let existed = self.keys.catalog().delete_key(name)?;
        self.keys.deleted(name);
        Ok(existed)
    }

    /// Whether any access key exists: then every call needs one.
    pub(crate) fn any(&self) -> Result<bool, KeyError> {
        Ok(self.keys.any()?)
    }

    /// Whether the admin token is set.
    pub(crate) fn has_token(&self) -> bool {
        self.admin_token.is_some()
    }

    /// The role of a bearer token: the admin token, or the secret of a key.
    pub(crate) fn role_of_bearer(&self, token: &str) -> Result<Option<Role>, KeyError> {
        if let Some(admin) = &self.admin_token
            && constant_time_eq(token.as_bytes(), admin.as_bytes())
        {
            return Ok(Some(Role::Admin));
        }
        let hash = sha256_hex(token);
        Ok(self
            .keys
            .by_secret(&hash)?
            .filter(|k| constant_time_eq(k.secret_sha256.as_bytes(), hash.as_bytes()))
            .map(|k| k.role))
    }

    /// The role and secret of S3 access key `access_key`.
    pub(crate) fn secret_of(&self, access_key: &str) -> Result<Option<(Role, String)>, KeyError> {
        if let Some(admin) = &self.admin_token
            && constant_time_eq(access_key.as_bytes(), ADMIN_ACCESS_KEY.as_bytes())
        {
            return Ok(Some((Role::Admin, admin.clone())));
        }
        let Some(key) = self.keys.by_access_key(access_key)? else {
            return Ok(None);
        };
        let secret = self.open_sealed(&key)?;
        Ok(Some((key.role, secret)))
    }

    fn seal(&self, access_key: &str, secret: &str) -> Result<Vec<u8>, KeyError> {
        let nonce = random_bytes::<NONCE_BYTES>()?;
        let sealed = self
            .cipher()?
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: secret.as_bytes(),
                    aad: access_key.as_bytes(),
                },
            )
            .map_err(|_| KeyError::Unsealable(access_key.to_string()))?;
        Ok([nonce.as_slice(), &sealed].concat())
    }

    fn open_sealed(&self, key: &AccessKeyRecord) -> Result<String, KeyError> {
        let unsealable = || KeyError::Unsealable(key.access_key.clone());
        if key.sealed_secret.len() <= NONCE_BYTES {
            return Err(unsealable());
        }
        let (nonce, sealed) = key.sealed_secret.split_at(NONCE_BYTES);
        let plain = self
            .cipher()?
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: key.access_key.as_bytes(),
                },
            )
            .map_err(|_| unsealable())?;
        String::from_utf8(plain).map_err(|_| unsealable())
    }
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn random_bytes<const N: usize>() -> Result<[u8; N], KeyError> {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).map_err(|e| KeyError::Random(e.to_string()))?;
    Ok(out)
}

/// `len` characters drawn from `alphabet` (32 long, so each random byte gives one unbiased).
fn random_text(len: usize, alphabet: &[u8; 32]) -> Result<String, KeyError> {
    let bytes = random_bytes::<32>()?;
    Ok(bytes[..len]
        .iter()
        .map(|b| char::from(alphabet[usize::from(b & 31)]))
        .collect())
}

fn check_name(name: &str) -> Result<(), KeyError> {
    if name.trim().is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(KeyError::InvalidName(format!(
            "{name:?}: 1 to 128 printable characters"
        )));
    }
    Ok(())
}

/// The existing master key at `path`.
fn read_master_key(path: &Path) -> Result<[u8; 32], KeyError> {
    let err = |source| KeyError::Master {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(err)?;
    let mode = file.metadata().map_err(err)?.permissions().mode();
    if mode & 0o077 != 0 {
        warn!(path = %path.display(), mode = format!("{mode:o}"), "the master key file can be read by others; chmod 600 it");
    }
    let mut key = [0u8; 32];
    file.read_exact(&mut key).map_err(err)?;
    Ok(key)
}

/// The master key at `path`, made (32 random bytes, mode 0600, durably) when missing.
fn master_key(path: &Path) -> Result<[u8; 32], KeyError> {
    match std::fs::metadata(path) {
        Ok(_) => read_master_key(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let key = random_bytes::<32>()?;
            create_private_file(path, &key)?;
            Ok(key)
        }
        Err(source) => Err(KeyError::Master {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Makes a new master key file at `path` (32 random bytes, mode 0600), for a new cluster
/// (`ndpipe cluster init`); an existing file is an error, never overwritten.
pub fn create_master_key(path: &Path) -> Result<(), KeyError> {
    create_private_file(path, &random_bytes::<32>()?)
}

/// Makes a new secret file at `path` (a cluster secret, a token): 256 random bits as one line
/// of hex, mode 0600;
/// an existing file is an error, never overwritten.
pub fn create_secret_file(path: &Path) -> Result<(), KeyError> {
    let line = format!("{}\n", hex::encode(random_bytes::<32>()?));
    create_private_file(path, line.as_bytes())
}

/// Writes `contents` to the new file `path` (mode 0600, durably, its folder synced); fails
/// when `path` exists.
fn create_private_file(path: &Path, contents: &[u8]) -> Result<(), KeyError> {
    let err = |source| KeyError::Master {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    file.write_all(contents).map_err(err)?;
    file.sync_all().map_err(err)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        ndpipe_util::fs::sync_dir(dir).map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &Path, token: Option<&str>) -> KeyStore {
        let catalog = Arc::new(SqliteCatalog::open(&dir.join("catalog.sqlite")).unwrap());
        KeyStore::with_catalog(catalog, dir, token.map(str::to_string), DEFAULT_REFRESH).unwrap()
    }

    #[test]
    fn keys_are_sealed_found_by_bearer_and_opened_for_sigv4() {
        let dir = tempfile::tempdir().unwrap();
        let keys = store(dir.path(), Some("tok"));
        assert!(!keys.any().unwrap());
        let new = keys.create("uploader", Role::Write).unwrap();
        assert!(keys.any().unwrap());
        assert_eq!(
            keys.role_of_bearer(&new.secret_key).unwrap(),
            Some(Role::Write)
        );
        assert_eq!(keys.role_of_bearer("tok").unwrap(), Some(Role::Admin));
        assert_eq!(keys.role_of_bearer("guess").unwrap(), None);
        let (role, secret) = keys.secret_of(&new.access_key).unwrap().unwrap();
        assert_eq!(
            (role, secret.as_str()),
            (Role::Write, new.secret_key.as_str())
        );
        assert_eq!(keys.secret_of(ADMIN_ACCESS_KEY).unwrap().unwrap().1, "tok");
        let mode = std::fs::metadata(dir.path().join(MASTER_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let raw = SqliteCatalog::open(&dir.path().join("catalog.sqlite")).unwrap();
        let row = raw.key(&new.access_key).unwrap().unwrap();
        let sealed = String::from_utf8_lossy(&row.sealed_secret);
        assert!(
            !sealed.contains(&new.secret_key),
            "the catalog holds no clear secret"
        );
        assert!(matches!(
            keys.create("uploader", Role::Read),
            Err(KeyError::Catalog(CatalogError::Conflict { .. }))
        ));
        assert!(keys.delete("uploader").unwrap());
        assert_eq!(keys.role_of_bearer(&new.secret_key).unwrap(), None);
    }

    #[test]
    fn a_process_without_data_opens_secrets_only_with_the_master_key_file() {
        let dir = tempfile::tempdir().unwrap();
        let new = store(dir.path(), None).create("k", Role::Write).unwrap();
        let catalog = || Arc::new(SqliteCatalog::open(&dir.path().join("catalog.sqlite")).unwrap());
        let master = dir.path().join(MASTER_FILE);
        let gateway =
            KeyStore::without_data(catalog(), Some(&master), None, DEFAULT_REFRESH).unwrap();
        assert_eq!(
            gateway.secret_of(&new.access_key).unwrap().unwrap().1,
            new.secret_key
        );
        let bare = KeyStore::without_data(catalog(), None, None, DEFAULT_REFRESH).unwrap();
        assert_eq!(
            bare.role_of_bearer(&new.secret_key).unwrap(),
            Some(Role::Write),
            "bearer tokens need no master key"
        );
        assert!(matches!(
            bare.secret_of(&new.access_key),
            Err(KeyError::NoMasterKey)
        ));
        let missing = dir.path().join("no-such-master");
        assert!(matches!(
            KeyStore::without_data(catalog(), Some(&missing), None, DEFAULT_REFRESH),
            Err(KeyError::Master { .. })
        ));
        assert!(!missing.exists(), "a gateway makes no master key");
    }

    #[test]
    fn another_master_key_cannot_open_a_secret() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let new = store(a.path(), None).create("k", Role::Read).unwrap();
        std::fs::copy(
            a.path().join("catalog.sqlite"),
            b.path().join("catalog.sqlite"),
        )
        .unwrap();
        let other = store(b.path(), None);
        assert!(matches!(
            other.secret_of(&new.access_key),
            Err(KeyError::Unsealable(_))
        ));
    }
}
