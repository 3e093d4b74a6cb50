//! The PostgreSQL schema, as numbered migrations recorded in `schema_migrations`.
//!
//! Text that is sorted (ids, versions, node names) uses the "C" collation, so that listings come
//! in byte order as they do from SQLite, whatever the database's locale.

use ndpipe_util::time::now_ms;
use postgres::Client;

use super::error::db;
use crate::CatalogError;

/// The advisory lock that serialises nodes migrating the same database at once.
const MIGRATION_LOCK: i64 = 0x6e64_7069_7065; // "ndpipe"

/// Schema migrations, applied in order; `schema_migrations` has one row per applied one.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE photos (
    id            BIGINT PRIMARY KEY CHECK (id >= 0),
    node          TEXT COLLATE "C" NOT NULL,
    sha256        TEXT   NOT NULL,
    bytes         BIGINT NOT NULL,
    width         BIGINT NOT NULL,
    height        BIGINT NOT NULL,
    content_type  TEXT   NOT NULL,
    created_ms    BIGINT NOT NULL
);
CREATE INDEX photos_node ON photos (node, id);
CREATE INDEX photos_sha256 ON photos (sha256);
CREATE TABLE ground_truth (
    photo_id  BIGINT PRIMARY KEY REFERENCES photos (id) ON DELETE CASCADE,
    label     TEXT NOT NULL,
    split     TEXT NOT NULL CHECK (split IN ('train', 'val', 'test'))
);
CREATE INDEX ground_truth_split ON ground_truth (split, photo_id);
CREATE TABLE model_versions (
    id          TEXT COLLATE "C" PRIMARY KEY,
    backbone    TEXT NOT NULL,
    parent      TEXT COLLATE "C" REFERENCES model_versions (id),
    metrics     JSONB NOT NULL,
    created_ms  BIGINT NOT NULL
);
CREATE TABLE active_models (
    node      TEXT COLLATE "C" PRIMARY KEY,
    model_id  TEXT COLLATE "C" NOT NULL REFERENCES model_versions (id)
);
CREATE TABLE predictions (
    photo_id       BIGINT NOT NULL REFERENCES photos (id) ON DELETE CASCADE,
    model_version  TEXT COLLATE "C" NOT NULL,
    rank           INTEGER NOT NULL,
    label          TEXT NOT NULL,
    score          REAL NOT NULL,
    PRIMARY KEY (photo_id, model_version, rank)
);
CREATE INDEX predictions_label ON predictions (model_version, label, score);
CREATE TABLE jobs (
    node        TEXT COLLATE "C" NOT NULL,
    id          TEXT COLLATE "C" NOT NULL,
    kind        TEXT NOT NULL,
    status      TEXT NOT NULL,
    state       JSONB NOT NULL,
    created_ms  BIGINT NOT NULL,
    updated_ms  BIGINT NOT NULL,
    PRIMARY KEY (node, id)
);
CREATE TABLE photo_id_blocks (
    node         TEXT COLLATE "C" NOT NULL,
    first_id     BIGINT NOT NULL,
    end_id       BIGINT NOT NULL,
    reserved_ms  BIGINT NOT NULL,
    CHECK (first_id >= 1 AND end_id > first_id)
);
CREATE INDEX photo_id_blocks_node ON photo_id_blocks (node, first_id);
"#,
    r#"
CREATE TABLE nodes (
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name              TEXT COLLATE "C" NOT NULL UNIQUE,
    url               TEXT   NOT NULL,
    state             TEXT   NOT NULL CHECK (state IN ('active', 'draining')),
    lease_expires_ms  BIGINT NOT NULL,
    version           TEXT,
    registered_ms     BIGINT NOT NULL,
    last_seen_ms      BIGINT NOT NULL
);
"#,
    r#"
CREATE TABLE buckets (
    name        TEXT COLLATE "C" PRIMARY KEY,
    created_ms  BIGINT NOT NULL
);
CREATE TABLE objects (
    bucket        TEXT COLLATE "C" NOT NULL REFERENCES buckets (name),
    key           TEXT COLLATE "C" NOT NULL,
    photo_id      BIGINT UNIQUE REFERENCES photos (id) ON DELETE CASCADE,
    blob          TEXT,
    bytes         BIGINT NOT NULL,
    etag          TEXT   NOT NULL,
    sha256        TEXT   NOT NULL,
    content_type  TEXT   NOT NULL,
    modified_ms   BIGINT NOT NULL,
    metadata      JSONB  NOT NULL,
    PRIMARY KEY (bucket, key),
    CHECK ((photo_id IS NULL) <> (blob IS NULL))
);
"#,
    r#"
CREATE TABLE access_keys (
    access_key     TEXT COLLATE "C" PRIMARY KEY,
    name           TEXT COLLATE "C" NOT NULL UNIQUE,
    role           TEXT   NOT NULL CHECK (role IN ('read', 'write', 'admin')),
    secret_sha256  TEXT   NOT NULL UNIQUE,
    sealed_secret  BYTEA  NOT NULL,
    created_ms     BIGINT NOT NULL
);
"#,
    // Replication: every copy of a photo (the primary's included), deleted photos, and the
    // free space placement weighs nodes by. `replicas` has no foreign key to `photos`: a copy
    // is recorded when it is durable, before the primary catalogs the photo.
    r#"
CREATE TABLE replicas (
    photo_id  BIGINT NOT NULL CHECK (photo_id >= 0),
    node      TEXT COLLATE "C" NOT NULL,
    added_ms  BIGINT NOT NULL,
    PRIMARY KEY (photo_id, node)
);
CREATE INDEX replicas_node ON replicas (node, photo_id);
INSERT INTO replicas (photo_id, node, added_ms) SELECT id, node, created_ms FROM photos;
CREATE TABLE tombstones (
    photo_id    BIGINT PRIMARY KEY,
    deleted_ms  BIGINT NOT NULL
);
CREATE TABLE node_space (
    node        TEXT COLLATE "C" PRIMARY KEY,
    free_bytes  BIGINT NOT NULL,
    updated_ms  BIGINT NOT NULL
);
"#,
    // Label search by an index (`label_terms.rs`): one row per term of every prediction, kept
    // with the prediction's rows (deleted with them by the cascade), backfilled from them here.
    // `translate` folds ASCII case only, as the Rust side does.
    r#"
CREATE TABLE photo_labels (
    model_version  TEXT COLLATE "C" NOT NULL,
    kind           INTEGER NOT NULL,
    term           TEXT COLLATE "C" NOT NULL,
    score          REAL    NOT NULL,
    photo_id       BIGINT  NOT NULL,
    rank           INTEGER NOT NULL,
    FOREIGN KEY (photo_id, model_version, rank)
        REFERENCES predictions (photo_id, model_version, rank) ON DELETE CASCADE
);
CREATE UNIQUE INDEX photo_labels_search
    ON photo_labels (model_version, kind, term, score DESC, photo_id, rank);
CREATE INDEX photo_labels_prediction ON photo_labels (photo_id, model_version, rank);
INSERT INTO photo_labels (model_version, kind, term, score, photo_id, rank)
    SELECT model_version, 0, label, score, photo_id, rank FROM predictions;
INSERT INTO photo_labels (model_version, kind, term, score, photo_id, rank)
    SELECT DISTINCT pr.model_version, 1,
           translate(n.name, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz'),
           pr.score, pr.photo_id, pr.rank
    FROM predictions pr CROSS JOIN LATERAL (
        SELECT split_part(pr.label, ',', 1) WHERE strpos(pr.label, ',') > 0
        UNION ALL
        SELECT m[1] FROM regexp_matches(pr.label, ', ([^,]*)', 'g') AS m
    ) AS n (name);
"#,
    // Plain objects' files replicated like photos: every copy, recorded by its holder once
    // durable (before the object row names the file, as with photo copies).
    r#"
CREATE TABLE blob_copies (
    blob      TEXT COLLATE "C" NOT NULL,
    node      TEXT COLLATE "C" NOT NULL,
    added_ms  BIGINT NOT NULL,
    PRIMARY KEY (blob, node)
);
CREATE INDEX blob_copies_node ON blob_copies (node, blob);
CREATE INDEX objects_blob ON objects (blob) WHERE blob IS NOT NULL;
"#,
    // Tasks (`lib.rs`, `TaskCatalog`): every model version labels for one task, each node has
    // one active version per task, and ground truth is per task. An existing cluster keeps its
    // labels: pretrained versions become `general`'s, every other version and all ground truth
    // the `default` task's, and each node's `general` serves the pretrained version of its
    // active head's backbone. Nothing is re-labelled.
    r#"
CREATE TABLE tasks (
    name        TEXT COLLATE "C" PRIMARY KEY,
    floor       REAL,
    created_ms  BIGINT NOT NULL
);
INSERT INTO tasks (name, floor, created_ms) VALUES ('general', NULL, 0), ('default', NULL, 0);
ALTER TABLE model_versions
    ADD COLUMN task TEXT COLLATE "C" NOT NULL DEFAULT 'default' REFERENCES tasks (name);
UPDATE model_versions SET task = 'general' WHERE metrics->>'head' = 'pretrained';
ALTER TABLE active_models ADD COLUMN task TEXT COLLATE "C" NOT NULL DEFAULT 'default';
UPDATE active_models a SET task = m.task FROM model_versions m WHERE m.id = a.model_id;
ALTER TABLE active_models DROP CONSTRAINT active_models_pkey;
ALTER TABLE active_models ADD PRIMARY KEY (node, task);
INSERT INTO active_models (node, model_id, task)
    SELECT a.node, g.id, 'general'
    FROM active_models a
    JOIN model_versions m ON m.id = a.model_id
    JOIN model_versions g ON g.backbone = m.backbone AND g.task = 'general'
    WHERE a.task = 'default'
    ON CONFLICT DO NOTHING;
ALTER TABLE ground_truth
    ADD COLUMN task TEXT COLLATE "C" NOT NULL DEFAULT 'default' REFERENCES tasks (name);
ALTER TABLE ground_truth DROP CONSTRAINT ground_truth_pkey;
ALTER TABLE ground_truth ADD PRIMARY KEY (photo_id, task);
ALTER TABLE ground_truth ALTER COLUMN task DROP DEFAULT;
CREATE INDEX ground_truth_task ON ground_truth (task, split, photo_id);
"#,
    // Duplicate finding: one perceptual hash per photo, by the algorithm named (a photo whose
    // hash is by another algorithm is hashed again); written by the node that holds the photo.
    r#"
CREATE TABLE photo_near_hashes (
    photo_id   BIGINT PRIMARY KEY REFERENCES photos (id) ON DELETE CASCADE,
    algorithm  TEXT   NOT NULL,
    hash       BIGINT NOT NULL
);
"#,
    // What S3 clients rely on besides the bytes (`ObjectAttributes`: standard headers,
    // checksum, parts, the upload that made the object) and the user's object tags; objects
    // stored before read back with none.
    r#"
ALTER TABLE objects
    ADD COLUMN attributes JSONB NOT NULL DEFAULT '{}',
    ADD COLUMN tags       JSONB NOT NULL DEFAULT '{}';
"#,
];

/// Applies the migrations this database lacks, all in one transaction, under an advisory lock
/// so that nodes starting together migrate once. Refuses a database migrated by a newer build.
pub(super) fn migrate(client: &mut Client) -> Result<(), CatalogError> {
    let op = "migrate";
    let mut tx = client.transaction().map_err(db(op))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(db(op))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version     INTEGER PRIMARY KEY,
             applied_ms  BIGINT NOT NULL
         )",
    )
    .map_err(db(op))?;
    let applied: i32 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .and_then(|row| row.try_get(0))
        .map_err(db("read schema version"))?;
    let known = MIGRATIONS.len();
    let applied = usize::try_from(applied).unwrap_or(usize::MAX);
    if applied > known {
        return Err(CatalogError::Invalid(format!(
            "catalog schema version {applied} is newer than this build ({known})"
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(applied) {
        let version = i32::try_from(i + 1).expect("fewer than 2^31 migrations");
        tx.batch_execute(sql).map_err(db(op))?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_ms) VALUES ($1, $2)",
            &[&version, &now_ms()],
        )
        .map_err(db(op))?;
    }
    tx.commit().map_err(db(op))
}
