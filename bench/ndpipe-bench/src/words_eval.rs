//! The pieces of `ndpipe-bench words` that need no model: the query list, scoring an answer
//! against a query's acceptable classes, the exact/substring control, and the class list with
//! its names shuffled within each task (the other control).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result, ensure};
use ndpipe_model::words::ClassName;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_pcg::Pcg64Mcg;

/// The task of ImageNet's classes.
pub(crate) const GENERAL: &str = "general";
/// The task of Fashion-MNIST's classes.
pub(crate) const FASHION: &str = "fashion";

/// One line of the query list: a query and the classes it may fairly map to.
#[derive(Debug, Clone)]
pub(crate) struct Query {
    /// `everyday`, `fashion`, `synonym` or `exact`.
    pub(crate) group: String,
    pub(crate) text: String,
    pub(crate) acceptable: Vec<ClassName>,
}

/// Reads the TSV query list (`group`, `query`, acceptable classes separated by ` | `, each
/// `TASK:CLASS` or a bare ImageNet class); every class must be one of `classes`.
pub(crate) fn read_queries(path: &Path, classes: &[ClassName]) -> Result<Vec<Query>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        ensure!(
            cols.len() == 3,
            "{}:{}: expected 3 columns",
            path.display(),
            n + 1
        );
        let acceptable = cols[2]
            .split(" | ")
            .map(|c| match c.split_once(':') {
                Some((task, class)) if task == FASHION => ClassName::new(task, class),
                _ => ClassName::new(GENERAL, c),
            })
            .collect::<Vec<_>>();
        for c in &acceptable {
            ensure!(
                classes.contains(c),
                "{}:{}: no class {c:?}",
                path.display(),
                n + 1
            );
        }
        out.push(Query {
            group: cols[0].to_string(),
            text: cols[1].to_string(),
            acceptable,
        });
    }
    Ok(out)
}

/// Whether an acceptable class is among the first `k` of `answer`.
pub(crate) fn hit(query: &Query, answer: &[ClassName], k: usize) -> bool {
    answer.iter().take(k).any(|c| query.acceptable.contains(c))
}

/// The control without a model: classes whose full name or a synonym is the query (case
/// aside), then those with a synonym that contains the query or is contained in it, nearest in
/// length first; at most `per_task` of each task.
pub(crate) fn substring_answer(
    classes: &[ClassName],
    query: &str,
    per_task: usize,
) -> Vec<ClassName> {
    let q = fold(query);
    let mut ranked: Vec<(usize, usize, usize)> = Vec::new();
    for (i, c) in classes.iter().enumerate() {
        let synonyms: Vec<String> = c
            .class
            .split(',')
            .map(fold)
            .filter(|s| !s.is_empty())
            .collect();
        let rank = if fold(&c.class) == q {
            Some((0, 0))
        } else if synonyms.contains(&q) {
            Some((1, 0))
        } else {
            synonyms
                .iter()
                .filter(|s| s.contains(&q) || q.contains(s.as_str()))
                .map(|s| (2, s.len().abs_diff(q.len())))
                .min()
        };
        if let Some((kind, distance)) = rank {
            ranked.push((kind, distance, i));
        }
    }
    ranked.sort();
    let mut per: HashMap<&str, usize> = HashMap::new();
    ranked
        .into_iter()
        .filter(|&(_, _, i)| {
            let n = per.entry(classes[i].task.as_str()).or_default();
            *n += 1;
            *n <= per_task
        })
        .map(|(_, _, i)| classes[i].clone())
        .collect()
}

fn fold(s: &str) -> String {
    s.split_whitespace()
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `classes` with the names shuffled within each task (seeded), and the map from a shuffled
/// entry back to the class whose place it took: a matcher built over the shuffled list, its
/// answers mapped back, embeds names that belong to other classes.
pub(crate) fn shuffled(
    classes: &[ClassName],
    seed: u64,
) -> (Vec<ClassName>, HashMap<ClassName, ClassName>) {
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let mut by_task: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, c) in classes.iter().enumerate() {
        by_task.entry(c.task.as_str()).or_default().push(i);
    }
    let mut out = classes.to_vec();
    for places in by_task.values() {
        let mut names: Vec<&str> = places.iter().map(|&i| classes[i].class.as_str()).collect();
        names.shuffle(&mut rng);
        for (&i, name) in places.iter().zip(names) {
            out[i] = ClassName::new(classes[i].task.clone(), name);
        }
    }
    let mut back = HashMap::new();
    for (shuffled, truth) in out.iter().zip(classes) {
        back.entry(shuffled.clone())
            .or_insert_with(|| truth.clone());
    }
    (out, back)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes() -> Vec<ClassName> {
        vec![
            ClassName::new(GENERAL, "tabby, tabby cat"),
            ClassName::new(GENERAL, "tiger cat"),
            ClassName::new(GENERAL, "coffee mug"),
            ClassName::new(FASHION, "Bag"),
            ClassName::new(FASHION, "Trouser"),
        ]
    }

    #[test]
    fn substring_control_ranks_exact_then_synonym_then_substring() {
        let c = classes();
        let names = |q| {
            substring_answer(&c, q, 3)
                .into_iter()
                .map(|c| c.class)
                .collect::<Vec<_>>()
        };
        assert_eq!(names("Tiger Cat"), ["tiger cat"]);
        assert_eq!(names("tabby cat"), ["tabby, tabby cat"]);
        assert_eq!(names("TABBY"), ["tabby, tabby cat"]);
        // Substrings: nearest in length first, then in class order.
        assert_eq!(names("cat"), ["tabby, tabby cat", "tiger cat"]);
        assert_eq!(names("big coffee mug"), ["coffee mug"]);
        assert_eq!(names("handbag"), ["Bag"]);
        assert!(names("kitty").is_empty());
        assert_eq!(substring_answer(&c, "cat", 1).len(), 1);
    }

    #[test]
    fn shuffling_keeps_tasks_and_maps_back() {
        let c = classes();
        let (s, back) = shuffled(&c, 7);
        assert_eq!(s.len(), c.len());
        for (a, b) in s.iter().zip(&c) {
            assert_eq!(a.task, b.task);
            assert_eq!(back[a], *b);
        }
        let mut names: Vec<_> = s.iter().map(|c| c.class.clone()).collect();
        names.sort();
        let mut want: Vec<_> = c.iter().map(|c| c.class.clone()).collect();
        want.sort();
        assert_eq!(names, want);
    }

    #[test]
    fn hits_count_only_the_first_k() {
        let q = Query {
            group: "everyday".into(),
            text: "kitty".into(),
            acceptable: vec![ClassName::new(GENERAL, "tiger cat")],
        };
        let answer = [
            ClassName::new(GENERAL, "coffee mug"),
            ClassName::new(GENERAL, "tiger cat"),
        ];
        assert!(!hit(&q, &answer, 1));
        assert!(hit(&q, &answer, 3));
    }
}
