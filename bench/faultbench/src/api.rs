//! The Tuner's HTTP API as the fault runner uses it: start jobs, follow them, read the nodes.

use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use serde_json::Value;

/// A client for the Tuner at one base URL. Every call has a short timeout: a stopped Tuner
/// must not stall the runner.
pub(crate) struct TunerApi {
    base: String,
    agent: ureq::Agent,
}

impl TunerApi {
    /// A client for `base` (such as `http://127.0.0.1:8090`).
    pub(crate) fn new(base: &str) -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .http_status_as_error(false)
            .build()
            .into();
        TunerApi {
            base: base.to_string(),
            agent,
        }
    }

    /// `POST path` with a JSON body: (status, JSON reply).
    pub(crate) fn post(&self, path: &str, body: &Value) -> Result<(u16, Value)> {
        let mut resp = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .send(&serde_json::to_vec(body)?)
            .with_context(|| format!("POST {path}"))?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// `GET path` as JSON; an error for a status other than 200 or no answer.
    pub(crate) fn get(&self, path: &str) -> Result<Value> {
        let mut resp = self
            .agent
            .get(format!("{}{path}", self.base))
            .call()
            .with_context(|| format!("GET {path}"))?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        if status != 200 {
            return Err(anyhow!("GET {path}: HTTP {status}: {text}"));
        }
        serde_json::from_str(&text).with_context(|| format!("GET {path}: not JSON"))
    }

    /// The registered nodes.
    pub(crate) fn nodes(&self) -> Result<Vec<Value>> {
        match self.get("/v1/tuner/nodes")? {
            Value::Array(nodes) => Ok(nodes),
            other => Err(anyhow!("GET /v1/tuner/nodes: not a list: {other}")),
        }
    }

    /// The ids of every model version the Tuner knows.
    pub(crate) fn versions(&self) -> Result<Vec<String>> {
        let versions = self.get("/v1/tuner/versions")?;
        Ok(versions
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["id"].as_str().map(str::to_string))
            .collect())
    }
}
