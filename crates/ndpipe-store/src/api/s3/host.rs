//! Virtual-host-style requests: a `Host` of `BUCKET.DOMAIN[:PORT]` names the bucket; any other
//! host (`DOMAIN` itself, an IP address, another name) is path-style (`/BUCKET/KEY`). The port
//! is ignored (s3s's own `SingleDomain` would take `localhost:9000` for a bucket name).

use s3s::S3Result;
use s3s::host::{S3Host, VirtualHost};

/// The domain whose subdomains are buckets.
pub(crate) struct BucketDomain {
    domain: String,
}

impl BucketDomain {
    pub(crate) fn new(domain: &str) -> Self {
        BucketDomain {
            domain: domain.trim_end_matches('.').to_ascii_lowercase(),
        }
    }
}

/// `host` without a trailing `:PORT`.
fn without_port(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

impl S3Host for BucketDomain {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> S3Result<VirtualHost<'a>> {
        let name = without_port(host);
        let bucket = name
            .len()
            .checked_sub(self.domain.len() + 1)
            .filter(|&at| {
                name.is_char_boundary(at)
                    && name[at..].eq_ignore_ascii_case(&format!(".{}", self.domain))
            })
            .map(|at| &name[..at])
            .filter(|b| !b.is_empty());
        Ok(match bucket {
            Some(bucket) => VirtualHost::new(self.domain.as_str()).with_bucket(bucket),
            None => VirtualHost::new(name),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdomains_are_buckets_and_every_other_host_is_path_style() {
        let hosts = BucketDomain::new("localhost");
        let bucket = |h: &'static str| {
            hosts
                .parse_host_header(h)
                .unwrap()
                .bucket()
                .map(str::to_string)
        };
        assert_eq!(bucket("photos.localhost:9000"), Some("photos".into()));
        assert_eq!(bucket("photos.LOCALHOST"), Some("photos".into()));
        assert_eq!(bucket("localhost:9000"), None);
        assert_eq!(bucket("localhost"), None);
        assert_eq!(bucket("s3.example.com:9000"), None);
        assert_eq!(bucket(".localhost"), None);
        assert_eq!(bucket("é.localhost"), Some("é".into()));
    }
}
