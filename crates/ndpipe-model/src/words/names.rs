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

    /// The texts the class's embedding rows are made of: each synonym and, where its last word
    /// is a plain English noun, its plural. Class names are singular and searches are often
    /// plural ("jeans", "sneakers"), and a rare singular can embed poorly: the tokenizer cuts
    /// "Trouser" into `tr ##ouse ##r`, while "trousers" is one token.
    pub(crate) fn embedded_texts(&self) -> impl Iterator<Item = String> {
        self.synonyms()
            .flat_map(|s| std::iter::once(folded(s)).chain(plural(s).map(|p| folded(&p))))
    }
}

/// The plural of `text`'s last word by the regular English rules, when that word is all
/// letters and does not already end in `s`.
fn plural(text: &str) -> Option<String> {
    let last = text.rsplit(' ').next()?;
    let plain = !last.is_empty() && last.chars().all(|c| c.is_ascii_alphabetic());
    if !plain || last.ends_with(['s', 'S']) {
        return None;
    }
    let lower = last.to_ascii_lowercase();
    let before_y = lower.len().checked_sub(2).map(|i| lower.as_bytes()[i]);
    if lower.ends_with('y') && before_y.is_some_and(|b| !b"aeiou".contains(&b)) {
        // The last word is ASCII, so its last byte is a whole character.
        return Some(format!("{}ies", &text[..text.len() - 1]));
    }
    let es = lower.ends_with(['x', 'z']) || lower.ends_with("ch") || lower.ends_with("sh");
    Some(format!("{text}{}", if es { "es" } else { "s" }))
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
    fn plurals_follow_the_regular_rules() {
        let texts = |name: &str| {
            ClassName::new("t", name)
                .embedded_texts()
                .collect::<Vec<_>>()
        };
        assert_eq!(texts("Trouser"), ["trouser", "trousers"]);
        assert_eq!(texts("Ankle boot"), ["ankle boot", "ankle boots"]);
        assert_eq!(texts("box, fox"), ["box", "boxes", "fox", "foxes"]);
        assert_eq!(texts("butterfly"), ["butterfly", "butterflies"]);
        assert_eq!(texts("monkey"), ["monkey", "monkeys"]);
        assert_eq!(
            texts("peach, brush"),
            ["peach", "peaches", "brush", "brushes"]
        );
        assert_eq!(
            texts("sunglasses, dark glasses"),
            ["sunglasses", "dark glasses"]
        );
        assert_eq!(texts("T-shirt/top"), ["t-shirt/top"]);
        assert_eq!(texts("y"), ["y", "ys"]);
    }

    #[test]
    fn folding_ignores_case_and_spacing() {
        assert_eq!(folded("  Tabby\t CAT "), "tabby cat");
        assert_eq!(folded("Ankle boot"), folded("ankle  BOOT"));
        assert_eq!(folded("   "), "");
    }
}
