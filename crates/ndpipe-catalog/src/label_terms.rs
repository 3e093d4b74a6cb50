//! The terms under which a predicted label is indexed for search (`photo_labels`), the same
//! for both backends, so that a search is one index lookup instead of a scan of every label.
//!
//! A query matches a label when it is the whole label exactly, or, ignoring ASCII case, one of
//! the label's comma-separated class names: the text before its first `,`, or the text after a
//! `", "` up to the next `,`. So "tabby" and "Tabby Cat" find "tabby, tabby cat", and "cat"
//! finds nothing there. A single-name label (no comma) matches only exactly.

/// The kind of a term: the whole label, compared exactly.
pub(crate) const WHOLE: i32 = 0;
/// The kind of a term: one class name of the label, ASCII-lower-cased.
pub(crate) const NAME: i32 = 1;

/// The `(kind, term)` rows `label` is indexed under, without repeats.
pub(crate) fn label_terms(label: &str) -> Vec<(i32, String)> {
    let mut terms = vec![(WHOLE, label.to_owned())];
    let Some(first) = label.split_once(',').map(|(first, _)| first) else {
        return terms;
    };
    let after_separators = label
        .match_indices(", ")
        .map(|(i, sep)| label[i + sep.len()..].split(',').next().unwrap_or_default());
    let mut names: Vec<String> = std::iter::once(first)
        .chain(after_separators)
        .map(str::to_ascii_lowercase)
        .collect();
    names.sort_unstable();
    names.dedup();
    terms.extend(names.into_iter().map(|name| (NAME, name)));
    terms
}

/// The two `(kind, term)` keys a search for `query` looks up: the whole label, and a name.
pub(crate) fn query_terms(query: &str) -> [(i32, String); 2] {
    [
        (WHOLE, query.to_owned()),
        (NAME, query.to_ascii_lowercase()),
    ]
}

/// Whether a search for `query` finds a photo labelled `label` (the rules above).
pub fn label_matches(label: &str, query: &str) -> bool {
    let terms = label_terms(label);
    query_terms(query).iter().any(|q| terms.contains(q))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(label: &str) -> Vec<String> {
        label_terms(label)
            .into_iter()
            .filter(|(kind, _)| *kind == NAME)
            .map(|(_, term)| term)
            .collect()
    }

    #[test]
    fn names_are_the_comma_separated_parts_folded() {
        assert_eq!(names("tabby, Tabby Cat"), ["tabby", "tabby cat"]);
        assert_eq!(names("a, b, A"), ["a", "b"]);
        assert_eq!(names("comma,without space"), ["comma"]);
        assert_eq!(names("trailing, "), ["", "trailing"]);
        assert_eq!(names("Éclair, x"), ["x", "Éclair"]);
    }

    #[test]
    fn a_query_matches_the_whole_label_or_one_name() {
        assert!(label_matches("tabby, tabby cat", "Tabby Cat"));
        assert!(label_matches("Trouser", "Trouser"));
        assert!(!label_matches("Trouser", "trouser"));
        assert!(!label_matches("tabby, tabby cat", "cat"));
        assert!(names("Egyptian cat").is_empty());
        assert_eq!(
            label_terms("Egyptian cat"),
            [(WHOLE, "Egyptian cat".into())]
        );
    }
}
