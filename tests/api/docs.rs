//! The documents a user reads: every route is in docs/api.md, every relative link and
//! anchor resolves, the README stays short, and no page reads like a work diary.
//! (Their shell examples are run by `scripts/examples.sh`.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The Markdown files a user reads: the root's and everything under docs/.
fn documents() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = [
        "README.md",
        "CHANGELOG.md",
        "CONTRIBUTING.md",
        "SECURITY.md",
        "ARCHITECTURE.md",
    ]
    .iter()
    .map(|f| root().join(f))
    .collect();
    let mut dirs = vec![root().join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The lines of a Markdown text outside its fenced code blocks.
fn prose(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut fenced = false;
    text.lines().enumerate().filter_map(move |(n, line)| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return None;
        }
        (!fenced).then_some((n + 1, line))
    })
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line) in prose(text) {
        if let Some(heading) = line.strip_prefix('#') {
            let heading = heading.trim_start_matches('#');
            let mut anchor = slug(heading);
            // GitHub numbers repeated headings: x, x-1, x-2 …
            let base = anchor.clone();
            let mut n = 0;
            while seen.contains(&anchor) {
                n += 1;
                anchor = format!("{base}-{n}");
            }
            seen.insert(anchor);
        }
    }
    seen
}

/// Every `](target)` link of a line.
fn links(line: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        found.push(&after[..end]);
        rest = &after[end..];
    }
    found
}

#[test]
fn every_relative_link_and_anchor_of_the_documents_resolves() {
    let mut broken = Vec::new();
    for doc in documents() {
        let text = read(&doc);
        for (n, line) in prose(&text) {
            for target in links(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
                let path = if file.is_empty() {
                    doc.clone()
                } else {
                    doc.parent().unwrap().join(file)
                };
                let shown = format!(
                    "{}:{n}: {target}",
                    doc.strip_prefix(root()).unwrap().display()
                );
                if !path.exists() {
                    broken.push(format!("{shown} (no such file)"));
                } else if !anchor.is_empty()
                    && path.extension().is_some_and(|e| e == "md")
                    && !anchors(&read(&path)).contains(anchor)
                {
                    broken.push(format!("{shown} (no such heading)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_route_of_the_api_document_is_in_docs_api_md() {
    let document: serde_json::Value =
        serde_json::from_str(&read(&root().join("openapi/openapi.json"))).unwrap();
    // docs/api.md names routes in code spans such as `GET/PUT/DELETE /admin/policies/{id}`.
    let listed: BTreeSet<(String, String)> = read(&root().join("docs/api.md"))
        .split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|span| span.split(", ").map(str::to_owned).collect::<Vec<_>>())
        .filter_map(|route| {
            let (methods, path) = route.split_once(' ')?;
            let path = path.split('?').next()?.to_owned();
            Some(
                methods
                    .split('/')
                    .map(|m| (m.to_lowercase(), path.clone()))
                    .collect::<Vec<_>>(),
            )
        })
        .flatten()
        .collect();
    let mut missing = Vec::new();
    for (path, operations) in document["paths"].as_object().unwrap() {
        for method in operations.as_object().unwrap().keys() {
            if !listed.contains(&(method.clone(), path.clone())) {
                missing.push(format!("{} {path}", method.to_uppercase()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "routes of openapi/openapi.json that docs/api.md does not list: {missing:?}"
    );
}

#[test]
fn the_readme_is_read_in_five_minutes() {
    let lines = read(&root().join("README.md")).lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; depth goes to docs/"
    );
}

/// A word of 7 to 12 hex digits with a digit and a letter: a commit id.
fn commit_id(word: &str) -> bool {
    (7..=12).contains(&word.len())
        && word
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        && word.chars().any(|c| c.is_ascii_digit())
        && word.chars().any(|c| c.is_ascii_alphabetic())
}

/// `YYYY-MM-DD` somewhere in the word.
fn date(word: &str) -> bool {
    let b = word.as_bytes();
    b.windows(10).any(|w| {
        w[..4].iter().all(u8::is_ascii_digit)
            && w[0] == b'2'
            && w[4] == b'-'
            && w[5..7].iter().all(u8::is_ascii_digit)
            && w[7] == b'-'
            && w[8..].iter().all(u8::is_ascii_digit)
    })
}

#[test]
fn the_documents_say_what_is_true_not_when_it_was_done() {
    let mut diary = Vec::new();
    for doc in documents() {
        let name = doc.strip_prefix(root()).unwrap().display().to_string();
        // The changelog is history by design; the bench's results page carries its run's date.
        if name == "CHANGELOG.md" || name == "docs/benchmarks.md" {
            continue;
        }
        let text = read(&doc);
        for (n, line) in prose(&text) {
            let lower = line.to_lowercase();
            let words: Vec<&str> = lower
                .split(|c: char| !(c.is_alphanumeric() || c == '-'))
                .filter(|w| !w.is_empty())
                .collect();
            let why = if words.iter().any(|w| date(w)) {
                Some("a date")
            } else if words.iter().any(|w| commit_id(w)) {
                Some("a commit id")
            } else if words.iter().any(|w| *w == "session" || *w == "sessions") {
                Some("a work session")
            } else if lower.contains("tried and undone") {
                Some("tried and undone")
            } else if words
                .windows(2)
                .any(|w| (w[0] == "issue" || w[0] == "issues") && w[1].parse::<u32>().is_ok())
            {
                Some("an issue number")
            } else {
                None
            };
            if let Some(why) = why {
                diary.push(format!("{name}:{n}: {why}: {}", line.trim()));
            }
        }
    }
    assert!(
        diary.is_empty(),
        "history belongs in git and the CHANGELOG:\n{}",
        diary.join("\n")
    );
}

#[test]
fn the_diary_check_catches_what_it_looks_for() {
    assert!(date("2026-11-28,"));
    assert!(!date("2026"));
    assert!(commit_id("d2813fe"));
    assert!(!commit_id("deadline"));
    assert!(!commit_id("1234567"));
    assert_eq!(
        slug("TLS, Sentinel and managed stores"),
        "tls-sentinel-and-managed-stores"
    );
    assert_eq!(
        slug("Checkpoints of the ledger's replay"),
        "checkpoints-of-the-ledgers-replay"
    );
    assert_eq!(links("see [a](b.md#c) and [d](e)"), vec!["b.md#c", "e"]);
}
