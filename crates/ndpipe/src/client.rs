//! A small HTTP client for a running store and Tuner, used by the CLI tools and benchmarks.

use anyhow::{Context, Result, anyhow};
use clap::Args;
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// How to reach a running store.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Base URL of the store.
    #[arg(long, env = "NDPIPE_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// Bearer token: the admin token, or an access key's secret (`ndpipe keys create`).
    #[arg(long, env = "NDPIPE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

pub use ndpipe_util::http::ErrorBody;

/// Reply to an upload.
#[derive(Debug, Deserialize)]
pub struct Uploaded {
    /// The photo's id: the new photo's, or the stored one's when the store had the bytes.
    pub id: u64,
    /// The photo that already had these bytes, when one did.
    #[serde(default)]
    pub duplicate_of: Option<u64>,
}

/// The ground truth an upload carries.
#[derive(Debug, Clone, Copy)]
pub struct Truth<'a> {
    /// The class.
    pub label: &'a str,
    /// The split: train, val or test.
    pub split: &'a str,
    /// The task (`None`: the default task).
    pub task: Option<&'a str>,
}

/// Why an upload failed.
#[derive(Debug)]
pub enum UploadError {
    /// The store refused the photo (4xx): its error kind and message.
    Rejected(ErrorBody),
    /// Transport or server failure.
    Failed(anyhow::Error),
}

/// A client bound to one store.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    /// A client for `args.server`.
    pub fn new(args: &ServerArgs) -> Result<Self> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .context("building the HTTP client")?;
        Ok(Client {
            http,
            base: args.server.trim_end_matches('/').to_string(),
            token: args.token.clone(),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Uploads one photo with optional ground truth; its id.
    pub async fn upload(
        &self,
        bytes: Vec<u8>,
        truth: Option<Truth<'_>>,
    ) -> Result<u64, UploadError> {
        self.upload_reply(bytes, truth).await.map(|u| u.id)
    }

    /// Uploads one photo with optional ground truth; the id and whether the store had the
    /// bytes already.
    pub async fn upload_reply(
        &self,
        bytes: Vec<u8>,
        truth: Option<Truth<'_>>,
    ) -> Result<Uploaded, UploadError> {
        let mut query = Vec::new();
        if let Some(t) = truth {
            query.push(("label", t.label));
            query.push(("split", t.split));
            if let Some(task) = t.task {
                query.push(("task", task));
            }
        }
        let resp = self
            .authed(
                self.http
                    .post(self.url("/v1/photos"))
                    .query(&query)
                    .body(bytes),
            )
            .send()
            .await
            .map_err(|e| UploadError::Failed(anyhow!(e).context("sending the upload")))?;
        let status = resp.status();
        if status.is_success() {
            return resp
                .json::<Uploaded>()
                .await
                .map_err(|e| UploadError::Failed(anyhow!(e).context("reading the upload reply")));
        }
        let body: Result<ErrorBody, _> = resp.json().await;
        match body {
            Ok(b) if status.is_client_error() => Err(UploadError::Rejected(b)),
            Ok(b) => Err(UploadError::Failed(anyhow!(
                "server error {status}: {} ({})",
                b.message,
                b.error
            ))),
            Err(_) => Err(UploadError::Failed(anyhow!("server answered {status}"))),
        }
    }

    /// PUT a JSON body, expecting JSON back.
    pub async fn put_json_body<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<T> {
        let resp = self
            .authed(self.http.put(self.url(path)).json(body))
            .send()
            .await
            .with_context(|| format!("PUT {path}"))?;
        Self::json(resp, path).await
    }

    /// DELETE with a JSON body, expecting JSON back.
    pub async fn delete_json_body<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<T> {
        let resp = self
            .authed(self.http.delete(self.url(path)).json(body))
            .send()
            .await
            .with_context(|| format!("DELETE {path}"))?;
        Self::json(resp, path).await
    }

    /// GET a JSON document.
    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let resp = self
            .authed(self.http.get(self.url(path)))
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        Self::json(resp, path).await
    }

    /// GET raw bytes.
    pub async fn get_bytes(&self, path: &str) -> Result<Vec<u8>> {
        let resp = self
            .authed(self.http.get(self.url(path)))
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        let resp = Self::check(resp, path).await?;
        Ok(resp
            .bytes()
            .await
            .with_context(|| format!("reading {path}"))?
            .to_vec())
    }

    /// DELETE a resource.
    pub async fn delete(&self, path: &str) -> Result<()> {
        let resp = self
            .authed(self.http.delete(self.url(path)))
            .send()
            .await
            .with_context(|| format!("DELETE {path}"))?;
        Self::check(resp, path).await.map(drop)
    }

    /// DELETE a resource, expecting JSON back.
    pub async fn delete_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let resp = self
            .authed(self.http.delete(self.url(path)))
            .send()
            .await
            .with_context(|| format!("DELETE {path}"))?;
        Self::json(resp, path).await
    }

    /// POST a JSON body, expecting JSON back. No timeout: fine-tuning can take minutes.
    pub async fn post_json_body<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<T> {
        let resp = self
            .authed(self.http.post(self.url(path)).json(body))
            .send()
            .await
            .with_context(|| format!("POST {path}"))?;
        Self::json(resp, path).await
    }

    /// POST raw bytes (a photo), expecting JSON back.
    pub async fn post_bytes_json<T: DeserializeOwned>(
        &self,
        path: &str,
        bytes: Vec<u8>,
    ) -> Result<T> {
        let resp = self
            .authed(self.http.post(self.url(path)).body(bytes))
            .send()
            .await
            .with_context(|| format!("POST {path}"))?;
        Self::json(resp, path).await
    }

    /// POST without a body, expecting JSON back.
    pub async fn post_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let resp = self
            .authed(self.http.post(self.url(path)))
            .send()
            .await
            .with_context(|| format!("POST {path}"))?;
        Self::json(resp, path).await
    }

    async fn json<T: DeserializeOwned>(resp: reqwest::Response, path: &str) -> Result<T> {
        let resp = Self::check(resp, path).await?;
        resp.json()
            .await
            .with_context(|| format!("decoding the reply of {path}"))
    }

    async fn check(resp: reqwest::Response, path: &str) -> Result<reqwest::Response> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        match resp.json::<ErrorBody>().await {
            Ok(b) => Err(anyhow!(
                "{path}: {} ({}, HTTP {status})",
                b.message,
                b.error
            )),
            Err(_) => Err(anyhow!("{path}: HTTP {status}")),
        }
    }
}
