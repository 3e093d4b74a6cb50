//! `GET /v1/duplicates?level=exact,near&limit=&after=`: groups of duplicate photos (every
//! node's on a shared catalog), each member with the strongest reason linking it to another
//! and the photo the group suggests keeping; paged by group id (its lowest photo id).

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use ndpipe_catalog::Catalog;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, Counted, blocking, count};
use super::{AppState, page_limit};
use crate::duplicates::find::find;
use crate::duplicates::groups::{Group, Level};
use crate::duplicates::{DuplicateSettings, NearHash};

/// Groups in a page unless `limit` says otherwise.
const DEFAULT_GROUPS: usize = 100;

/// Query parameters.
#[derive(Debug, Deserialize)]
pub(super) struct DuplicateParams {
    /// Comma-separated levels (default `exact,near`).
    level: Option<String>,
    /// Groups per page.
    limit: Option<usize>,
    /// The last group id of the previous page.
    after: Option<u64>,
}

/// One page of groups.
#[derive(Debug, Serialize)]
pub(super) struct DuplicatesReply {
    /// The levels searched.
    levels: Vec<Level>,
    /// The perceptual hash of the near level.
    near_hash: NearHash,
    /// Its Hamming threshold.
    near_hamming: u32,
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

/// `GET /v1/duplicates` on a PipeStore.
pub(super) async fn list(
    State(state): State<AppState>,
    query: Result<Query<DuplicateParams>, QueryRejection>,
) -> Result<Json<DuplicatesReply>, ApiError> {
    let (catalog, settings) = (state.catalog.clone(), state.duplicates);
    answer(&state, catalog, settings, query).await
}

/// The page of groups that `query` asks for, from `catalog` with `settings`.
pub(super) async fn answer(
    state: &impl Counted,
    catalog: Arc<dyn Catalog>,
    settings: DuplicateSettings,
    query: Result<Query<DuplicateParams>, QueryRejection>,
) -> Result<Json<DuplicatesReply>, ApiError> {
    let Query(params) = query.map_err(|e| count(state, ApiError::bad_request("bad_query", e.body_text())))?;
    let levels = levels(params.level.as_deref()).map_err(|e| count(state, e))?;
    let limit = page_limit(params.limit, DEFAULT_GROUPS).map_err(|e| count(state, e))?;
    let asked = levels.clone();
    let found = blocking(state, move || find(&*catalog, &settings, &asked, &[])).await?;
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
        unhashed: found.unhashed,
        groups,
        next_after,
    }))
}

/// The levels of `level=` (default exact and near). The semantic level needs pairs from a
/// feature index, which this API does not have yet: asked for, it is refused, not left out.
fn levels(raw: Option<&str>) -> Result<BTreeSet<Level>, ApiError> {
    let Some(raw) = raw else {
        return Ok(BTreeSet::from([Level::Exact, Level::Near]));
    };
    let levels = raw
        .split(',')
        .map(|l| l.trim().parse::<Level>())
        .collect::<Result<BTreeSet<_>, _>>()
        .map_err(|e| ApiError::bad_request("bad_query", e))?;
    if levels.contains(&Level::Semantic) {
        return Err(ApiError::bad_request(
            "level_unavailable",
            "the semantic level needs the feature index's pairs, which this API does not serve yet",
        ));
    }
    Ok(levels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_default_to_exact_and_near_and_refuse_what_they_cannot_answer() {
        assert_eq!(
            levels(None).unwrap(),
            BTreeSet::from([Level::Exact, Level::Near])
        );
        assert_eq!(levels(Some("near")).unwrap(), BTreeSet::from([Level::Near]));
        assert_eq!(levels(Some("similar")).unwrap_err().kind, "bad_query");
        assert_eq!(
            levels(Some("exact,semantic")).unwrap_err().kind,
            "level_unavailable"
        );
    }
}
