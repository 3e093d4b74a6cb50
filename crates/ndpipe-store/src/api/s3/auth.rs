//! Who may call the S3 API. While the data directory has access keys or a bearer token is set,
//! every request must be signed (SigV4 in the header or a presigned URL, verified by `s3s` with
//! a constant-time comparison and at most 15 minutes of clock skew) by a key whose role allows
//! the operation: reads (`Get*`, `Head*`, `List*`) need `read`, everything else `write`.
//! Anonymous requests are then `AccessDenied`; an unknown key is `InvalidAccessKeyId`, a wrong
//! secret `SignatureDoesNotMatch`. With neither keys nor a token the API is open, as `/v1` is.
//! Once the role allows the operation, its headers pass `refuse::headers` (before any body is
//! read); SigV2 and presigned URLs over 7 days never get here (`refuse::before_parsing`).

use std::sync::Arc;

use ndpipe_catalog::Role;
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::{S3Result, s3_error};

use super::errors::internal;
use super::refuse;
use crate::keys::{KeyError, KeyStore};

/// The secrets of the access keys (and of the admin key, the token) for SigV4.
pub(crate) struct KeyAuth(pub(crate) Arc<KeyStore>);

/// The role check of every operation.
pub(crate) struct KeyAccess(pub(crate) Arc<KeyStore>);

async fn secret_of(keys: &Arc<KeyStore>, access_key: &str) -> S3Result<Option<(Role, String)>> {
    let (keys, access_key) = (keys.clone(), access_key.to_string());
    super::blocking(move || keys.secret_of(&access_key).map_err(key_error)).await
}

/// A key lookup that failed: `ServiceUnavailable` when the catalog does not answer, else 500.
fn key_error(e: KeyError) -> s3s::S3Error {
    match e {
        KeyError::Catalog(e) => super::errors::catalog(e),
        other => internal(other),
    }
}

#[async_trait::async_trait]
impl S3Auth for KeyAuth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match secret_of(&self.0, access_key).await? {
            Some((_, secret)) => Ok(SecretKey::from(secret)),
            None => Err(s3_error!(
                InvalidAccessKeyId,
                "the access key does not exist"
            )),
        }
    }
}

/// The role operation `name` needs.
pub(super) fn required(name: &str) -> Role {
    if ["Get", "Head", "List"].iter().any(|p| name.starts_with(p)) {
        Role::Read
    } else {
        Role::Write
    }
}

#[async_trait::async_trait]
impl S3Access for KeyAccess {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        self.role(cx).await?;
        refuse::headers(cx.s3_op().name(), cx.headers())
    }
}

impl KeyAccess {
    /// Whether the caller's role allows the operation (anyone's, on an open store).
    async fn role(&self, cx: &S3AccessContext<'_>) -> S3Result<()> {
        let needed = required(cx.s3_op().name());
        let Some(credentials) = cx.credentials() else {
            let keys = self.0.clone();
            let protected =
                super::blocking(move || Ok(keys.has_token() || keys.any().map_err(key_error)?))
                    .await?;
            return if protected {
                Err(s3_error!(AccessDenied, "this store needs signed requests"))
            } else {
                Ok(())
            };
        };
        match secret_of(&self.0, &credentials.access_key).await? {
            Some((role, _)) if role >= needed => Ok(()),
            Some((role, _)) => Err(s3_error!(
                AccessDenied,
                "a {role} key cannot call {}",
                cx.s3_op().name()
            )),
            None => Err(s3_error!(
                InvalidAccessKeyId,
                "the access key does not exist"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_need_read_and_everything_else_write() {
        for op in [
            "GetObject",
            "HeadObject",
            "ListObjectsV2",
            "ListBuckets",
            "GetObjectTagging",
        ] {
            assert_eq!(required(op), Role::Read, "{op}");
        }
        for op in [
            "PutObject",
            "DeleteObjects",
            "CreateBucket",
            "UploadPart",
            "CopyObject",
        ] {
            assert_eq!(required(op), Role::Write, "{op}");
        }
    }
}
