//! What a node serves: one model version per task. Nodes report it in `Register`, `Heartbeat`
//! and `Inventory`, and the Tuner answers with what it means every node to serve, as one string
//! in the protocol's `active_version` fields: `task=version` pairs in task order, joined by `,`
//! (`default=ft-1-ab,general=efficientnet-lite0-25a4`). A node that serves another set takes
//! part in no job until the Tuner has brought it to the set.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::ProtoError;

/// One model version per task, as a node serves them or the Tuner means them served.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Serving(BTreeMap<String, String>);

impl Serving {
    /// Nothing served yet.
    pub fn new() -> Self {
        Serving::default()
    }

    /// Serves `version` for `task` (replacing what it served).
    pub fn set(&mut self, task: impl Into<String>, version: impl Into<String>) {
        self.0.insert(task.into(), version.into());
    }

    /// The version serving `task`.
    pub fn version(&self, task: &str) -> Option<&str> {
        self.0.get(task).map(String::as_str)
    }

    /// Every (task, version), in task order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(t, v)| (t.as_str(), v.as_str()))
    }

    /// Whether nothing is served.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Serving {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (task, version)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{task}={version}")?;
        }
        Ok(())
    }
}

impl FromStr for Serving {
    type Err = ProtoError;

    /// Parses the protocol's form; an empty string serves nothing.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut serving = Serving::new();
        for pair in s.split(',').filter(|p| !p.is_empty()) {
            let Some((task, version)) = pair.split_once('=') else {
                return Err(ProtoError::Malformed {
                    what: "served versions".into(),
                    reason: format!("{pair:?} is not task=version"),
                });
            };
            if task.is_empty() || version.is_empty() || serving.0.contains_key(task) {
                return Err(ProtoError::Malformed {
                    what: "served versions".into(),
                    reason: format!("{pair:?}: an empty or repeated task or version"),
                });
            }
            serving.set(task, version);
        }
        Ok(serving)
    }
}

impl FromIterator<(String, String)> for Serving {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        Serving(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_protocol_form_round_trips_in_task_order() {
        let mut s = Serving::new();
        s.set("general", "eff-1");
        s.set("default", "ft-2");
        assert_eq!(s.to_string(), "default=ft-2,general=eff-1");
        assert_eq!(s.to_string().parse::<Serving>().unwrap(), s);
        assert_eq!("".parse::<Serving>().unwrap(), Serving::new());
        for bad in ["eff-1", "a=", "=b", "a=1,a=2"] {
            assert!(bad.parse::<Serving>().is_err(), "{bad}");
        }
    }
}
