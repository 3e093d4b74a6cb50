//! Access keys: who may call a PipeStore's APIs, with which role. The catalog keeps, per key,
//! the SHA-256 of its secret (to find and check a bearer token) and the secret sealed by the
//! PipeStore (SigV4 needs the secret itself, so a one-way hash alone cannot verify it); the
//! catalog never sees a secret in the clear.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::CatalogError;

/// What a key may do. Each role includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read photos, objects, labels, searches, jobs and metrics.
    Read,
    /// Also upload, overwrite and delete photos and objects, set ground truth, start jobs.
    Write,
    /// Also administer: compaction, access keys.
    Admin,
}

impl Role {
    /// The lowercase name used in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = CatalogError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "read" => Ok(Role::Read),
            "write" => Ok(Role::Write),
            "admin" => Ok(Role::Admin),
            other => Err(CatalogError::Invalid(format!(
                "role must be read, write or admin, not {other:?}"
            ))),
        }
    }
}

/// An access key as the catalog keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessKeyRecord {
    /// The public id (the S3 access key id), unique.
    pub access_key: String,
    /// A name for people, unique.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// Hex SHA-256 of the secret: how a bearer token finds its key.
    pub secret_sha256: String,
    /// The secret, sealed by the PipeStore's master key.
    pub sealed_secret: Vec<u8>,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: i64,
}
