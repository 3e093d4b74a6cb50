//! What an object carries besides its bytes: its attributes round-trip, and its user tags
//! change alone.

use std::collections::BTreeMap;

use super::object;
use crate::{
    Bucket, Catalog, ObjectAttributes, ObjectChecksum, ObjectPart, PutCondition, StandardHeaders,
};

/// Runs this part on a catalog the rest of the suite has used; cleans up after itself.
pub(super) fn run(c: &dyn Catalog) {
    attributes_and_tags_round_trip(c);
    tags_change_alone(c);
    for key in ["a.json", "b.json"] {
        c.delete_object("attrs", key).unwrap();
    }
    c.delete_bucket("attrs").unwrap();
}

fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn attributes() -> ObjectAttributes {
    ObjectAttributes {
        headers: StandardHeaders {
            cache_control: Some("max-age=60".into()),
            content_encoding: Some("gzip".into()),
            expires: Some("Thu, 01 Dec 2044 16:00:00 GMT".into()),
            ..StandardHeaders::default()
        },
        checksum: Some(ObjectChecksum {
            algorithm: "CRC32".into(),
            value: "AAAAAA==-2".into(),
            composite: true,
        }),
        parts: vec![
            ObjectPart {
                number: 1,
                bytes: 30,
                checksum: Some("AAAAAA==".into()),
            },
            ObjectPart {
                number: 3,
                bytes: 12,
                checksum: None,
            },
        ],
        upload_id: Some("00ff".into()),
    }
}

fn attributes_and_tags_round_trip(c: &dyn Catalog) {
    c.create_bucket(&Bucket {
        name: "attrs".into(),
        created_ms: 1,
    })
    .unwrap();
    let mut o = object("attrs", "a.json", None);
    o.attributes = attributes();
    o.tags = tags(&[("team", "blue"), ("x", "")]);
    c.put_object(&o, &PutCondition::Always).unwrap();
    assert_eq!(c.object("attrs", "a.json").unwrap(), Some(o.clone()));
    let listed = c.list_objects("attrs", "", None, 10).unwrap();
    assert_eq!(listed, vec![o]);
    let plain = object("attrs", "b.json", None);
    c.put_object(&plain, &PutCondition::Always).unwrap();
    let back = c.object("attrs", "b.json").unwrap().unwrap();
    assert_eq!(back.attributes, ObjectAttributes::default());
    assert!(back.tags.is_empty());
}

fn tags_change_alone(c: &dyn Catalog) {
    let before = c.object("attrs", "a.json").unwrap().unwrap();
    let new = tags(&[("team", "red")]);
    assert!(c.set_object_tags("attrs", "a.json", &new).unwrap());
    let after = c.object("attrs", "a.json").unwrap().unwrap();
    assert_eq!(after.tags, new);
    assert_eq!(
        (after.attributes, after.etag, after.modified_ms),
        (before.attributes, before.etag, before.modified_ms),
        "only the tags change"
    );
    assert!(
        c.set_object_tags("attrs", "a.json", &BTreeMap::new())
            .unwrap()
    );
    assert!(
        c.object("attrs", "a.json")
            .unwrap()
            .unwrap()
            .tags
            .is_empty()
    );
    assert!(!c.set_object_tags("attrs", "missing", &new).unwrap());
    assert!(!c.set_object_tags("nope", "a.json", &new).unwrap());
    assert!(c.object("attrs", "missing").unwrap().is_none());
}
