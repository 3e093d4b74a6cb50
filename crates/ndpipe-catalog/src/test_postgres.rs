//! A PostgreSQL server for tests and one fresh database per test (feature `testing`), for this
//! crate's tests and for tests of the processes that use a shared catalog.
//!
//! `NDPIPE_TEST_POSTGRES_URL` names a server to use (a user allowed to create databases);
//! otherwise `tools/postgres/run.sh` starts a throw-away one, which stops and deletes itself when
//! this process ends (its standard input, a pipe from here, closes). A server that cannot be had
//! fails the tests, unless `NDPIPE_SKIP_POSTGRES=1`.

use std::io::{BufRead, BufReader, Read};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

use postgres::{Client, NoTls};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tools/postgres/run.sh");
/// Long enough for `apt-get install postgresql` on a fresh machine.
const START_TIMEOUT: Duration = Duration::from_secs(600);

struct Server {
    url: String,
    /// Held open for the life of the process: the script stops the server when it closes.
    _keepalive: Option<ChildStdin>,
}

/// A database of its own for one test, dropped when the test ends.
pub struct TestDb {
    /// Its URL.
    pub url: String,
    name: String,
}

impl TestDb {
    /// A direct connection, for looking under the catalog.
    pub fn client(&self) -> Client {
        Client::connect(&self.url, NoTls).expect("connect to the test database")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut admin) = Client::connect(&server_url(), NoTls) {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// A new empty database named after `test`, or `None` (after saying so) when
/// `NDPIPE_SKIP_POSTGRES=1`. Panics when no server can be had.
pub fn database(test: &str) -> Option<TestDb> {
    if std::env::var("NDPIPE_SKIP_POSTGRES").as_deref() == Ok("1") {
        eprintln!("skipped {test}: NDPIPE_SKIP_POSTGRES=1, so no PostgreSQL test runs");
        return None;
    }
    let admin_url = server_url();
    let name = format!("ndpipe_{test}_{}", std::process::id());
    let mut admin = Client::connect(&admin_url, NoTls)
        .unwrap_or_else(|e| panic!("cannot connect to the test server: {e:?}"));
    for sql in [
        format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"),
        format!("CREATE DATABASE \"{name}\""),
    ] {
        admin.batch_execute(&sql).expect("create the test database");
    }
    Some(TestDb {
        url: with_database(&admin_url, &name),
        name,
    })
}

/// The server's URL, starting it on first use.
pub fn server_url() -> String {
    static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
    match SERVER.get_or_init(start) {
        Ok(server) => server.url.clone(),
        Err(why) => panic!(
            "no PostgreSQL server for the tests: {why}\nSet NDPIPE_TEST_POSTGRES_URL \
             to use a running server, or NDPIPE_SKIP_POSTGRES=1 to skip these tests."
        ),
    }
}

/// `url` with its database replaced by `database`.
pub fn with_database(url: &str, database: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let query = tail.find('?').map_or("", |i| &tail[i..]);
    format!("{scheme}://{authority}/{database}{query}")
}

fn start() -> Result<Server, String> {
    if let Ok(url) = std::env::var("NDPIPE_TEST_POSTGRES_URL") {
        return Ok(Server {
            url,
            _keepalive: None,
        });
    }
    let mut child = Command::new(SCRIPT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {SCRIPT}: {e}"))?;
    let stdin = child.stdin.take();
    let (stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout.expect("piped stdout")).lines();
        let _ = tx.send(lines.next());
        lines.for_each(drop);
    });
    let (etx, erx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_string(&mut text);
        }
        let _ = etx.send(text);
    });
    let failure = match rx.recv_timeout(START_TIMEOUT) {
        Ok(Some(Ok(url))) if url.starts_with("postgres://") => {
            return Ok(Server {
                url,
                _keepalive: stdin,
            });
        }
        Ok(Some(Ok(line))) => format!("printed {line:?} instead of a URL"),
        Ok(Some(Err(e))) => format!("could not be read: {e}"),
        Ok(None) => "ended without printing a URL".to_string(),
        Err(_) => format!("printed no URL in {START_TIMEOUT:?}"),
    };
    drop(stdin);
    let _ = child.kill();
    let log = erx.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
    Err(format!("{SCRIPT} {failure}; it said:\n{log}"))
}

/// The number of the migration that adds tasks.
pub const TASKS_MIGRATION: i32 = 8;

/// SQL that takes an empty catalog back to the schema before tasks ([`TASKS_MIGRATION`]) and
/// the migrations after it, for tests of the migrations (delete their `schema_migrations` rows
/// too).
pub const UNDO_TASKS: &str = "
ALTER TABLE objects DROP COLUMN attributes, DROP COLUMN tags;
DROP TABLE photo_near_hashes;
ALTER TABLE ground_truth DROP CONSTRAINT ground_truth_pkey;
ALTER TABLE ground_truth DROP COLUMN task;
ALTER TABLE ground_truth ADD PRIMARY KEY (photo_id);
ALTER TABLE active_models DROP CONSTRAINT active_models_pkey;
ALTER TABLE active_models DROP COLUMN task;
ALTER TABLE active_models ADD PRIMARY KEY (node);
ALTER TABLE model_versions DROP COLUMN task;
DROP TABLE tasks;
";
