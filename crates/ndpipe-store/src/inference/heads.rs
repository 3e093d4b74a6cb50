//! Committed head files, in the one head format: `DATA/heads/<stem>.safetensors`
//! ([`HeadFile`] with its [`HeadVersion`]), where `<stem>` is
//! [`file_stem`] of the version id; and heads staged for a deploy but not committed yet, in
//! `DATA/heads/staged/<stem>.safetensors`, written durably before the stage is acknowledged so
//! that a node restarting between stage and commit can still commit.
//!
//! Builds before the single format wrote `<stem>.head`: the prost-encoded
//! `pb::StageHeadRequest` the head was staged with. Those files are still read (at start for
//! the active version, and when a version that is not staged is committed); the next commit of
//! such a version writes it in the new format.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ndpipe_catalog::TaskName;
use ndpipe_model::{HeadFile, HeadVersion, HeadWeights};
use ndpipe_proto::pb;
use ndpipe_util::fs::file_stem;

use super::InferenceError;

/// The file that names, per task, the version served before the active one (JSON; a build of
/// before tasks wrote the default task's version alone, as text).
const PREVIOUS: &str = "previous-version";

/// The directory of committed (and staged) heads.
pub(crate) struct HeadDir {
    dir: PathBuf,
}

impl HeadDir {
    /// The heads kept in `dir`, which is created (with `staged/`) if absent.
    pub(crate) fn open(dir: PathBuf) -> Result<Self, InferenceError> {
        let staged = dir.join("staged");
        std::fs::create_dir_all(&staged).map_err(|source| InferenceError::HeadsDir {
            path: staged,
            source,
        })?;
        Ok(HeadDir { dir })
    }

    fn path(&self, version: &str) -> PathBuf {
        self.dir.join(format!("{}.safetensors", file_stem(version)))
    }

    fn staged_path(&self, version: &str) -> PathBuf {
        self.dir
            .join("staged")
            .join(format!("{}.safetensors", file_stem(version)))
    }

    /// Writes a staged head durably, labelled with its version, then drops every other staged
    /// head of its task and backbone: one deploy runs at a time, so they are left from deploys
    /// that never committed here (the Tuner stages again whatever a node still needs). A
    /// rollout stages a head per task, for its new backbone, beside them.
    pub(crate) fn write_staged(
        &self,
        head: &HeadWeights,
        version: &HeadVersion,
    ) -> Result<(), InferenceError> {
        let path = self.staged_path(&version.id);
        HeadFile::from_linear(head, Some(version.clone())).write(&path)?;
        let staged = self.dir.join("staged");
        let others = std::fs::read_dir(&staged)
            .map_err(|source| InferenceError::HeadsDir {
                path: staged.clone(),
                source,
            })?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| *p != path);
        for other in others {
            let same_task = HeadFile::read(&other)
                .ok()
                .and_then(|f| f.version)
                .is_none_or(|v| v.task == version.task && v.backbone == version.backbone);
            if !same_task {
                continue;
            }
            if let Err(e) = std::fs::remove_file(&other) {
                tracing::warn!(path = %other.display(), error = %e, "could not drop a stale staged head");
            }
        }
        Ok(())
    }

    /// The staged head of `version` and the version recorded with it, if one is staged.
    pub(crate) fn read_staged(
        &self,
        version: &str,
    ) -> Result<Option<(HeadWeights, Option<HeadVersion>)>, InferenceError> {
        let path = self.staged_path(version);
        if !path.exists() {
            return Ok(None);
        }
        let file = HeadFile::read(&path)?;
        Ok(Some((file.to_linear()?, file.version)))
    }

    /// Records (durably) each task's version that served before its active one, so that churn
    /// after a restart is still measured against it.
    pub(crate) fn write_previous(
        &self,
        previous: &BTreeMap<String, String>,
    ) -> Result<(), InferenceError> {
        let path = self.dir.join(PREVIOUS);
        let json = serde_json::to_vec(previous).map_err(|e| InferenceError::HeadsDir {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        ndpipe_util::fs::write_durably(&path, &json)
            .map_err(|source| InferenceError::HeadsDir { path, source })
    }

    /// What [`HeadDir::write_previous`] recorded last (empty before anything was).
    pub(crate) fn read_previous(&self) -> Result<BTreeMap<String, String>, InferenceError> {
        let path = self.dir.join(PREVIOUS);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(source) => return Err(InferenceError::HeadsDir { path, source }),
        };
        let text = text.trim();
        if text.starts_with('{') {
            return serde_json::from_str(text).map_err(|e| InferenceError::HeadsDir {
                path,
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            });
        }
        Ok(Some(text)
            .filter(|v| !v.is_empty())
            .map(|v| (TaskName::DEFAULT.to_string(), v.to_string()))
            .into_iter()
            .collect())
    }

    /// Drops the staged head of `version`; returns whether there was one.
    pub(crate) fn remove_staged(&self, version: &str) -> Result<bool, InferenceError> {
        let path = self.staged_path(version);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(InferenceError::HeadsDir { path, source }),
        }
    }

    fn legacy_path(&self, version: &str) -> PathBuf {
        self.dir.join(format!("{}.head", file_stem(version)))
    }

    /// Writes the head of `version` durably (a crash leaves the old file or the new one).
    pub(crate) fn write(
        &self,
        head: &HeadWeights,
        version: &HeadVersion,
    ) -> Result<(), InferenceError> {
        HeadFile::from_linear(head, Some(version.clone())).write(&self.path(&version.id))?;
        Ok(())
    }

    /// The committed head of `version` and the version recorded with it, if this node has one:
    /// the head file, else an old-format `.head` file.
    pub(crate) fn read(
        &self,
        version: &str,
    ) -> Result<Option<(HeadWeights, Option<HeadVersion>)>, InferenceError> {
        let path = self.path(version);
        if path.exists() {
            let file = HeadFile::read(&path)?;
            return Ok(Some((file.to_linear()?, file.version)));
        }
        let legacy = self.legacy_path(version);
        if legacy.exists() {
            let (head, version) = read_legacy(&legacy)?;
            return Ok(Some((head, Some(version))));
        }
        Ok(None)
    }
}

/// The model version a staged head says it belongs to.
pub(crate) fn version_of(request: &pb::StageHeadRequest) -> HeadVersion {
    HeadVersion {
        id: request.version.clone(),
        task: Some(request.task.clone())
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| TaskName::DEFAULT.to_string()),
        backbone: request.backbone_version.clone(),
        parent: Some(request.parent.clone()).filter(|p| !p.is_empty()),
        metrics: serde_json::from_str(&request.metrics_json).unwrap_or(serde_json::Value::Null),
    }
}

/// Reads an old-format head file: a prost-encoded `StageHeadRequest`.
fn read_legacy(path: &Path) -> Result<(HeadWeights, HeadVersion), InferenceError> {
    let legacy = |source: Box<dyn std::error::Error + Send + Sync>| InferenceError::LegacyHead {
        path: path.to_path_buf(),
        source,
    };
    let bytes = std::fs::read(path).map_err(|e| legacy(e.into()))?;
    let request: pb::StageHeadRequest =
        prost::Message::decode(&bytes[..]).map_err(|e| legacy(Box::new(e)))?;
    let head = ndpipe_proto::head_from_request(&request).map_err(|e| legacy(e.into()))?;
    Ok((head, version_of(&request)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> HeadWeights {
        HeadWeights::new(
            vec!["cat".into(), "cup".into()],
            3,
            vec![1.0, 0.0, 0.5, 0.0, 1.0, -0.5],
            vec![0.25, -0.25],
        )
        .unwrap()
    }

    #[test]
    fn heads_round_trip_with_their_version() {
        let dir = tempfile::tempdir().unwrap();
        let heads = HeadDir::open(dir.path().join("heads")).unwrap();
        assert!(heads.read("ft-1-abc").unwrap().is_none());
        let version = HeadVersion {
            id: "ft-1-abc".into(),
            task: "default".into(),
            backbone: "b".repeat(64),
            parent: Some("pretrained".into()),
            metrics: serde_json::json!({"val_top1": 0.9}),
        };
        heads.write(&head(), &version).unwrap();
        assert!(dir.path().join("heads/ft-1-abc.safetensors").exists());
        let (back, meta) = heads.read("ft-1-abc").unwrap().unwrap();
        assert_eq!(back, head());
        assert_eq!(meta, Some(version.clone()));

        assert!(heads.read_staged("ft-1-abc").unwrap().is_none());
        heads.write_staged(&head(), &version).unwrap();
        assert!(
            dir.path()
                .join("heads/staged/ft-1-abc.safetensors")
                .exists()
        );
        let reopened = HeadDir::open(dir.path().join("heads")).unwrap();
        let (back, meta) = reopened.read_staged("ft-1-abc").unwrap().unwrap();
        assert_eq!((back, meta), (head(), Some(version.clone())));
        let next = HeadVersion {
            id: "ft-2-abc".into(),
            ..version.clone()
        };
        reopened.write_staged(&head(), &next).unwrap();
        assert!(
            reopened.read_staged("ft-1-abc").unwrap().is_none(),
            "a newer stage drops the stale one"
        );
        assert!(reopened.remove_staged("ft-2-abc").unwrap());
        assert!(!reopened.remove_staged("ft-2-abc").unwrap());
        assert!(reopened.read_staged("ft-1-abc").unwrap().is_none());
    }

    #[test]
    fn old_format_head_files_still_load() {
        let dir = tempfile::tempdir().unwrap();
        let heads = HeadDir::open(dir.path().to_path_buf()).unwrap();
        let mut request = pb::StageHeadRequest {
            version: "ft-2-def".into(),
            backbone_version: "b".repeat(64),
            parent: "ft-1-abc".into(),
            metrics_json: r#"{"val_top1":0.8}"#.into(),
            ..Default::default()
        };
        ndpipe_proto::put_head(&mut request, &head());
        std::fs::write(
            dir.path().join("ft-2-def.head"),
            prost::Message::encode_to_vec(&request),
        )
        .unwrap();
        let (back, meta) = heads.read("ft-2-def").unwrap().unwrap();
        assert_eq!(back, head());
        let meta = meta.unwrap();
        assert_eq!(meta.parent.as_deref(), Some("ft-1-abc"));
        assert_eq!(meta.metrics["val_top1"], 0.8);

        std::fs::write(dir.path().join("broken.head"), b"\xff\xff not protobuf").unwrap();
        assert!(matches!(
            heads.read("broken"),
            Err(InferenceError::LegacyHead { .. })
        ));
    }
}
