//! Who may call the S3 API. With a bearer token set (`--token`, `--token-file`), the token is
//! the secret of the admin access key [`ADMIN_ACCESS_KEY`]: every request must be signed with
//! it (SigV4 in the header or a presigned URL, verified by `s3s` with a constant-time
//! comparison, 15 minutes of clock skew at most), and anonymous requests are refused
//! (`AccessDenied`). Without a token the API is open, as `/v1` reads are.

use s3s::auth::{S3Auth, SecretKey};
use s3s::{S3Result, s3_error};

/// The access key whose secret is the bearer token.
pub(crate) const ADMIN_ACCESS_KEY: &str = "ndpipe-admin";

/// The token as the admin key's secret; any other access key is `InvalidAccessKeyId`.
pub(crate) struct TokenAuth {
    token: String,
}

impl TokenAuth {
    pub(crate) fn new(token: String) -> Self {
        TokenAuth { token }
    }
}

#[async_trait::async_trait]
impl S3Auth for TokenAuth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        if ndpipe_util::http::constant_time_eq(access_key.as_bytes(), ADMIN_ACCESS_KEY.as_bytes()) {
            Ok(SecretKey::from(self.token.as_str()))
        } else {
            Err(s3_error!(
                InvalidAccessKeyId,
                "the access key does not exist"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_the_admin_key_has_a_secret() {
        let auth = TokenAuth::new("s3cret".into());
        let secret = auth.get_secret_key(ADMIN_ACCESS_KEY).await.unwrap();
        assert_eq!(secret.expose(), "s3cret");
        let unknown = auth.get_secret_key("someone").await.err().unwrap();
        assert_eq!(unknown.code(), &s3s::S3ErrorCode::InvalidAccessKeyId);
    }
}
