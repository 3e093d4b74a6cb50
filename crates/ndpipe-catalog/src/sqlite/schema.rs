//! The SQLite schema, as numbered migrations.

/// Schema migrations, applied in order; `PRAGMA user_version` records how many ran.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE photos (
    id            INTEGER PRIMARY KEY,
    sha256        TEXT    NOT NULL,
    bytes         INTEGER NOT NULL,
    width         INTEGER NOT NULL,
    height        INTEGER NOT NULL,
    content_type  TEXT    NOT NULL,
    created_ms    INTEGER NOT NULL
);
CREATE INDEX photos_sha256 ON photos(sha256);
CREATE TABLE ground_truth (
    photo_id  INTEGER PRIMARY KEY REFERENCES photos(id) ON DELETE CASCADE,
    label     TEXT NOT NULL,
    split     TEXT NOT NULL CHECK (split IN ('train', 'val', 'test'))
);
CREATE INDEX ground_truth_label ON ground_truth(label);
CREATE TABLE model_versions (
    id          TEXT PRIMARY KEY,
    backbone    TEXT NOT NULL,
    parent      TEXT REFERENCES model_versions(id),
    metrics     TEXT NOT NULL,
    created_ms  INTEGER NOT NULL,
    active      INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX model_versions_one_active ON model_versions(active) WHERE active = 1;
CREATE TABLE predictions (
    photo_id       INTEGER NOT NULL REFERENCES photos(id) ON DELETE CASCADE,
    model_version  TEXT    NOT NULL,
    rank           INTEGER NOT NULL,
    label          TEXT    NOT NULL,
    score          REAL    NOT NULL,
    PRIMARY KEY (photo_id, model_version, rank)
);
CREATE INDEX predictions_label ON predictions(model_version, label, score);
"#,
    r#"
CREATE TABLE jobs (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    status      TEXT NOT NULL,
    state       TEXT NOT NULL,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL
);
"#,
    r#"
CREATE TABLE nodes (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    name              TEXT    NOT NULL UNIQUE,
    url               TEXT    NOT NULL,
    state             TEXT    NOT NULL CHECK (state IN ('active', 'draining')),
    lease_expires_ms  INTEGER NOT NULL,
    version           TEXT,
    registered_ms     INTEGER NOT NULL,
    last_seen_ms      INTEGER NOT NULL
);
"#,
    r#"
CREATE TABLE buckets (
    name        TEXT    PRIMARY KEY,
    created_ms  INTEGER NOT NULL
);
CREATE TABLE objects (
    bucket        TEXT    NOT NULL REFERENCES buckets(name),
    key           TEXT    NOT NULL,
    photo_id      INTEGER UNIQUE REFERENCES photos(id) ON DELETE CASCADE,
    blob          TEXT,
    bytes         INTEGER NOT NULL,
    etag          TEXT    NOT NULL,
    sha256        TEXT    NOT NULL,
    content_type  TEXT    NOT NULL,
    modified_ms   INTEGER NOT NULL,
    metadata      TEXT    NOT NULL,
    PRIMARY KEY (bucket, key),
    CHECK ((photo_id IS NULL) <> (blob IS NULL))
);
"#,
    r#"
CREATE TABLE access_keys (
    access_key     TEXT    PRIMARY KEY,
    name           TEXT    NOT NULL UNIQUE,
    role           TEXT    NOT NULL CHECK (role IN ('read', 'write', 'admin')),
    secret_sha256  TEXT    NOT NULL UNIQUE,
    sealed_secret  BLOB    NOT NULL,
    created_ms     INTEGER NOT NULL
);
"#,
    // Label search by an index (`label_terms.rs`): one row per term of every prediction, kept
    // with the prediction's rows (deleted with them by the cascade), backfilled from them here.
    r#"
CREATE TABLE photo_labels (
    model_version  TEXT    NOT NULL,
    kind           INTEGER NOT NULL,
    term           TEXT    NOT NULL,
    score          REAL    NOT NULL,
    photo_id       INTEGER NOT NULL,
    rank           INTEGER NOT NULL,
    PRIMARY KEY (model_version, kind, term, score DESC, photo_id, rank),
    FOREIGN KEY (photo_id, model_version, rank)
        REFERENCES predictions (photo_id, model_version, rank) ON DELETE CASCADE
) WITHOUT ROWID;
CREATE INDEX photo_labels_prediction ON photo_labels (photo_id, model_version, rank);
INSERT INTO photo_labels (model_version, kind, term, score, photo_id, rank)
    SELECT model_version, 0, label, score, photo_id, rank FROM predictions;
INSERT OR IGNORE INTO photo_labels (model_version, kind, term, score, photo_id, rank)
    SELECT model_version, 1, lower(substr(label, 1, instr(label, ',') - 1)), score, photo_id, rank
    FROM predictions WHERE instr(label, ',') > 0;
WITH RECURSIVE after_separator (model_version, score, photo_id, rank, rest) AS (
    SELECT model_version, score, photo_id, rank, substr(label, instr(label, ', ') + 2)
    FROM predictions WHERE instr(label, ', ') > 0
    UNION ALL
    SELECT model_version, score, photo_id, rank, substr(rest, instr(rest, ', ') + 2)
    FROM after_separator WHERE instr(rest, ', ') > 0
)
INSERT OR IGNORE INTO photo_labels (model_version, kind, term, score, photo_id, rank)
    SELECT model_version, 1,
           lower(CASE WHEN instr(rest, ',') > 0 THEN substr(rest, 1, instr(rest, ',') - 1)
                      ELSE rest END),
           score, photo_id, rank
    FROM after_separator;
"#,
    // Tasks (`lib.rs`, `TaskCatalog`): every model version labels for one task, each task has
    // its own active version, and ground truth is per task. An existing store keeps its labels:
    // its pretrained versions become `general`'s, every other version and all ground truth the
    // `default` task's, and `general` serves the pretrained version of the active head's
    // backbone. Nothing is re-labelled.
    r#"
CREATE TABLE tasks (
    name        TEXT    PRIMARY KEY,
    floor       REAL,
    created_ms  INTEGER NOT NULL
);
INSERT INTO tasks (name, floor, created_ms) VALUES ('general', NULL, 0), ('default', NULL, 0);
ALTER TABLE model_versions ADD COLUMN task TEXT NOT NULL DEFAULT 'default';
UPDATE model_versions SET task = 'general' WHERE json_extract(metrics, '$.head') = 'pretrained';
DROP INDEX model_versions_one_active;
UPDATE model_versions SET active = 1
 WHERE task = 'general'
   AND NOT EXISTS (SELECT 1 FROM model_versions WHERE task = 'general' AND active = 1)
   AND backbone = (SELECT backbone FROM model_versions WHERE task = 'default' AND active = 1);
CREATE UNIQUE INDEX model_versions_one_active ON model_versions(task) WHERE active = 1;
CREATE TABLE task_ground_truth (
    photo_id  INTEGER NOT NULL REFERENCES photos(id) ON DELETE CASCADE,
    task      TEXT    NOT NULL REFERENCES tasks(name),
    label     TEXT    NOT NULL,
    split     TEXT    NOT NULL CHECK (split IN ('train', 'val', 'test')),
    PRIMARY KEY (photo_id, task)
);
INSERT INTO task_ground_truth (photo_id, task, label, split)
    SELECT photo_id, 'default', label, split FROM ground_truth;
DROP TABLE ground_truth;
ALTER TABLE task_ground_truth RENAME TO ground_truth;
CREATE INDEX ground_truth_task ON ground_truth(task, split, photo_id);
"#,
    // Duplicate finding: one perceptual hash per photo, by the algorithm named (a photo whose
    // hash is by another algorithm is hashed again).
    r#"
CREATE TABLE IF NOT EXISTS photo_near_hashes (
    photo_id   INTEGER PRIMARY KEY REFERENCES photos(id) ON DELETE CASCADE,
    algorithm  TEXT    NOT NULL,
    hash       INTEGER NOT NULL
);
"#,
    // What S3 clients rely on besides the bytes (`ObjectAttributes`: standard headers,
    // checksum, parts, the upload that made the object) and the user's object tags, as JSON
    // text; objects stored before read back with none.
    r#"
ALTER TABLE objects ADD COLUMN attributes TEXT NOT NULL DEFAULT '{}';
ALTER TABLE objects ADD COLUMN tags TEXT NOT NULL DEFAULT '{}';
"#,
];
