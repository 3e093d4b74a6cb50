//! `ndpipe keys create|list|delete`: the access keys of a store, offline on its data directory
//! (`--data DIR`) or through a running server (`--server URL`, with an admin token or key).
//! `create` prints `{"access_key": ..., "secret_key": ...}` (with the name and role) as JSON:
//! the only time the secret is shown.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use ndpipe::client::{Client, ServerArgs};
use ndpipe_catalog::Role;
use ndpipe_store::{KeyInfo, KeyStore, NewKey};
use serde_json::json;

/// Flags of `ndpipe keys`.
#[derive(Debug, Args)]
pub(crate) struct KeysArgs {
    /// Work on this data directory directly, no server needed (--server is then not used;
    /// while a server runs on the directory, prefer --server).
    #[arg(long, global = true)]
    data: Option<PathBuf>,
    #[command(flatten)]
    server: ServerArgs,
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Create a key; prints its access key and secret as JSON.
    Create {
        /// A name for people (unique).
        #[arg(long)]
        name: String,
        /// read, write or admin.
        #[arg(long, value_parser = parse_role)]
        role: Role,
    },
    /// Every key (without secrets), one JSON object a line.
    List,
    /// Delete the key named NAME.
    Delete {
        /// The key's name.
        name: String,
    },
}

fn parse_role(text: &str) -> Result<Role, String> {
    text.parse()
        .map_err(|e: ndpipe_catalog::CatalogError| e.to_string())
}

/// Runs `ndpipe keys`.
pub(crate) async fn run(args: KeysArgs) -> Result<()> {
    match args.data {
        Some(data) => tokio::task::spawn_blocking(move || offline(&data, args.action)).await?,
        None => online(&args.server, args.action).await,
    }
}

fn offline(data: &std::path::Path, action: Action) -> Result<()> {
    let keys = KeyStore::open(data)
        .with_context(|| format!("opening the access keys of {}", data.display()))?;
    match action {
        Action::Create { name, role } => print_new(&keys.create(&name, role)?),
        Action::List => keys.list()?.iter().try_for_each(print_info),
        Action::Delete { name } => {
            if !keys.delete(&name)? {
                bail!("no key is named {name:?}");
            }
            Ok(())
        }
    }
}

async fn online(server: &ServerArgs, action: Action) -> Result<()> {
    let client = Client::new(server)?;
    match action {
        Action::Create { name, role } => {
            let body = json!({"name": name, "role": role});
            let new: NewKey = client.post_json_body("/v1/admin/keys", &body).await?;
            print_new(&new)
        }
        Action::List => {
            let keys: Vec<KeyInfo> = client.get_json("/v1/admin/keys").await?;
            keys.iter().try_for_each(print_info)
        }
        Action::Delete { name } => client.delete(&format!("/v1/admin/keys/{name}")).await,
    }
}

fn print_new(new: &NewKey) -> Result<()> {
    println!("{}", serde_json::to_string(new)?);
    Ok(())
}

fn print_info(info: &KeyInfo) -> Result<()> {
    println!("{}", serde_json::to_string(info)?);
    Ok(())
}
