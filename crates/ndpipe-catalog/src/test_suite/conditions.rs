//! Conditional object writes: create-only and replace-only writes, refusals that change
//! nothing, and writers racing on one key, of whom exactly one wins.

use super::object;
use crate::{Bucket, Catalog, CatalogError, ObjectBody, ObjectRecord, PutCondition};

/// How many writers race for one key.
const RACERS: usize = 8;

/// Runs this part; cleans up after itself.
pub(super) fn run(c: &dyn Catalog) {
    create_only_and_replace_only_writes_change_nothing_when_refused(c);
    racing_writers_of_one_key_have_one_winner(&[c], "race");
}

/// Object `key` of bucket `cond` with its own ETag and blob `n`.
fn version(bucket: &str, key: &str, n: usize) -> ObjectRecord {
    let mut o = object(bucket, key, None);
    o.etag = format!("{n:032x}");
    o.body = ObjectBody::Blob(format!("blob-{key}-{n}"));
    o
}

fn create_only_and_replace_only_writes_change_nothing_when_refused(c: &dyn Catalog) {
    let (absent, any) = (
        PutCondition::Absent,
        PutCondition::Matches(vec!["*".into()]),
    );
    let matches =
        |etags: &[&str]| PutCondition::Matches(etags.iter().map(|e| e.to_string()).collect());
    assert!(matches!(
        c.put_object(&version("nope", "k", 1), &absent),
        Err(CatalogError::NotFound { what }) if what.starts_with("bucket ")
    ));
    c.create_bucket(&Bucket {
        name: "cond".into(),
        created_ms: 1,
    })
    .unwrap();
    let first = version("cond", "k", 1);
    assert_eq!(c.put_object(&first, &absent).unwrap(), None);
    let refused = [
        (version("cond", "k", 2), absent.clone()),
        (version("cond", "k", 3), matches(&[&"f".repeat(32)])),
        (version("cond", "k", 4), matches(&[])),
    ];
    for (o, condition) in &refused {
        assert!(
            matches!(
                c.put_object(o, condition),
                Err(CatalogError::PreconditionFailed { .. })
            ),
            "{condition:?}"
        );
        assert_eq!(c.object("cond", "k").unwrap().as_ref(), Some(&first));
    }
    for condition in [any.clone(), matches(&[&first.etag])] {
        assert!(
            matches!(
                c.put_object(&version("cond", "new", 5), &condition),
                Err(CatalogError::NotFound { what }) if what.starts_with("object ")
            ),
            "replace-only on a missing key: {condition:?}"
        );
        assert_eq!(c.object("cond", "new").unwrap(), None);
    }
    let second = version("cond", "k", 6);
    let replaced = c
        .put_object(&second, &matches(&["0", &first.etag]))
        .unwrap();
    assert_eq!(replaced, Some(first), "one of the listed ETags is enough");
    assert_eq!(
        c.put_object(&version("cond", "k", 7), &any).unwrap(),
        Some(second)
    );
    c.put_object(&version("cond", "k", 8), &PutCondition::Always)
        .unwrap();
    c.delete_object("cond", "k").unwrap();
    c.delete_bucket("cond").unwrap();
}

/// Eight writers create one key of `bucket` at once, create-only, through `handles` in
/// turn (handles of one catalog, e.g. two nodes of a cluster): exactly one wins and the object
/// is its version; then as many replace it at once, each if it still has the winner's ETag:
/// again exactly one wins. The others are refused with `PreconditionFailed`.
pub fn racing_writers_of_one_key_have_one_winner(handles: &[&dyn Catalog], bucket: &str) {
    handles[0]
        .create_bucket(&Bucket {
            name: bucket.into(),
            created_ms: 1,
        })
        .unwrap();
    let race = |condition: &PutCondition, first: usize| -> Vec<usize> {
        let outcomes: Vec<(usize, Result<_, CatalogError>)> = std::thread::scope(|s| {
            let runs: Vec<_> = (first..first + RACERS)
                .map(|n| {
                    let c = handles[n % handles.len()];
                    s.spawn(move || (n, c.put_object(&version(bucket, "k", n), condition)))
                })
                .collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        for (n, outcome) in &outcomes {
            assert!(
                matches!(
                    outcome,
                    Ok(_) | Err(CatalogError::PreconditionFailed { .. })
                ),
                "writer {n}: {outcome:?}"
            );
        }
        outcomes
            .into_iter()
            .filter_map(|(n, outcome)| outcome.is_ok().then_some(n))
            .collect()
    };
    let won = race(&PutCondition::Absent, 0);
    assert_eq!(won.len(), 1, "create-only winners: {won:?}");
    let current = handles[0].object(bucket, "k").unwrap().unwrap();
    assert_eq!(current, version(bucket, "k", won[0]));
    let won = race(&PutCondition::Matches(vec![current.etag]), RACERS);
    assert_eq!(won.len(), 1, "replace-if-unchanged winners: {won:?}");
    assert_eq!(
        handles[0].object(bucket, "k").unwrap(),
        Some(version(bucket, "k", won[0]))
    );
    handles[0].delete_object(bucket, "k").unwrap();
    handles[0].delete_bucket(bucket).unwrap();
}
