//! The S3 API with real clients (awscli, boto3, rclone, s5cmd, installed by `tools/setup.sh`)
//! against a real `ndpipe serve` on loopback ports.
//!
//! - `cli`: `aws s3` and `aws s3api`: buckets, cp up and down, ls, sync both ways, rm,
//!   a "directory" HEAD;
//! - `auth`: with a token, SigV4 with the admin key: each refusal (anonymous, unknown key,
//!   wrong secret, skewed clock, expired presigned URL) changes nothing; presigned GET and PUT
//!   with curl;
//! - `keys`: access keys (`ndpipe keys`, online and offline): roles on `/v1` and S3, refusals
//!   that change nothing, a deleted key;
//! - `bad_input`: malformed XML bodies, parts out of order or unknown, wrong digests: 4xx S3
//!   XML, nothing stored;
//! - `boto`: boto3: Range, paginated listing over 1000 keys, copy, batch delete;
//! - `conditional`: conditional GET, HEAD, PUT, CompleteMultipartUpload and CopyObject, and
//!   racing create-only and replace-only PUTs (the race script is shared with the cluster's
//!   test, `s3_races`);
//! - `photos`: photos through S3: a large JPEG in parts (aws and boto3) and parts that do not
//!   match, labels as tags (beside user tags) and metadata with the real model, bad images
//!   refused;
//! - `tools`: `rclone sync`/`check` of a photo folder, `s5cmd cp` of many files in parallel;
//! - `listing`: V1 paged with a delimiter, the listing XML (marker, delimiter, owner),
//!   `ListObjectVersions` of an unversioned bucket (boto3, awscli), deleting a bucket with only an
//!   upload in progress;
//! - `refuse`: every header of the store's refusal table refused on its operations with nothing
//!   stored, SigV2 and browser-form POSTs, presigned URLs over 7 days, `DeleteObjects` over 1,000
//!   keys, a copy onto itself, the request id of every error;
//! - `headers`: Cache-Control, Expires, Content-Encoding, Content-Disposition and
//!   Content-Language kept from PUT, copy and multipart, `response-*` overrides, a gzip object
//!   through awscli and boto3;
//! - `checksums`: checksums returned by PUT, GET (checked by boto3) and HEAD, composite and
//!   full-object multipart checksums, per-part ones, a wrong one refused;
//! - `parts`: GET/HEAD of one part, a retried CompleteMultipartUpload, UploadPartCopy,
//!   GetObjectAttributes;
//! - `tagging`: the user's tags (on PUT, multipart, copy, Put/DeleteObjectTagging, the tag
//!   count), refused past AWS's limits or on the labels' keys.

mod auth;
mod bad_input;
mod boto;
mod checksums;
mod cli;
pub(crate) mod conditional;
mod headers;
mod keys;
mod listing;
mod parts;
mod photos;
mod refuse;
mod tagging;
mod tools;

use std::path::Path;
use std::process::Command;

use crate::common::{Instance, free_port};

/// A store with its S3 API on a free port.
pub(crate) struct S3Store {
    pub(crate) inst: Instance,
    pub(crate) endpoint: String,
}

impl S3Store {
    /// `ndpipe serve --no-model` with S3 on a free port and `extra` flags.
    pub(crate) fn start(extra: &[&str]) -> Self {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut flags = vec!["--s3-listen", listen.as_str()];
        flags.extend_from_slice(extra);
        let inst = Instance::start_with(&flags);
        S3Store::at(inst, port)
    }

    /// `ndpipe serve` with the real model, S3 on a free port.
    pub(crate) fn start_with_model() -> Self {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let inst = Instance::start_with_model(&["--s3-listen", listen.as_str()]);
        S3Store::at(inst, port)
    }

    fn at(inst: Instance, port: u16) -> Self {
        S3Store {
            inst,
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Runs `aws` (unsigned: the store has no keys) with `args`; (success, stdout, stderr).
    pub(crate) fn aws(&self, args: &[&str]) -> (bool, String, String) {
        self.aws_at(&self.endpoint, args)
    }

    /// [`S3Store::aws`] with another endpoint URL for the same store.
    pub(crate) fn aws_at(&self, endpoint: &str, args: &[&str]) -> (bool, String, String) {
        unsigned_aws(endpoint, args)
    }

    /// Runs a boto3 `script` with `s3` bound to an unsigned path-style client of this store
    /// (see [`boto3_at`]); its stdout parsed as JSON. Panics when it fails.
    pub(crate) fn boto3(&self, script: &str) -> serde_json::Value {
        boto3_at(&[&self.endpoint], script)
            .unwrap_or_else(|e| panic!("{e}\nserver log:\n{}", self.inst.log()))
    }
}

/// Runs a boto3 `script` with `ENDPOINTS` the given endpoint URLs, `s3` an unsigned path-style
/// client of the first, `client(key, secret, endpoint=ENDPOINTS[0])` for a signed one, and
/// `json`, `sys` in scope; its stdout parsed as JSON, or what it printed when it failed.
pub(crate) fn boto3_at(endpoints: &[&str], script: &str) -> Result<serde_json::Value, String> {
    let prelude = "import json, sys, boto3, botocore\n\
                   from botocore.config import Config\n\
                   ENDPOINTS = sys.argv[1:]\n\
                   ENDPOINT = ENDPOINTS[0]\n\
                   def client(key=None, secret=None, endpoint=ENDPOINT):\n\
                   \x20   return boto3.client('s3', endpoint_url=endpoint, region_name='us-east-1',\n\
                   \x20       aws_access_key_id=key, aws_secret_access_key=secret,\n\
                   \x20       config=Config(signature_version='s3v4' if key else botocore.UNSIGNED,\n\
                   \x20       s3={'addressing_style': 'path'}, retries={'max_attempts': 1}))\n\
                   s3 = client()\n";
    let out = clean_env(Command::new("python3"))
        .arg("-c")
        .arg(format!("{prelude}{script}"))
        .args(endpoints)
        .output()
        .expect("running python3 (tools/setup.sh installs boto3)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "boto3 script failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_str(stdout.trim()).map_err(|e| format!("{e}: {stdout}"))
}

/// `cmd` without the user's AWS configuration, credentials or proxies.
/// Runs `aws` unsigned (no keys) against `endpoint` with `args`; (success, stdout, stderr).
pub(crate) fn unsigned_aws(endpoint: &str, args: &[&str]) -> (bool, String, String) {
    let out = clean_env(Command::new("aws"))
        .args(["--endpoint-url", endpoint, "--no-sign-request"])
        .args(args)
        .output()
        .expect("running aws (tools/setup.sh installs awscli)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn clean_env(mut cmd: Command) -> Command {
    cmd.env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_PROFILE")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY");
    cmd
}

/// Every file under `dir` as (path relative to it, sha256), sorted.
pub(crate) fn tree(dir: &Path) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = walkdir::WalkDir::new(dir)
        .into_iter()
        .map(Result::unwrap)
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let rel = e
                .path()
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (
                rel,
                crate::common::sha256(&std::fs::read(e.path()).unwrap()),
            )
        })
        .collect();
    out.sort();
    out
}

/// A photo folder: two real photos in an album with a `.xmp` sidecar each, and a `.json`.
pub(crate) fn photo_folder(dir: &Path) {
    let album = dir.join("album");
    std::fs::create_dir_all(&album).unwrap();
    for name in ["chelsea.png", "rocket.jpg"] {
        std::fs::write(album.join(name), crate::common::sample(name)).unwrap();
        let xmp = format!("<x:xmpmeta><rdf:Description about=\"{name}\"/></x:xmpmeta>");
        std::fs::write(album.join(format!("{name}.xmp")), xmp).unwrap();
    }
    std::fs::write(dir.join("index.json"), br#"{"albums": ["album"]}"#).unwrap();
}
