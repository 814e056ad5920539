//! Checks that the top-level modules of `src/` depend on each other in one direction only.
//!
//! ARCHITECTURE.md draws the layers, but the compiler lets any module name any other, and
//! two modules that name each other can no longer be understood, tested or moved alone.
//! This reads every `.rs` file under `src/`, collects the `crate::NAME` paths (also
//! `$crate::`, and the heads of `use crate::{a::x, b::{y, z}}` groups) that name another
//! top-level module, and fails naming a cycle and the files that make it. Comment lines
//! (`//`, `///`, `//!`) are skipped, so doc links never count; not seen are comments after
//! code on the same line and `super::` paths that climb out of a top-level module.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;

mod engine_modules;
use std::path::{Path, PathBuf};

/// Each top-level module and the other top-level modules it names.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// One source file: its path under `src/`, its top-level module and its text.
struct Source {
    path: PathBuf,
    module: String,
    text: String,
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The identifier at the start of `text` (empty if there is none).
fn ident(text: &str) -> &str {
    &text[..text.find(|c: char| !is_ident(c)).unwrap_or(text.len())]
}

/// The first segment of each first-level item of a `{…}` group that starts after `{`.
fn group_heads(group: &str) -> Vec<&str> {
    let mut heads = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                heads.push(ident(group[start..i].trim_start()));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                heads.push(ident(group[start..i].trim_start()));
                start = i + 1;
            }
            _ => {}
        }
    }
    heads
}

/// The modules of `known`, other than `module`, that `text` names through `crate::` paths
/// outside comment lines.
fn references(module: &str, text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    references_under("crate::", module, text, known)
}

/// The modules of `known`, other than `module`, that `text` names through paths that
/// start with `prefix` (`crate::`, or `crate::engine::` for the engine's parts).
fn references_under(
    prefix: &str,
    module: &str,
    text: &str,
    known: &BTreeSet<String>,
) -> BTreeSet<String> {
    let code = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut heads = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find(prefix) {
        // A whole word: `$crate::` counts, `other_crate::` does not.
        let whole_word = !rest[..at].chars().next_back().is_some_and(is_ident);
        rest = &rest[at + prefix.len()..];
        match rest.strip_prefix('{') {
            Some(group) if whole_word => heads.extend(group_heads(group)),
            None if whole_word => heads.push(ident(rest)),
            _ => {}
        }
    }
    heads
        .into_iter()
        .filter(|head| *head != module && known.contains(*head))
        .map(str::to_owned)
        .collect()
}

/// The dependency graph of `(module, text)` pairs, one per file.
fn dependency_graph<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)>,
    known: &BTreeSet<String>,
) -> Graph {
    let mut graph = Graph::new();
    for (module, text) in files {
        let named = references(module, text, known);
        graph.entry(module.to_owned()).or_default().extend(named);
    }
    graph
}

/// One cycle of `graph`, found depth-first, as the path that closes it (`a -> b -> a`).
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit<'g>(
        node: &'g str,
        graph: &'g Graph,
        done: &mut BTreeSet<&'g str>,
        path: &mut Vec<&'g str>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|on_path| *on_path == node) {
            let cycle = path[start..].iter().chain([&node]);
            return Some(cycle.map(|n| (*n).to_owned()).collect());
        }
        if !done.insert(node) {
            return None; // explored before, from another start, and found acyclic
        }
        path.push(node);
        let found = graph
            .get(node)
            .into_iter()
            .flatten()
            .find_map(|next| visit(next, graph, done, path));
        path.pop();
        found
    }
    let mut done = BTreeSet::new();
    let mut path = Vec::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut path))
}

/// `src/foo.rs` and `src/foo/**` belong to `foo`; `src/lib.rs` and `src/main.rs` to none.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let mut parts = file.strip_prefix(src).ok()?.components();
    let first = parts.next()?.as_os_str().to_str()?;
    match (first, parts.next()) {
        (dir, Some(_)) => Some(dir.to_owned()),
        ("lib.rs" | "main.rs", None) => None,
        (file, None) => file.strip_suffix(".rs").map(str::to_owned),
    }
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display())) {
        let path = entry.expect("reading an entry of src/").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            files.push(path);
        }
    }
    files
}

/// The files of the repository's `src/`, the names of its top-level modules, and their graph.
fn repository() -> (Vec<Source>, BTreeSet<String>, Graph) {
    let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    // This file's sample texts name modules on purpose; no module may name this one.
    let this = module_path!().rsplit("::").next().expect("a last segment");
    let mut files = rust_files(src);
    files.sort();
    let sources: Vec<Source> = files
        .into_iter()
        .filter_map(|file| {
            let module = module_of(src, &file).filter(|module| module != this)?;
            let text = fs::read_to_string(&file).expect("a readable source file");
            let path = file.strip_prefix(src).ok()?.to_path_buf();
            Some(Source { path, module, text })
        })
        .collect();
    let known: BTreeSet<String> = sources.iter().map(|s| s.module.clone()).collect();
    let pairs = sources.iter().map(|s| (s.module.as_str(), s.text.as_str()));
    let graph = dependency_graph(pairs, &known);
    assert!(
        graph.values().any(|named| !named.is_empty()),
        "no module names another: is {} the source tree, and does the parser work?",
        src.display()
    );
    (sources, known, graph)
}

/// The most lines a source file may have: past it, a file holds more than one job.
const MOST_LINES: usize = 600;

#[test]
fn no_source_file_is_longer_than_one_job() {
    let (sources, _, _) = repository();
    let long: Vec<String> = sources
        .iter()
        .filter(|s| s.text.lines().count() > MOST_LINES)
        .map(|s| {
            format!(
                "src/{} ({} lines)",
                s.path.display(),
                s.text.lines().count()
            )
        })
        .collect();
    assert!(long.is_empty(), "over {MOST_LINES} lines: {long:?}");
}

/// What each top-level module may name: the layers of ARCHITECTURE.md, from the bottom.
/// The ports live in `engine`; adapters (`counters`, `ledger`, `policy`) implement them;
/// only `startup` names the adapters together.
const LAYERS: &[(&str, &str)] = &[
    ("domain", ""),
    ("clock", ""),
    ("logs", ""),
    ("tls", ""),
    ("db", "tls"),
    ("telemetry", "logs"),
    ("keys", "domain"),
    ("access", "domain clock config"),
    ("engine", "domain clock keys logs"),
    ("counters", "engine domain clock keys logs tls"),
    ("ledger", "engine domain clock db logs"),
    ("policy", "engine domain db access"),
    ("metrics", "engine domain"),
    ("config", "engine domain"),
    ("admission", "engine logs"),
    ("webhooks", "engine domain clock db logs"),
    (
        "api",
        "engine domain clock keys policy metrics config logs telemetry admission access webhooks",
    ),
    ("cli", "api domain"),
    ("grpc", "engine domain config metrics admission access"),
    (
        "startup",
        "api engine domain clock counters ledger policy metrics config db grpc admission access logs webhooks tls",
    ),
];

/// The modules `module` names that [`LAYERS`] does not allow it to (all it names, if the
/// table does not list it).
fn violations(graph: &Graph, layers: &[(&str, &str)]) -> Vec<String> {
    let mut found = Vec::new();
    for (module, named) in graph {
        let allowed = layers
            .iter()
            .find(|(m, _)| m == module)
            .map(|(_, allowed)| names(allowed));
        for other in named {
            match &allowed {
                Some(allowed) if allowed.contains(other) => {}
                Some(_) => found.push(format!("{module} -> {other}")),
                None => found.push(format!("{module} -> {other} ({module} is not in LAYERS)")),
            }
        }
    }
    found
}

#[test]
fn each_top_level_module_names_only_the_layers_below_it() {
    let (_, _, graph) = repository();
    let found = violations(&graph, LAYERS);
    assert!(
        found.is_empty(),
        "modules name what their layer may not (ARCHITECTURE.md, \"Dependency direction\"):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_layer_check_reports_a_dependency_that_points_up() {
    let graph = graph_of("engine->domain engine->ledger extra->domain");
    let layers = [("engine", "domain"), ("domain", "")];
    assert_eq!(
        violations(&graph, &layers),
        [
            "engine -> ledger",
            "extra -> domain (extra is not in LAYERS)"
        ]
    );
}

#[test]
fn top_level_modules_depend_on_each_other_in_one_direction_only() {
    let (sources, known, graph) = repository();
    let Some(cycle) = find_cycle(&graph) else {
        return;
    };
    let mut message = format!(
        "top-level modules depend on each other in a cycle: {}\n(ARCHITECTURE.md, \
         \"Dependency direction\": move the shared type down, or add a port below)",
        cycle.join(" -> ")
    );
    for step in cycle.windows(2) {
        let files: Vec<String> = sources
            .iter()
            .filter(|s| s.module == step[0])
            .filter(|s| references(&s.module, &s.text, &known).contains(&step[1]))
            .map(|s| format!("src/{}", s.path.display()))
            .collect();
        message += &format!("\n  {} -> {}: in {}", step[0], step[1], files.join(", "));
    }
    panic!("{message}");
}

/// The set of the space-separated `names`.
fn names(names: &str) -> BTreeSet<String> {
    names.split_whitespace().map(str::to_owned).collect()
}

/// A graph from edges written `from->to`, separated by spaces.
fn graph_of(edges: &str) -> Graph {
    let mut graph = Graph::new();
    for (from, to) in edges.split_whitespace().filter_map(|e| e.split_once("->")) {
        graph
            .entry(from.to_owned())
            .or_default()
            .insert(to.to_owned());
    }
    graph
}

#[test]
fn the_dependency_checker_finds_a_cycle() {
    let cyclic = graph_of("api->domain api->engine engine->ledger ledger->policy policy->engine");
    let cycle = find_cycle(&cyclic).expect("engine -> ledger -> policy -> engine is a cycle");
    assert_eq!(cycle, ["engine", "ledger", "policy", "engine"]);
    let layered = graph_of(
        "api->engine api->domain counters->engine counters->keys \
         engine->keys engine->domain keys->domain",
    );
    assert_eq!(find_cycle(&layered), None, "a diamond is not a cycle");
}

#[test]
fn crate_paths_in_code_count_and_those_in_comment_lines_do_not() {
    let known = names("api clock domain engine keys ledger metrics policy");
    let text = "\
//! Notes on [`crate::ledger::LedgerEntry`].
use crate::{engine::X, domain::{A, B}};
use crate::{
    self,
    keys::shard,
};
use crate::policy::Own; // the file's own module
/// see [crate::api]
fn f(_: other_crate::metrics::Z, _: crate::unknown::Y) -> crate::clock::Now {}
";
    let graph = dependency_graph([("policy", text)], &known);
    let expected = names("clock domain engine keys");
    assert_eq!(graph.get("policy"), Some(&expected));
}

#[test]
fn a_file_belongs_to_the_top_level_module_it_sits_under() {
    let src = Path::new("/repo/src");
    let module = |file: &str| module_of(src, &src.join(file)).unwrap_or_default();
    let files = "keys.rs engine/mod.rs counters/memory/counting.rs lib.rs main.rs";
    let modules: Vec<String> = files.split(' ').map(module).collect();
    assert_eq!(modules, ["keys", "engine", "counters", "", ""]);
}

/// What each part of the engine may name (ARCHITECTURE.md, "The engine's three jobs"):
/// the ledger pipeline only the ports and shared types at the engine's root (`ports`: every
/// file there but `mod.rs`, which holds the engine and its wiring, and `deployment`, the
/// mode chosen in startup); the decision path also the pipeline it hands each decided
/// change to (and reaches recovery only through the `followup` port); recovery replays
/// with the decision path's arithmetic and pauses the pipeline for a cut. The ports name
/// no part. Each part is a type with private fields (`Decider`, `Pipeline`, `Recovery`), so
/// what this check reads by path the compiler holds by privacy.
const ENGINE_PARTS: &[(&str, &str)] = &[
    ("ports", ""),
    ("decision", "pipeline"),
    ("pipeline", ""),
    ("recovery", "decision pipeline"),
];

/// The engine's part that `file` (under `src/engine/`) belongs to; `None` for the hub.
fn engine_part(file: &Path) -> Option<String> {
    let mut parts = file.components().map(|c| c.as_os_str().to_string_lossy());
    let first = parts.next()?;
    let nested = parts.next().is_some();
    match first.as_ref() {
        "mod.rs" | "deployment.rs" | "deployment" => None,
        part @ ("decision" | "pipeline" | "recovery") if nested => Some(part.to_owned()),
        _ => Some("ports".to_owned()),
    }
}

#[test]
fn each_part_of_the_engine_names_only_what_its_job_may() {
    let (sources, _, _) = repository();
    let known = names("decision pipeline recovery");
    let mut graph = Graph::new();
    let mut climbing = Vec::new();
    for source in sources.iter().filter(|s| s.module == "engine") {
        let file = source.path.strip_prefix("engine").expect("an engine file");
        let Some(part) = engine_part(file) else {
            continue;
        };
        // The parts name each other by `crate::engine::` paths, which this check reads.
        if part != "ports" && source.text.contains("super::super::") {
            climbing.push(format!("src/{}", source.path.display()));
        }
        let named = references_under("crate::engine::", &part, &source.text, &known);
        graph.entry(part).or_default().extend(named);
    }
    assert!(
        climbing.is_empty(),
        "name the engine's parts by crate::engine:: paths, not super::super:: in {climbing:?}"
    );
    let found = violations(&graph, ENGINE_PARTS);
    assert!(
        found.is_empty(),
        "parts of the engine name what their job may not (ARCHITECTURE.md):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_engine_part_check_reads_engine_paths() {
    let known = names("decision pipeline recovery");
    let text = "use crate::engine::{pipeline::drain::Drainer, store::Charge};\n\
                // crate::engine::recovery in a comment\n\
                let x = crate::engine::decision::plan::Plan::new();";
    assert_eq!(
        references_under("crate::engine::", "ports", text, &known),
        names("decision pipeline")
    );
    assert_eq!(
        engine_part(Path::new("decision/plan.rs")).as_deref(),
        Some("decision")
    );
    assert_eq!(
        engine_part(Path::new("store/mod.rs")).as_deref(),
        Some("ports")
    );
    assert_eq!(engine_part(Path::new("mod.rs")), None);
}
