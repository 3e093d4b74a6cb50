//! Class names as a search sees them: the (task, class) pairs, their synonyms, and the
//! case- and space-insensitive form names and queries are compared in.

use serde::{Deserialize, Serialize};

/// One class of one task: what a photo can be labelled with. ImageNet's names list synonyms
/// separated by commas (`tabby, tabby cat`); each is matched on its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClassName {
    /// The task (classifier) the class belongs to, e.g. `general`.
    pub task: String,
    /// The class name exactly as labels carry it.
    pub class: String,
}

impl ClassName {
    /// The class `class` of task `task`.
    pub fn new(task: impl Into<String>, class: impl Into<String>) -> Self {
        ClassName {
            task: task.into(),
            class: class.into(),
        }
    }

    /// The class name's synonyms: its comma-separated parts, trimmed, empty ones left out (a
    /// name without a comma is its own one synonym).
    pub(crate) fn synonyms(&self) -> impl Iterator<Item = &str> {
        self.class
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
    }
}

/// The form names and queries are compared in: lower case, runs of white space as one space,
/// no space at either end.
pub(crate) fn folded(text: &str) -> String {
    text.split_whitespace()
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synonyms_are_the_comma_separated_parts() {
        let c = ClassName::new("general", "tabby, tabby cat");
        assert_eq!(c.synonyms().collect::<Vec<_>>(), ["tabby", "tabby cat"]);
        let one = ClassName::new("fashion", "T-shirt/top");
        assert_eq!(one.synonyms().collect::<Vec<_>>(), ["T-shirt/top"]);
        let odd = ClassName::new("t", " a,, b ,");
        assert_eq!(odd.synonyms().collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn folding_ignores_case_and_spacing() {
        assert_eq!(folded("  Tabby\t CAT "), "tabby cat");
        assert_eq!(folded("Ankle boot"), folded("ankle  BOOT"));
        assert_eq!(folded("   "), "");
    }
}
