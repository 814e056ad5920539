//! Policies as code: `quota-ledger policies export | diff | apply`, over the admin API.
//!
//! A policy file is YAML or JSON, `{"policies": [<policy as in the API>]}`. Server-set
//! fields (`created_at`, `updated_at`, `version`) are ignored. The whole file is validated
//! with the service's own rules before anything is read from the service or changed, and
//! every invalid entry is named with its field. Policies are compared in their canonical
//! form (defaults filled in), so an `export` applied again changes nothing. Updates and
//! deletes are conditional (`If-Match` with the version the plan was made from): a policy
//! someone changed meanwhile is reported as a conflict, never overwritten.

use crate::api::dto::{PolicyInput, PolicyOut};
use crate::domain::{Policy, PolicyId, PolicySpec};
use anyhow::{anyhow, bail, Context};
use reqwest::{Method, StatusCode};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Fields the service sets; ignored in a file, left out of an export.
const SERVER_SET: [&str; 3] = ["created_at", "updated_at", "version"];

/// Exit status of the commands, fit for CI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Done; for `diff`, nothing would change.
    Done = 0,
    /// The file is invalid, or the service refused or could not be reached.
    Failed = 1,
    /// `diff`: something would change.
    Changes = 2,
    /// `apply`: a policy changed on the service after it was read; nothing of it was
    /// overwritten. Run `diff` again.
    Conflict = 3,
}

/// The admin API of one service.
#[derive(Debug, Clone)]
pub struct Remote {
    base: String,
    token: String,
    client: reqwest::Client,
}

impl Remote {
    /// The service at `base` (e.g. `http://127.0.0.1:8080`), with the admin token.
    pub fn new(base: &str, token: &str) -> anyhow::Result<Self> {
        let base = base.trim_end_matches('/').to_owned();
        anyhow::ensure!(
            base.starts_with("http://") || base.starts_with("https://"),
            "--url must be an http:// or https:// URL (got {base})"
        );
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .context("building the HTTP client")?;
        Ok(Self {
            base,
            token: token.to_owned(),
            client,
        })
    }

    /// A request to `path` with the admin token.
    pub(crate) fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
    }

    /// Every policy on the service, by id: its canonical form and its version.
    async fn policies(&self) -> anyhow::Result<BTreeMap<String, (Value, i64)>> {
        let answer = self
            .request(Method::GET, "/admin/policies")
            .send()
            .await
            .with_context(|| format!("reaching {}", self.base))?;
        let body = expect(answer, &[StatusCode::OK], "listing the policies").await?;
        let mut policies = BTreeMap::new();
        for item in body["items"].as_array().into_iter().flatten() {
            let version = item["version"].as_i64().unwrap_or_default();
            let (id, spec) = parse_entry(item.clone()).map_err(|errors| {
                anyhow!("the service sent a policy we cannot read: {errors:?}")
            })?;
            policies.insert(id.to_string(), (canonical(id, spec), version));
        }
        Ok(policies)
    }
}

/// The body of `answer` if its status is one of `ok`, else an error with the problem's
/// detail.
pub(crate) async fn expect(
    answer: reqwest::Response,
    ok: &[StatusCode],
    what: &str,
) -> anyhow::Result<Value> {
    let status = answer.status();
    let body: Value = answer.json().await.unwrap_or(Value::Null);
    if ok.contains(&status) {
        return Ok(body);
    }
    let detail = body["detail"].as_str().unwrap_or("no detail");
    let fields: Vec<String> = body["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| format!("{}: {}", e["field"], e["message"]))
        .collect();
    bail!("{what}: the service answered {status}: {detail} {fields:?}")
}

/// One entry of a file or of the service: validated with the service's rules.
fn parse_entry(mut entry: Value) -> Result<(PolicyId, PolicySpec), Vec<String>> {
    if let Some(object) = entry.as_object_mut() {
        for field in SERVER_SET {
            object.remove(field);
        }
    }
    let input: PolicyInput = serde_path_to_error::deserialize(&entry).map_err(|error| {
        let path = error.path().to_string();
        vec![match path.as_str() {
            "." => error.inner().to_string(),
            _ => format!("field `{path}`: {}", error.inner()),
        }]
    })?;
    let (id, spec) = input.parse().map_err(|errors| {
        errors
            .0
            .iter()
            .map(|e| format!("field `{}`: {}", e.field, e.message))
            .collect::<Vec<_>>()
    })?;
    let id = id.ok_or_else(|| vec!["field `id`: is required".to_owned()])?;
    Ok((id, spec))
}

/// A policy as the API writes it, without the server-set fields: what an export prints and
/// what plans compare.
fn canonical(id: PolicyId, spec: PolicySpec) -> Value {
    let epoch = chrono::DateTime::UNIX_EPOCH;
    let policy = Policy {
        id,
        spec,
        created_at: epoch,
        updated_at: epoch,
        version: 0,
    };
    let mut value = serde_json::to_value(PolicyOut::from(&policy)).unwrap_or(Value::Null);
    if let Some(object) = value.as_object_mut() {
        for field in SERVER_SET {
            object.remove(field);
        }
    }
    value
}

/// The policies of a file, by id, in canonical form; or every problem found in it, each
/// naming its entry and field.
pub fn read_file(text: &str) -> Result<BTreeMap<String, Value>, Vec<String>> {
    // YAML 1.2 is a superset of JSON: one parser reads both.
    let file: Value =
        yaml_serde::from_str(text).map_err(|e| vec![format!("not YAML or JSON: {e}")])?;
    let Some(object) = file.as_object() else {
        return Err(vec![
            "the file must be an object: {\"policies\": [...]}".to_owned()
        ]);
    };
    if let Some(other) = object.keys().find(|k| *k != "policies") {
        return Err(vec![format!(
            "unknown top-level field `{other}` (only `policies`)"
        )]);
    }
    let Some(entries) = object.get("policies").and_then(Value::as_array) else {
        return Err(vec!["`policies` must be a list of policies".to_owned()]);
    };
    let (mut policies, mut problems) = (BTreeMap::new(), Vec::new());
    for (i, entry) in entries.iter().enumerate() {
        let name = match entry["id"].as_str() {
            Some(id) => format!("policies[{i}] (id {id})"),
            None => format!("policies[{i}]"),
        };
        match parse_entry(entry.clone()) {
            Ok((id, spec)) => {
                let key = id.to_string();
                if policies.insert(key.clone(), canonical(id, spec)).is_some() {
                    problems.push(format!("{name}: field `id`: `{key}` appears twice"));
                }
            }
            Err(errors) => problems.extend(errors.into_iter().map(|e| format!("{name}: {e}"))),
        }
    }
    match problems.is_empty() {
        true => Ok(policies),
        false => Err(problems),
    }
}

/// One change a plan makes.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A policy the file has and the service does not.
    Create {
        /// Its id.
        id: String,
        /// The body to `POST`.
        body: Value,
    },
    /// A policy whose fields differ.
    Update {
        /// Its id.
        id: String,
        /// The version the plan was made from (`If-Match`).
        version: i64,
        /// The body to `PUT`.
        body: Value,
        /// `(field, on the service, in the file)`, compact JSON.
        fields: Vec<(String, String, String)>,
    },
    /// A policy the file omits (with `--prune` only).
    Delete {
        /// Its id.
        id: String,
        /// The version the plan was made from (`If-Match`).
        version: i64,
    },
}

/// What `apply` would do.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// The changes: creates, then updates, then deletes, each by id.
    pub changes: Vec<Change>,
    /// Policies on the service that the file omits and that are kept (no `--prune`).
    pub kept: Vec<String>,
}

/// The plan that makes the service's policies match `file` (deleting the others only with
/// `prune`).
pub async fn plan(
    remote: &Remote,
    file: &BTreeMap<String, Value>,
    prune: bool,
) -> anyhow::Result<Plan> {
    let current = remote.policies().await?;
    let mut plan = Plan::default();
    let mut updates = Vec::new();
    for (id, desired) in file {
        match current.get(id) {
            None => plan.changes.push(Change::Create {
                id: id.clone(),
                body: desired.clone(),
            }),
            Some((now, version)) if now != desired => updates.push(Change::Update {
                id: id.clone(),
                version: *version,
                body: desired.clone(),
                fields: differences(now, desired),
            }),
            Some(_) => {}
        }
    }
    plan.changes.extend(updates);
    for (id, (_, version)) in current.iter().filter(|(id, _)| !file.contains_key(*id)) {
        match prune {
            true => plan.changes.push(Change::Delete {
                id: id.clone(),
                version: *version,
            }),
            false => plan.kept.push(id.clone()),
        }
    }
    Ok(plan)
}

fn differences(now: &Value, desired: &Value) -> Vec<(String, String, String)> {
    let empty = Map::new();
    let (now, desired) = (
        now.as_object().unwrap_or(&empty),
        desired.as_object().unwrap_or(&empty),
    );
    let mut fields: Vec<&String> = now.keys().chain(desired.keys()).collect();
    fields.sort();
    fields.dedup();
    fields
        .into_iter()
        .filter(|f| now.get(*f) != desired.get(*f))
        .map(|f| {
            let show = |v: Option<&Value>| v.map_or_else(|| "(none)".to_owned(), Value::to_string);
            (f.clone(), show(now.get(f)), show(desired.get(f)))
        })
        .collect()
}

impl Plan {
    /// The plan, one line per change, and a summary.
    pub fn describe(&self) -> String {
        let mut text = String::new();
        let (mut creates, mut updates, mut deletes) = (0, 0, 0);
        for change in &self.changes {
            match change {
                Change::Create { id, .. } => {
                    creates += 1;
                    let _ = writeln!(text, "+ {id}: create");
                }
                Change::Update { id, fields, .. } => {
                    updates += 1;
                    let _ = writeln!(text, "~ {id}: update");
                    for (field, now, desired) in fields {
                        let _ = writeln!(text, "    {field}: {now} -> {desired}");
                    }
                }
                Change::Delete { id, .. } => {
                    deletes += 1;
                    let _ = writeln!(text, "- {id}: delete");
                }
            }
        }
        if !self.kept.is_empty() {
            let _ = writeln!(
                text,
                "  kept, not in the file (--prune deletes them): {}",
                self.kept.join(", ")
            );
        }
        let _ = write!(
            text,
            "{creates} to create, {updates} to update, {deletes} to delete"
        );
        text
    }
}

/// What `apply` did.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// The changes made, as `describe` lines.
    pub done: Vec<String>,
    /// The change that met a conflict (a policy changed or appeared meanwhile), if any;
    /// nothing after it was attempted.
    pub conflict: Option<String>,
}

/// Makes the changes of `plan`, in order, each conditional on what the plan saw. Stops at
/// the first conflict.
pub async fn execute(remote: &Remote, plan: &Plan) -> anyhow::Result<Applied> {
    let mut applied = Applied {
        done: Vec::new(),
        conflict: None,
    };
    for change in &plan.changes {
        let (request, ok, label, id) = match change {
            Change::Create { id, body } => (
                remote.request(Method::POST, "/admin/policies").json(body),
                StatusCode::CREATED,
                "created",
                id,
            ),
            Change::Update {
                id, version, body, ..
            } => (
                remote
                    .request(Method::PUT, &format!("/admin/policies/{id}"))
                    .header("If-Match", format!("\"{version}\""))
                    .json(body),
                StatusCode::OK,
                "updated",
                id,
            ),
            Change::Delete { id, version } => (
                remote
                    .request(Method::DELETE, &format!("/admin/policies/{id}"))
                    .header("If-Match", format!("\"{version}\"")),
                StatusCode::NO_CONTENT,
                "deleted",
                id,
            ),
        };
        let answer = request
            .send()
            .await
            .with_context(|| format!("reaching {}", remote.base))?;
        match answer.status() {
            status if status == ok => applied.done.push(format!("{id}: {label}")),
            StatusCode::CONFLICT | StatusCode::PRECONDITION_FAILED | StatusCode::NOT_FOUND => {
                applied.conflict = Some(format!(
                    "{id}: changed on the service since it was read ({}); not overwritten",
                    answer.status()
                ));
                return Ok(applied);
            }
            _ => {
                expect(answer, &[ok], &format!("{id}: {label}")).await?;
            }
        }
    }
    Ok(applied)
}

/// `export`: every policy of the service as a policy file (YAML, or JSON with `json`).
pub async fn export(remote: &Remote, json_format: bool) -> anyhow::Result<String> {
    let policies: Vec<Value> = remote
        .policies()
        .await?
        .into_values()
        .map(|(p, _)| p)
        .collect();
    let mut file = yaml_serde::Mapping::new();
    file.insert(
        "policies".into(),
        yaml_serde::Value::Sequence(policies.iter().map(in_field_order).collect()),
    );
    let file = yaml_serde::Value::Mapping(file);
    Ok(match json_format {
        true => format!("{}\n", serde_json::to_string_pretty(&file)?),
        false => yaml_serde::to_string(&file).context("writing YAML")?,
    })
}

/// The order an exported policy's fields are written in: the API's, `id` first, so that a
/// file reads (and diffs) like the policies it came from. Nested objects keep theirs.
const FIELD_ORDER: [&str; 15] = [
    "id",
    "action",
    "measure",
    "unit",
    "limit",
    "window",
    "scope",
    "match",
    "match_not",
    "mode",
    "enabled",
    "ledger_denials",
    "record",
    "alert_thresholds",
    "description",
];

/// `policy` as YAML with its fields in [`FIELD_ORDER`] (any other field after them), and its
/// window's `type` first.
fn in_field_order(policy: &Value) -> yaml_serde::Value {
    ordered(policy, &FIELD_ORDER)
}

/// The object `value` as a YAML mapping with the fields `first` names first, in that order,
/// then the others; a `window` inside is ordered with its `type` first.
fn ordered(value: &Value, first: &[&str]) -> yaml_serde::Value {
    let Some(fields) = value.as_object() else {
        return yaml_serde::to_value(value).unwrap_or(yaml_serde::Value::Null);
    };
    let known = first.iter().filter_map(|k| Some((*k, fields.get(*k)?)));
    let rest = fields
        .iter()
        .filter(|(k, _)| !first.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v));
    let mut mapping = yaml_serde::Mapping::new();
    for (key, value) in known.chain(rest) {
        let value = match key {
            "window" => ordered(value, &["type"]),
            _ => yaml_serde::to_value(value).unwrap_or(yaml_serde::Value::Null),
        };
        mapping.insert(key.into(), value);
    }
    yaml_serde::Value::Mapping(mapping)
}

/// Reads and validates the file at `path`: its policies, or every problem printed on
/// standard error and `Err(Exit::Failed)`.
pub fn load(path: &std::path::Path) -> Result<BTreeMap<String, Value>, Exit> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) => {
            eprintln!("{}: {error}", path.display());
            return Err(Exit::Failed);
        }
    };
    read_file(&text).map_err(|problems| {
        for problem in &problems {
            eprintln!("{}: {problem}", path.display());
        }
        eprintln!(
            "{}: {} problem(s); nothing was changed",
            path.display(),
            problems.len()
        );
        Exit::Failed
    })
}

#[cfg(test)]
mod tests;
