//! Everything the S3 API refuses instead of pretending, in one place. Nothing refused here is
//! stored or changed, and every refusal is S3's XML with AWS's code and status.
//!
//! - [`S3_REFUSALS`]: headers of features this store does not have (encryption, object lock,
//!   ACLs, storage classes, website redirects), checked on the operations each names by
//!   [`headers`], which the role check of every operation calls (`auth`), before any body
//!   is read;
//! - [`before_parsing`], called by `front` before `s3s` sees a request: SigV2 (a header
//!   `Authorization: AWS key:signature` or a presigned `AWSAccessKeyId`/`Signature` URL) is
//!   `InvalidRequest` whether or not the store has keys (unsigned requests to an open store
//!   still work); a presigned SigV4 URL valid for more than 7 days is
//!   `AuthorizationQueryParametersError`; a browser-form POST (`multipart/form-data`, `s3s`'s
//!   PostObject) is `NotImplemented`: `s3s` would read its whole file into memory (up to
//!   5 GiB) before any role check, and its form fields would bypass the table.
//!
//! Limits of single operations (`DeleteObjects` over 1,000 keys, a copy onto itself) are
//! checked where those operations are implemented.

use hyper::{HeaderMap, Method, StatusCode, Uri};
use s3s::{S3Error, S3Result, s3_error};

use super::errors::custom;

/// A header this store does not implement, refused on the operations where it means
/// something (AWS ignores most of them elsewhere).
#[derive(Debug, Clone, Copy)]
pub struct S3Refusal {
    /// The header names, lower case.
    pub headers: &'static [&'static str],
    /// Values that are still served, compared without case; empty when every value is
    /// refused.
    pub allowed: &'static [&'static str],
    /// The operations it is refused on, as S3 names them (`PutObject`, `CreateBucket`, ...).
    pub operations: &'static [&'static str],
    /// The S3 error code answered.
    pub code: &'static str,
    /// Its HTTP status.
    pub status: u16,
    /// The error's message.
    pub message: &'static str,
}

/// Operations that write an object with its properties.
const WRITES: &[&str] = &["PutObject", "CopyObject", "CreateMultipartUpload"];
/// Operations AWS takes SSE-C keys on.
const SSE_C_WRITES: &[&str] = &[
    "PutObject",
    "CopyObject",
    "CreateMultipartUpload",
    "UploadPart",
    "UploadPartCopy",
    "CompleteMultipartUpload",
];
const COPIES: &[&str] = &["CopyObject", "UploadPartCopy"];
const READS: &[&str] = &["GetObject", "HeadObject"];
const CREATE_BUCKET: &[&str] = &["CreateBucket"];

const SSE_C: &[&str] = &[
    "x-amz-server-side-encryption-customer-algorithm",
    "x-amz-server-side-encryption-customer-key",
    "x-amz-server-side-encryption-customer-key-md5",
];
const NOT_IMPLEMENTED: (&str, u16) = ("NotImplemented", 501);
const INVALID_REQUEST: (&str, u16) = ("InvalidRequest", 400);
/// AWS's answer for ACLs on a bucket whose objects its owner owns (the default since 2023).
const NO_ACLS: (&str, u16) = ("AccessControlListNotSupported", 400);
const NO_BUCKET_ACLS: (&str, u16) = ("InvalidBucketAclWithObjectOwnership", 400);
/// Canned ACLs that change nothing where the bucket's owner owns every object.
const OWNER_ACLS: &[&str] = &["private", "bucket-owner-full-control"];

const fn refusal(
    headers: &'static [&'static str],
    allowed: &'static [&'static str],
    operations: &'static [&'static str],
    (code, status): (&'static str, u16),
    message: &'static str,
) -> S3Refusal {
    S3Refusal {
        headers,
        allowed,
        operations,
        code,
        status,
        message,
    }
}

/// Every header the S3 API refuses: what, where, and the answer.
pub static S3_REFUSALS: &[S3Refusal] = &[
    refusal(
        SSE_C,
        &[],
        SSE_C_WRITES,
        NOT_IMPLEMENTED,
        "SSE-C (customer-provided keys) is not implemented: objects are stored unencrypted",
    ),
    refusal(
        &[
            "x-amz-copy-source-server-side-encryption-customer-algorithm",
            "x-amz-copy-source-server-side-encryption-customer-key",
            "x-amz-copy-source-server-side-encryption-customer-key-md5",
        ],
        &[],
        COPIES,
        NOT_IMPLEMENTED,
        "SSE-C (customer-provided keys) is not implemented: no object is encrypted",
    ),
    refusal(
        SSE_C,
        &[],
        READS,
        INVALID_REQUEST,
        "The encryption parameters are not applicable to this object",
    ),
    refusal(
        &[
            "x-amz-server-side-encryption",
            "x-amz-server-side-encryption-aws-kms-key-id",
            "x-amz-server-side-encryption-context",
            "x-amz-server-side-encryption-bucket-key-enabled",
        ],
        &[],
        WRITES,
        NOT_IMPLEMENTED,
        "server-side encryption (SSE-S3, SSE-KMS) is not implemented",
    ),
    refusal(
        &[
            "x-amz-object-lock-mode",
            "x-amz-object-lock-retain-until-date",
            "x-amz-object-lock-legal-hold",
        ],
        &[],
        WRITES,
        INVALID_REQUEST,
        "Bucket is missing Object Lock Configuration",
    ),
    refusal(
        &["x-amz-bucket-object-lock-enabled"],
        &["false"],
        CREATE_BUCKET,
        NOT_IMPLEMENTED,
        "object lock is not implemented",
    ),
    refusal(
        &["x-amz-acl"],
        OWNER_ACLS,
        WRITES,
        NO_ACLS,
        "The bucket does not allow ACLs",
    ),
    refusal(
        &[
            "x-amz-grant-full-control",
            "x-amz-grant-read",
            "x-amz-grant-read-acp",
            "x-amz-grant-write-acp",
        ],
        &[],
        WRITES,
        NO_ACLS,
        "The bucket does not allow ACLs",
    ),
    refusal(
        &["x-amz-acl"],
        OWNER_ACLS,
        CREATE_BUCKET,
        NO_BUCKET_ACLS,
        "Bucket cannot have ACLs set with ObjectOwnership's BucketOwnerEnforced setting",
    ),
    refusal(
        &[
            "x-amz-grant-full-control",
            "x-amz-grant-read",
            "x-amz-grant-read-acp",
            "x-amz-grant-write",
            "x-amz-grant-write-acp",
        ],
        &[],
        CREATE_BUCKET,
        NO_BUCKET_ACLS,
        "Bucket cannot have ACLs set with ObjectOwnership's BucketOwnerEnforced setting",
    ),
    refusal(
        &["x-amz-storage-class"],
        &["STANDARD"],
        WRITES,
        NOT_IMPLEMENTED,
        "storage classes other than STANDARD are not implemented",
    ),
    refusal(
        &["x-amz-website-redirect-location"],
        &[],
        WRITES,
        NOT_IMPLEMENTED,
        "website redirects are not implemented",
    ),
];

/// Refuses operation `op` when `headers` has one of [`S3_REFUSALS`] for it with a value it
/// does not allow.
pub(crate) fn headers(op: &str, headers: &HeaderMap) -> S3Result<()> {
    for rule in S3_REFUSALS.iter().filter(|r| r.operations.contains(&op)) {
        for name in rule.headers {
            let refused = headers.get_all(*name).iter().any(|value| {
                !value.to_str().is_ok_and(|v| {
                    rule.allowed
                        .iter()
                        .any(|a| a.eq_ignore_ascii_case(v.trim()))
                })
            });
            if refused {
                return Err(answer(rule, name));
            }
        }
    }
    Ok(())
}

/// The error of `rule`, naming `header`.
fn answer(rule: &S3Refusal, header: &str) -> S3Error {
    let status = StatusCode::from_u16(rule.status).unwrap_or(StatusCode::NOT_IMPLEMENTED);
    custom(rule.code, status, format!("{} ({header})", rule.message))
}

/// The longest a presigned URL may be valid, as AWS allows: 7 days.
const MAX_PRESIGNED_SECS: u64 = 7 * 24 * 3600;

/// Refuses, before `s3s` parses or verifies anything, what is never served: SigV2, a
/// presigned URL valid for more than 7 days, a browser-form POST.
pub(crate) fn before_parsing(method: &Method, uri: &Uri, headers: &HeaderMap) -> S3Result<()> {
    let query: Vec<_> = uri
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).collect())
        .unwrap_or_default();
    let has = |name: &str| query.iter().any(|(k, _)| k == name);
    let sigv2_header = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("AWS "));
    if sigv2_header || has("AWSAccessKeyId") || has("Signature") {
        return Err(s3_error!(
            InvalidRequest,
            "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256."
        ));
    }
    if let Some((_, expires)) = query.iter().find(|(k, _)| k == "X-Amz-Expires") {
        match expires.parse::<u64>() {
            Ok(secs) if secs <= MAX_PRESIGNED_SECS => {}
            Ok(_) => {
                return Err(s3_error!(
                    AuthorizationQueryParametersError,
                    "X-Amz-Expires must be less than a week (in seconds) that is {MAX_PRESIGNED_SECS}"
                ));
            }
            Err(_) => {
                return Err(s3_error!(
                    AuthorizationQueryParametersError,
                    "X-Amz-Expires should be a number"
                ));
            }
        }
    }
    let form = headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("multipart/form-data")
        });
    if method == Method::POST && form {
        return Err(s3_error!(
            NotImplemented,
            "browser-form POST uploads are not implemented: use PUT or a presigned PUT URL"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use s3s::S3ErrorCode;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn every_row_names_real_codes_lower_case_headers_and_operations_s3_has() {
        let known = [
            "PutObject",
            "CopyObject",
            "CreateMultipartUpload",
            "UploadPart",
            "UploadPartCopy",
            "CompleteMultipartUpload",
            "CreateBucket",
            "GetObject",
            "HeadObject",
        ];
        for rule in S3_REFUSALS {
            let code = S3ErrorCode::from_bytes(rule.code.as_bytes()).unwrap();
            assert_eq!(code.status_code().map(|s| s.as_u16()), Some(rule.status));
            assert!(rule.operations.iter().all(|op| known.contains(op)));
            assert!(rule.headers.iter().all(|h| *h == h.to_ascii_lowercase()));
        }
    }

    #[test]
    fn a_header_is_refused_on_its_operations_unless_its_value_is_allowed() {
        let public = headers(&[("x-amz-acl", "public-read")]);
        let e = super::headers("PutObject", &public).unwrap_err();
        assert_eq!(e.code(), &S3ErrorCode::AccessControlListNotSupported);
        assert!(super::headers("GetObject", &public).is_ok(), "not a write");
        let private = headers(&[
            ("x-amz-acl", "Private"),
            ("x-amz-storage-class", "STANDARD"),
        ]);
        assert!(super::headers("PutObject", &private).is_ok());
        let both = headers(&[("x-amz-acl", "private"), ("x-amz-acl", "public-read")]);
        assert!(
            super::headers("PutObject", &both).is_err(),
            "every value counts"
        );
        let ssec = headers(&[("x-amz-server-side-encryption-customer-algorithm", "AES256")]);
        let e = super::headers("UploadPart", &ssec).unwrap_err();
        assert_eq!(e.status_code(), Some(StatusCode::NOT_IMPLEMENTED));
        let e = super::headers("HeadObject", &ssec).unwrap_err();
        assert_eq!(e.code(), &S3ErrorCode::InvalidRequest);
        let lock = headers(&[("x-amz-bucket-object-lock-enabled", "true")]);
        assert!(super::headers("CreateBucket", &lock).is_err());
        let no_lock = headers(&[("x-amz-bucket-object-lock-enabled", "false")]);
        assert!(super::headers("CreateBucket", &no_lock).is_ok());
    }

    #[test]
    fn sigv2_long_presigned_urls_and_forms_are_refused_before_parsing() {
        let get = Method::GET;
        let refused = |method: &Method, uri: &str, pairs: &[(&'static str, &'static str)]| {
            before_parsing(method, &uri.parse().unwrap(), &headers(pairs))
                .err()
                .map(|e| e.code().as_str().to_string())
        };
        assert_eq!(refused(&get, "/b/k", &[]), None);
        let v4 = [("authorization", "AWS4-HMAC-SHA256 Credential=k/...")];
        assert_eq!(refused(&get, "/b/k", &v4), None);
        let v2 = Some("InvalidRequest".to_string());
        assert_eq!(refused(&get, "/b/k", &[("authorization", "AWS k:sig")]), v2);
        assert_eq!(
            refused(&get, "/b/k?AWSAccessKeyId=k&Expires=1&Signature=s", &[]),
            v2
        );
        let long = Some("AuthorizationQueryParametersError".to_string());
        assert_eq!(refused(&get, "/b/k?X-Amz-Expires=604800", &[]), None);
        assert_eq!(refused(&get, "/b/k?X-Amz-Expires=604801", &[]), long);
        assert_eq!(refused(&get, "/b/k?X%2DAmz%2DExpires=999999999", &[]), long);
        assert_eq!(refused(&get, "/b/k?X-Amz-Expires=-1", &[]), long);
        let form = [("content-type", "multipart/form-data; boundary=x")];
        let not_implemented = Some("NotImplemented".to_string());
        assert_eq!(refused(&Method::POST, "/b", &form), not_implemented);
        assert_eq!(refused(&Method::POST, "/b?delete", &[]), None);
    }
}
