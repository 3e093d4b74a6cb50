//! Checksums S3 clients give and ask for: the algorithm of an upload (CRC32, CRC32C,
//! CRC64NVME, SHA1, SHA256), the checksum an object keeps (of its bytes, or for a composite
//! multipart one of its parts' checksums with `-N`), and their place in S3's answers.

use ndpipe_catalog::ObjectChecksum;
use s3s::crypto::{Checksum as _, Crc32, Crc32c, Crc64Nvme, Sha1, Sha256};
use s3s::dto::{Checksum, ChecksumAlgorithm, ChecksumType};
use s3s::{S3Result, s3_error};

/// A checksum algorithm of S3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algorithm {
    Crc32,
    Crc32c,
    Crc64Nvme,
    Sha1,
    Sha256,
}

impl Algorithm {
    /// Every algorithm, in the order a value sent with several is picked.
    const ALL: [Algorithm; 5] = [
        Algorithm::Crc32,
        Algorithm::Crc32c,
        Algorithm::Crc64Nvme,
        Algorithm::Sha1,
        Algorithm::Sha256,
    ];

    /// S3's name of it (`CRC32`, ...).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Algorithm::Crc32 => ChecksumAlgorithm::CRC32,
            Algorithm::Crc32c => ChecksumAlgorithm::CRC32C,
            Algorithm::Crc64Nvme => ChecksumAlgorithm::CRC64NVME,
            Algorithm::Sha1 => ChecksumAlgorithm::SHA1,
            Algorithm::Sha256 => ChecksumAlgorithm::SHA256,
        }
    }

    /// The algorithm S3 names `name` (any case); `InvalidRequest` for another.
    pub(crate) fn parse(name: &str) -> S3Result<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                s3_error!(
                    InvalidRequest,
                    "checksum algorithm {name:?} is not supported"
                )
            })
    }

    /// The digest of `bytes`.
    pub(crate) fn digest(self, bytes: &[u8]) -> Vec<u8> {
        match self {
            Algorithm::Crc32 => Crc32::checksum(bytes).to_vec(),
            Algorithm::Crc32c => Crc32c::checksum(bytes).to_vec(),
            Algorithm::Crc64Nvme => Crc64Nvme::checksum(bytes).to_vec(),
            Algorithm::Sha1 => Sha1::checksum(bytes).as_ref().to_vec(),
            Algorithm::Sha256 => Sha256::checksum(bytes).as_ref().to_vec(),
        }
    }

    /// The base64 digest of `bytes`, as S3 writes checksums.
    pub(crate) fn base64(self, bytes: &[u8]) -> String {
        base64_simd::STANDARD.encode_to_string(self.digest(bytes))
    }

    /// Whether a multipart object's checksum can be of its whole bytes (the CRCs); the
    /// others are composite only, as on AWS.
    fn full_object_allowed(self) -> bool {
        !matches!(self, Algorithm::Sha1 | Algorithm::Sha256)
    }

    /// Its value in `c`, if any.
    pub(crate) fn value_in(self, c: &Checksum) -> Option<&String> {
        match self {
            Algorithm::Crc32 => c.checksum_crc32.as_ref(),
            Algorithm::Crc32c => c.checksum_crc32c.as_ref(),
            Algorithm::Crc64Nvme => c.checksum_crc64nvme.as_ref(),
            Algorithm::Sha1 => c.checksum_sha1.as_ref(),
            Algorithm::Sha256 => c.checksum_sha256.as_ref(),
        }
    }

    /// A [`Checksum`] with `value` as its value of this algorithm, and nothing else.
    pub(crate) fn dto(self, value: String) -> Checksum {
        let mut c = Checksum::default();
        let field = match self {
            Algorithm::Crc32 => &mut c.checksum_crc32,
            Algorithm::Crc32c => &mut c.checksum_crc32c,
            Algorithm::Crc64Nvme => &mut c.checksum_crc64nvme,
            Algorithm::Sha1 => &mut c.checksum_sha1,
            Algorithm::Sha256 => &mut c.checksum_sha256,
        };
        *field = Some(value);
        c
    }
}

/// Sets the five `checksum_*` fields of an S3 output (or part) from a [`Checksum`].
macro_rules! set_checksum {
    ($out:expr, $checksum:expr) => {{
        let c: s3s::dto::Checksum = $checksum;
        $out.checksum_crc32 = c.checksum_crc32;
        $out.checksum_crc32c = c.checksum_crc32c;
        $out.checksum_crc64nvme = c.checksum_crc64nvme;
        $out.checksum_sha1 = c.checksum_sha1;
        $out.checksum_sha256 = c.checksum_sha256;
    }};
}
pub(crate) use set_checksum;

/// The first checksum `sent` has (verified against the body already), as (algorithm, value).
pub(crate) fn sent(sent: &Checksum) -> Option<(Algorithm, String)> {
    Algorithm::ALL
        .into_iter()
        .find_map(|a| Some((a, a.value_in(sent)?.trim().to_string())))
}

/// The checksum a single-part upload keeps: the one the client sent, else one of the
/// algorithm it asked for (`x-amz-sdk-checksum-algorithm`) computed here, else none.
pub(crate) fn of_upload(
    given: &Checksum,
    asked: Option<&ChecksumAlgorithm>,
    bytes: &[u8],
) -> S3Result<Option<ObjectChecksum>> {
    let (algorithm, value) = match (sent(given), asked) {
        (Some(found), _) => found,
        (None, Some(asked)) => {
            let a = Algorithm::parse(asked.as_str())?;
            (a, a.base64(bytes))
        }
        (None, None) => return Ok(None),
    };
    Ok(Some(ObjectChecksum {
        algorithm: algorithm.name().to_string(),
        value,
        composite: false,
    }))
}

/// The checksum kind of a multipart upload: its algorithm and whether it is composite, from
/// `CreateMultipartUpload`'s `x-amz-checksum-algorithm` and `x-amz-checksum-type`.
/// `InvalidRequest` for a type without an algorithm or one AWS refuses for the algorithm
/// (a full-object SHA, a composite CRC64NVME).
pub(crate) fn of_multipart(
    algorithm: Option<&ChecksumAlgorithm>,
    kind: Option<&ChecksumType>,
) -> S3Result<Option<(Algorithm, bool)>> {
    let Some(algorithm) = algorithm else {
        return match kind {
            None => Ok(None),
            Some(_) => Err(s3_error!(
                InvalidRequest,
                "x-amz-checksum-type needs x-amz-checksum-algorithm"
            )),
        };
    };
    let a = Algorithm::parse(algorithm.as_str())?;
    let composite = match kind.map(ChecksumType::as_str) {
        None => a != Algorithm::Crc64Nvme,
        Some(ChecksumType::COMPOSITE) if a != Algorithm::Crc64Nvme => true,
        Some(ChecksumType::FULL_OBJECT) if a.full_object_allowed() => false,
        Some(other) => {
            return Err(s3_error!(
                InvalidRequest,
                "the {other} checksum type is not supported for {}",
                a.name()
            ));
        }
    };
    Ok(Some((a, composite)))
}

/// The composite checksum of parts whose digests are `digests`: the digest of their
/// concatenation, then `-` and the number of parts.
pub(crate) fn composite(algorithm: Algorithm, digests: &[Vec<u8>]) -> String {
    format!("{}-{}", algorithm.base64(&digests.concat()), digests.len())
}

/// The algorithm S3 names `checksum.algorithm` (a stored name is always one).
pub(crate) fn algorithm_of(checksum: &ObjectChecksum) -> Option<Algorithm> {
    Algorithm::parse(&checksum.algorithm).ok()
}

/// S3's type of a stored checksum.
pub(crate) fn kind(checksum: &ObjectChecksum) -> ChecksumType {
    ChecksumType::from_static(if checksum.composite {
        ChecksumType::COMPOSITE
    } else {
        ChecksumType::FULL_OBJECT
    })
}

/// A stored checksum as S3 answers it (value and type), or an empty one.
pub(crate) fn answer(checksum: Option<&ObjectChecksum>) -> Checksum {
    let Some(c) = checksum else {
        return Checksum::default();
    };
    let Some(a) = algorithm_of(c) else {
        return Checksum::default();
    };
    Checksum {
        checksum_type: Some(kind(c)),
        ..a.dto(c.value.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_are_as_aws_computes_them() {
        // The values S3's own tests use for 1024 times `A` and for parts of 5 MiB of `A`,
        // `B` and `C` (ceph/s3-tests, test_multipart_use_cksum_helper_*).
        let a = vec![b'A'; 1024];
        assert_eq!(
            Algorithm::Sha256.base64(&a),
            "arcu6553sHVAiX4MjW0j7I7vD4w6R+Gz9Ok0Q9lTa+0="
        );
        assert_eq!(Algorithm::Crc64Nvme.base64(&a), "Qeh8oXvGiSo=");
        let parts: Vec<Vec<u8>> = [b'A', b'B', b'C']
            .into_iter()
            .map(|c| vec![c; 5 << 20])
            .collect();
        let digests: Vec<Vec<u8>> = parts.iter().map(|p| Algorithm::Sha1.digest(p)).collect();
        assert_eq!(
            composite(Algorithm::Sha1, &digests),
            "sizjvY4eud3MrcHdZM3cQ/ol39o=-3"
        );
        assert_eq!(Algorithm::Crc32.base64(&parts.concat()), "WgDhBQ==");
    }

    #[test]
    fn a_multipart_upload_gets_the_checksum_types_aws_allows() {
        let alg = |s: &'static str| Some(ChecksumAlgorithm::from_static(s));
        let kind = |s: &'static str| Some(ChecksumType::from_static(s));
        assert_eq!(of_multipart(None, None).unwrap(), None);
        assert_eq!(
            of_multipart(alg("crc32").as_ref(), None).unwrap(),
            Some((Algorithm::Crc32, true))
        );
        assert_eq!(
            of_multipart(alg("CRC64NVME").as_ref(), None).unwrap(),
            Some((Algorithm::Crc64Nvme, false))
        );
        assert_eq!(
            of_multipart(alg("CRC32C").as_ref(), kind("FULL_OBJECT").as_ref()).unwrap(),
            Some((Algorithm::Crc32c, false))
        );
        for (a, k) in [
            (alg("SHA256"), kind("FULL_OBJECT")),
            (alg("CRC64NVME"), kind("COMPOSITE")),
            (None, kind("COMPOSITE")),
            (alg("MD5"), None),
        ] {
            let refused = of_multipart(a.as_ref(), k.as_ref()).unwrap_err();
            assert_eq!(refused.code(), &s3s::S3ErrorCode::InvalidRequest);
        }
    }
}
