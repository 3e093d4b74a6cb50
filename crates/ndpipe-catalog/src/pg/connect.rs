//! Opening connections: URL parsing, the first connection's clear errors, and the pool's manager.

use std::time::Duration;

use postgres::config::Host;
use postgres::{Client, Config, NoTls};

use super::error::{ConnectFailure, PgFailure};
use crate::CatalogError;

/// The r2d2 manager of the pool: `r2d2_postgres`'s, except that a failed connection keeps the
/// server's message, which the pool repeats when it times out, and that the check of a pooled
/// connection before it is handed out has a deadline (a frozen server fails it).
#[derive(Debug)]
pub(crate) struct Manager {
    config: Config,
    check_timeout: Duration,
}

/// A pooled connection. Closing a `postgres::Client` blocks on the client's own runtime, which
/// Tokio forbids inside another runtime's task: a connection dropped there (the pool dropped by
/// an async server's shutdown) is closed on a thread of its own.
pub(crate) struct Conn(Option<Client>);

impl std::ops::Deref for Conn {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.0
            .as_ref()
            .expect("a connection is only taken when it is dropped")
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Client {
        self.0
            .as_mut()
            .expect("a connection is only taken when it is dropped")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(client) = self.0.take()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            // If no thread can be started, the connection is leaked rather than the process
            // stopped: the server closes it when this process ends.
            let _ = std::thread::Builder::new()
                .name("ndpipe-pg-close".into())
                .spawn(move || drop(client));
        }
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = PgFailure;

    fn connect(&self) -> Result<Conn, PgFailure> {
        self.config
            .connect(NoTls)
            .map(|c| Conn(Some(c)))
            .map_err(|e| PgFailure::new(&e))
    }

    fn is_valid(&self, client: &mut Conn) -> Result<(), PgFailure> {
        client
            .is_valid(self.check_timeout)
            .map_err(|e| PgFailure::new(&e))
    }

    fn has_broken(&self, client: &mut Conn) -> bool {
        client.is_closed()
    }
}

/// Parses `url` (`postgres://user:password@host:port/database?options`) and fills in the
/// connect timeout and the application name when the URL does not set them.
pub(crate) fn parse(url: &str, connect_timeout: Duration) -> Result<Config, CatalogError> {
    let mut config: Config = url.parse().map_err(|e| CatalogError::Database {
        op: "parse the PostgreSQL URL",
        source: Box::new(PgFailure::new(&e)),
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(connect_timeout);
    }
    if config.get_application_name().is_none() {
        config.application_name("ndpipe");
    }
    Ok(config)
}

/// `config` with the deadlines of every pooled connection: the server's `statement_timeout`
/// (added to the URL's `options`), the TCP user timeout, and TCP keepalive probes every third
/// of `statement_timeout`, so that a dead or partitioned server fails the calls on its
/// connections instead of holding them.
pub(crate) fn with_deadlines(mut config: Config, statement_timeout: Duration) -> Config {
    let setting = format!("-c statement_timeout={}", statement_timeout.as_millis());
    let options = match config.get_options() {
        Some(given) if !given.is_empty() => format!("{given} {setting}"),
        _ => setting,
    };
    let probe = (statement_timeout / 3).max(Duration::from_secs(1));
    config
        .options(&options)
        .tcp_user_timeout(statement_timeout)
        .keepalives(true)
        .keepalives_idle(probe)
        .keepalives_interval(probe)
        .keepalives_retries(3);
    config
}

/// One connection, or an error naming the server and the reason (refused, timed out, wrong
/// password, no such database).
pub(crate) fn connect_once(config: &Config) -> Result<Client, CatalogError> {
    config.connect(NoTls).map_err(|e| CatalogError::Database {
        op: "connect",
        source: Box::new(ConnectFailure {
            target: target(config),
            reason: PgFailure::new(&e),
        }),
    })
}

/// The pool's connection manager for `config`; a pooled connection is checked alive within
/// `check_timeout` before it is handed out.
pub(crate) fn manager(config: Config, check_timeout: Duration) -> Manager {
    Manager {
        config,
        check_timeout,
    }
}

/// `user@host:port/database`, for messages: never the password.
fn target(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            Host::Tcp(name) => name.clone(),
            Host::Unix(dir) => dir.display().to_string(),
        })
        .collect();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("?");
    let database = config.get_dbname().unwrap_or(user);
    format!("{user}@{}:{port}/{database}", hosts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_server_but_never_the_password() {
        let config = parse(
            "postgres://ndpipe:s3cret@db.example:6543/cat",
            Duration::from_secs(3),
        )
        .unwrap();
        assert_eq!(target(&config), "ndpipe@db.example:6543/cat");
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(config.get_application_name(), Some("ndpipe"));
    }

    #[test]
    fn pooled_connections_carry_the_deadlines() {
        let config = parse(
            "postgres://u@h/db?options=-c%20search_path%3Dx",
            Duration::from_secs(3),
        )
        .unwrap();
        let config = with_deadlines(config, Duration::from_millis(4500));
        assert_eq!(
            config.get_options(),
            Some("-c search_path=x -c statement_timeout=4500")
        );
        assert_eq!(
            config.get_tcp_user_timeout(),
            Some(&Duration::from_millis(4500))
        );
        assert!(config.get_keepalives());
        assert_eq!(config.get_keepalives_idle(), Duration::from_millis(1500));
        let bare = with_deadlines(
            parse("postgres://u@h/db", Duration::from_secs(3)).unwrap(),
            Duration::from_secs(1),
        );
        assert_eq!(bare.get_options(), Some("-c statement_timeout=1000"));
        assert_eq!(bare.get_keepalives_idle(), Duration::from_secs(1));
    }

    #[test]
    fn a_bad_url_is_an_error_not_a_panic() {
        let err = parse("postgres://u@h:notaport/db", Duration::from_secs(1)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("parse the PostgreSQL URL"), "{text}");
    }
}
