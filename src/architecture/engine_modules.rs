//! Checks that the modules inside `src/engine` depend on each other in one direction only,
//! as the top-level modules do: a cycle among them (`deployment` naming `recovery::shards`,
//! which names `deployment` back through `recovery::verify`) means two files that cannot be
//! read, tested or moved alone. Each file is a node (`recovery::shards`, `codec::entry`);
//! the engine's root (`engine/mod.rs`, the composition) is left out, since every part is
//! wired there. A file names another through `crate::engine::…`, `super::…` and `self::…`
//! paths (groups expanded); the longest module path a path starts with is the one it names.

use super::{find_cycle, is_ident, repository, Graph};
use std::collections::BTreeSet;
use std::path::Path;

/// The module path of `file` (relative to `src/engine/`), as `recovery::shards`; empty for
/// the engine's root.
fn engine_module(file: &Path) -> String {
    let mut parts: Vec<String> = file
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.last_mut() {
        *last = last.trim_end_matches(".rs").to_owned();
    }
    if parts.last().is_some_and(|last| last == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// The paths a path or `use` tree that starts `text` names, its groups expanded:
/// `a::{b, c::{d, self}}` names `a::b`, `a::c::d` and `a::c`.
fn expand(text: &str) -> Vec<String> {
    let head_len = text
        .find(|c: char| !(is_ident(c) || c == ':'))
        .unwrap_or(text.len());
    let head = &text[..head_len];
    let Some(group) = text[head_len..].strip_prefix('{') else {
        return vec![head.to_owned()];
    };
    let mut paths = Vec::new();
    let mut item = |item: &str| {
        let item = item.trim();
        if !item.is_empty() {
            paths.extend(expand(item).into_iter().map(|tail| format!("{head}{tail}")));
        }
    };
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                item(&group[start..i]);
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                item(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    paths
}

/// The engine modules of `known`, other than `module` and the root, that `text` (the
/// code of `module`'s file) names.
fn named_modules(module: &str, text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let own: Vec<&str> = module.split("::").filter(|s| !s.is_empty()).collect();
    let mut named = BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        let mut rest = line;
        while let Some(at) = ["crate::engine::", "super::", "self::"]
            .iter()
            .filter_map(|prefix| rest.find(prefix).map(|at| (at, *prefix)))
            .min()
        {
            let (at, prefix) = at;
            let whole_word = !rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| is_ident(c) || c == ':');
            let mut tail = &rest[at + prefix.len()..];
            let mut base: Vec<&str> = match prefix {
                "crate::engine::" => Vec::new(),
                "self::" => own.clone(),
                _ => own[..own.len().saturating_sub(1)].to_vec(),
            };
            while let Some(more) = tail.strip_prefix("super::") {
                base.pop();
                tail = more;
            }
            if whole_word {
                for path in expand(tail) {
                    let segments: Vec<&str> = base
                        .iter()
                        .copied()
                        .chain(path.split("::").filter(|s| !s.is_empty() && *s != "self"))
                        .collect();
                    let target = (1..=segments.len())
                        .rev()
                        .map(|n| segments[..n].join("::"))
                        .find(|candidate| known.contains(candidate));
                    if let Some(target) = target.filter(|t| t != module) {
                        named.insert(target);
                    }
                }
            }
            rest = tail;
        }
    }
    named
}

/// The graph of `(module, text)` pairs of the engine's files (the root left out).
fn engine_graph<'a>(files: impl IntoIterator<Item = (String, &'a str)> + Clone) -> Graph {
    let known: BTreeSet<String> = files
        .clone()
        .into_iter()
        .map(|(module, _)| module)
        .filter(|module| !module.is_empty())
        .collect();
    let mut graph = Graph::new();
    for (module, text) in files {
        if module.is_empty() {
            continue;
        }
        let named = named_modules(&module, text, &known);
        graph.entry(module).or_default().extend(named);
    }
    graph
}

#[test]
fn the_engines_modules_depend_on_each_other_in_one_direction_only() {
    let (sources, _, _) = repository();
    let files: Vec<(String, &str)> = sources
        .iter()
        .filter(|s| s.module == "engine")
        .map(|s| {
            let file = s.path.strip_prefix("engine").expect("an engine file");
            (engine_module(file), s.text.as_str())
        })
        .collect();
    let graph = engine_graph(files.iter().map(|(m, t)| (m.clone(), *t)));
    assert!(
        graph.len() > 20 && graph.values().any(|named| !named.is_empty()),
        "the engine's files were not read: {graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "modules of src/engine depend on each other in a cycle: {}\n(move the shared \
             type down to a port at the engine's root, or split the module)",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn the_engine_module_check_resolves_paths_and_finds_a_cycle() {
    assert_eq!(engine_module(Path::new("recovery/mod.rs")), "recovery");
    assert_eq!(
        engine_module(Path::new("recovery/shards.rs")),
        "recovery::shards"
    );
    assert_eq!(
        expand("a::{b, c::{d, self}}; x"),
        vec!["a::b", "a::c::d", "a::c::self"]
    );
    let graph = engine_graph([
        (
            "recovery::cut".to_owned(),
            "use super::shards::{Cut, ShardStates};",
        ),
        (
            "recovery::shards".to_owned(),
            "let v = crate::engine::deployment::Deployment::x();",
        ),
        (
            "deployment".to_owned(),
            "// use super::recovery in a comment\nuse super::recovery::{cut::Read, shards::Cut};",
        ),
        ("recovery".to_owned(), "mod cut; use self::cut::Cut;"),
        (String::new(), "use self::deployment::Deployment;"),
    ]);
    assert_eq!(
        graph["deployment"],
        ["recovery::cut", "recovery::shards"]
            .map(str::to_owned)
            .into_iter()
            .collect()
    );
    assert_eq!(
        find_cycle(&graph),
        Some(
            [
                "deployment",
                "recovery::cut",
                "recovery::shards",
                "deployment"
            ]
            .map(str::to_owned)
            .to_vec()
        )
    );
}
