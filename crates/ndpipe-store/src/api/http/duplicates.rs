//! `GET /v1/duplicates?level=exact,near,semantic&limit=&after=`: groups of duplicate photos
//! (every node's on a shared catalog), each member with the strongest reason linking it to
//! another and the photo the group suggests keeping; paged by group id (its lowest photo id).
//! `GET /v1/photos/{id}/duplicates?level=`: the one group of a photo, found from the photo
//! outwards ([`crate::duplicates::component`]) instead of among every group.
//! The semantic level's pairs come from the front door's [`SemanticPairs`] source, when it has
//! one ([`crate::duplicates::semantic`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use ndpipe_catalog::{Catalog, PhotoId};
use serde::{Deserialize, Serialize};

use super::error::{ApiError, Counted, blocking, count, parse_id};
use super::{FrontState, page_limit};
use crate::duplicates::component::group_of;
use crate::duplicates::find::find;
use crate::duplicates::groups::{Group, Level};
use crate::duplicates::near_index::NearIndex;
use crate::duplicates::semantic::{SemanticPair, SemanticPairs};
use crate::duplicates::{DuplicateSettings, NearHash};

/// Groups in a page unless `limit` says otherwise.
const DEFAULT_GROUPS: usize = 100;

/// How a front door finds duplicates: its settings, where the semantic level's pairs come
/// from (`None`: nowhere yet, and `level=semantic` is refused), and the near pairs it keeps
/// between requests.
#[derive(Clone, Default)]
pub(super) struct Finding {
    /// The levels' settings.
    pub(super) settings: DuplicateSettings,
    /// The source of semantic pairs.
    pub(super) semantic: Option<Arc<dyn SemanticPairs>>,
    /// The near pairs of the hashes at the last request.
    pub(super) near: Arc<NearIndex>,
}

impl Finding {
    /// Finding with `settings` and `semantic`, no near pairs kept yet.
    pub(super) fn new(
        settings: DuplicateSettings,
        semantic: Option<Arc<dyn SemanticPairs>>,
    ) -> Self {
        Finding {
            settings,
            semantic,
            near: Arc::default(),
        }
    }
}

/// Query parameters.
#[derive(Debug, Deserialize)]
pub(crate) struct DuplicateParams {
    /// Comma-separated levels (default `exact,near`, and `semantic` with a source of pairs).
    level: Option<String>,
    /// Groups per page.
    limit: Option<usize>,
    /// The last group id of the previous page.
    after: Option<u64>,
}

/// One page of groups.
#[derive(Debug, Serialize)]
pub(crate) struct DuplicatesReply {
    /// The levels searched.
    levels: Vec<Level>,
    /// The perceptual hash of the near level.
    near_hash: NearHash,
    /// Its Hamming threshold.
    near_hamming: u32,
    /// The smallest width and height of a photo it pairs.
    near_min_side: u32,
    /// Photos without a perceptual hash yet, which the near level does not see until the
    /// hashing worker reaches them (absent without the near level).
    #[serde(skip_serializing_if = "Option::is_none")]
    unhashed: Option<u64>,
    /// The groups of this page.
    groups: Vec<Group>,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_after: Option<u64>,
}

/// `GET /v1/duplicates`, on every front door.
pub(crate) async fn list(
    State(state): State<FrontState>,
    query: Result<Query<DuplicateParams>, QueryRejection>,
) -> Result<Json<DuplicatesReply>, ApiError> {
    let (catalog, finding) = (state.catalog.clone(), state.duplicates.clone());
    answer(&state, catalog, finding, query).await
}

/// The page of groups that `query` asks for, from `catalog` as `finding` says.
async fn answer(
    state: &impl Counted,
    catalog: Arc<dyn Catalog>,
    finding: Finding,
    query: Result<Query<DuplicateParams>, QueryRejection>,
) -> Result<Json<DuplicatesReply>, ApiError> {
    let Query(params) =
        query.map_err(|e| count(state, ApiError::bad_request("bad_query", e.body_text())))?;
    let levels = levels(params.level.as_deref()).map_err(|e| count(state, e))?;
    let limit = page_limit(params.limit, DEFAULT_GROUPS).map_err(|e| count(state, e))?;
    let settings = finding.settings;
    let semantic = semantic_pairs(&finding, &levels)
        .await
        .map_err(|e| count(state, e))?;
    let (asked, near) = (levels.clone(), finding.near.clone());
    let found = blocking(state, move || {
        find(&*catalog, &settings, &asked, &semantic, Some(&near))
    })
    .await?;
    let mut groups: Vec<Group> = found
        .groups
        .into_iter()
        .filter(|g| params.after.is_none_or(|after| g.id > after))
        .take(limit + 1)
        .collect();
    let next_after = (groups.len() > limit).then(|| groups[limit - 1].id);
    groups.truncate(limit);
    Ok(Json(DuplicatesReply {
        levels: levels.into_iter().collect(),
        near_hash: settings.near_hash,
        near_hamming: settings.near_hamming,
        near_min_side: settings.near_min_side,
        unhashed: found.unhashed,
        groups,
        next_after,
    }))
}

/// Query parameters of one photo's group.
#[derive(Debug, Deserialize)]
pub(crate) struct GroupParams {
    /// Comma-separated levels, as for `GET /v1/duplicates`.
    level: Option<String>,
}

/// One photo's group.
#[derive(Debug, Serialize)]
pub(crate) struct PhotoGroupReply {
    /// The photo.
    photo: PhotoId,
    /// The levels searched.
    levels: Vec<Level>,
    /// The perceptual hash of the near level.
    near_hash: NearHash,
    /// Its Hamming threshold.
    near_hamming: u32,
    /// The smallest width and height of a photo it pairs.
    near_min_side: u32,
    /// The group the photo is in, as `GET /v1/duplicates` lists it; `null` when none.
    group: Option<Group>,
}

/// `GET /v1/photos/{id}/duplicates`, on every front door: 404 for an unknown photo.
pub(crate) async fn photo_group(
    State(state): State<FrontState>,
    Path(raw): Path<String>,
    query: Result<Query<GroupParams>, QueryRejection>,
) -> Result<Json<PhotoGroupReply>, ApiError> {
    let id = parse_id(&raw).map_err(|e| count(&state, e))?;
    let Query(params) =
        query.map_err(|e| count(&state, ApiError::bad_request("bad_query", e.body_text())))?;
    let levels = levels(params.level.as_deref()).map_err(|e| count(&state, e))?;
    let finding = state.duplicates.clone();
    let settings = finding.settings;
    let semantic = semantic_pairs(&finding, &levels)
        .await
        .map_err(|e| count(&state, e))?;
    let (catalog, asked) = (state.catalog.clone(), levels.clone());
    let group = blocking(&state, move || {
        group_of(&*catalog, &settings, &asked, &semantic, id)
    })
    .await?;
    Ok(Json(PhotoGroupReply {
        photo: id,
        levels: levels.into_iter().collect(),
        near_hash: settings.near_hash,
        near_hamming: settings.near_hamming,
        near_min_side: settings.near_min_side,
        group,
    }))
}

/// The levels of `level=` (default exact and near).
fn levels(raw: Option<&str>) -> Result<BTreeSet<Level>, ApiError> {
    let Some(raw) = raw else {
        return Ok(BTreeSet::from([Level::Exact, Level::Near]));
    };
    raw.split(',')
        .map(|l| l.trim().parse::<Level>())
        .collect::<Result<BTreeSet<_>, _>>()
        .map_err(|e| ApiError::bad_request("bad_query", e))
}

/// The semantic pairs at the configured threshold when `levels` asks for them (none
/// otherwise). Without a source the level is refused, not left out: 400
/// `level_unavailable`; a source that fails is 503 `semantic_unavailable`.
async fn semantic_pairs(
    finding: &Finding,
    levels: &BTreeSet<Level>,
) -> Result<Vec<SemanticPair>, ApiError> {
    if !levels.contains(&Level::Semantic) {
        return Ok(Vec::new());
    }
    let Some(source) = &finding.semantic else {
        return Err(ApiError::bad_request(
            "level_unavailable",
            "the semantic level takes its pairs from a feature index, which this server does not have",
        ));
    };
    source
        .pairs(finding.settings.semantic_min_cosine)
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "semantic_unavailable",
                e.to_string(),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::duplicates::semantic::SemanticUnavailable;

    /// A source that answers `pairs` (or fails with no pairs), and says the threshold asked.
    struct Fixed(Option<Vec<SemanticPair>>);

    #[async_trait::async_trait]
    impl SemanticPairs for Fixed {
        async fn pairs(&self, min_cosine: f64) -> Result<Vec<SemanticPair>, SemanticUnavailable> {
            assert_eq!(min_cosine, 0.8, "the configured threshold is asked for");
            self.0.clone().ok_or_else(|| SemanticUnavailable {
                reason: "the index is building".into(),
            })
        }
    }

    fn finding(semantic: Option<Fixed>) -> Finding {
        Finding::new(
            DuplicateSettings {
                semantic_min_cosine: 0.8,
                ..DuplicateSettings::default()
            },
            semantic.map(|s| Arc::new(s) as Arc<dyn SemanticPairs>),
        )
    }

    #[test]
    fn levels_default_to_exact_and_near_and_refuse_unknown_ones() {
        assert_eq!(
            levels(None).unwrap(),
            BTreeSet::from([Level::Exact, Level::Near])
        );
        assert_eq!(levels(Some("near")).unwrap(), BTreeSet::from([Level::Near]));
        assert_eq!(
            levels(Some("exact, semantic")).unwrap(),
            BTreeSet::from([Level::Exact, Level::Semantic])
        );
        assert_eq!(levels(Some("similar")).unwrap_err().kind, "bad_query");
    }

    #[tokio::test]
    async fn semantic_pairs_come_from_the_source_and_without_one_the_level_is_refused() {
        let semantic = BTreeSet::from([Level::Semantic]);
        let pair = SemanticPair {
            a: 1,
            b: 2,
            cosine: 0.9,
        };
        let source = finding(Some(Fixed(Some(vec![pair]))));
        assert_eq!(semantic_pairs(&source, &semantic).await.unwrap(), [pair]);
        let not_asked = BTreeSet::from([Level::Exact]);
        assert!(
            semantic_pairs(&source, &not_asked)
                .await
                .unwrap()
                .is_empty()
        );
        let none = semantic_pairs(&finding(None), &semantic).await.unwrap_err();
        assert_eq!(
            (none.status, none.kind),
            (StatusCode::BAD_REQUEST, "level_unavailable")
        );
        let failing = finding(Some(Fixed(None)));
        let failed = semantic_pairs(&failing, &semantic).await.unwrap_err();
        assert_eq!(
            (failed.status, failed.kind),
            (StatusCode::SERVICE_UNAVAILABLE, "semantic_unavailable")
        );
    }
}
