//! `keys create | list | revoke`: API keys through the admin API of a running service.

use super::policies::{expect, Remote};
use anyhow::Context;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// What `keys create` sends: the fields of `POST /admin/keys`.
#[derive(Debug, Clone, Default)]
pub struct NewKey {
    /// What the key is for.
    pub name: String,
    /// Its action globs.
    pub actions: Vec<String>,
    /// Its operations; empty: the service's default (all but `admin:read`).
    pub operations: Vec<String>,
    /// When it expires (RFC 3339), if ever.
    pub expires_at: Option<String>,
}

/// Creates a key and prints it: the secret on its own line first (it is shown this once),
/// then the key as listed.
pub async fn create(remote: &Remote, key: &NewKey) -> anyhow::Result<()> {
    let mut body = json!({"name": key.name, "actions": key.actions});
    if !key.operations.is_empty() {
        body["operations"] = json!(key.operations);
    }
    if let Some(at) = &key.expires_at {
        body["expires_at"] = json!(at);
    }
    let answer = remote
        .request(Method::POST, "/admin/keys")
        .json(&body)
        .send()
        .await
        .context("reaching the service")?;
    let created = expect(answer, &[StatusCode::CREATED], "creating the key").await?;
    println!("{}", created["key"].as_str().unwrap_or_default());
    eprintln!("the key above is shown this once: store it now (only its hash is kept)");
    if created["closed_quota_endpoints"] == true {
        eprintln!(
            "this first key closed the quota endpoints: every /quota/* call now needs a \
             client token or a key"
        );
    }
    eprintln!("{}", line(&created));
    Ok(())
}

/// Prints every key, one per line (never a secret).
pub async fn list(remote: &Remote) -> anyhow::Result<()> {
    let answer = remote
        .request(Method::GET, "/admin/keys")
        .send()
        .await
        .context("reaching the service")?;
    let listed = expect(answer, &[StatusCode::OK], "listing the keys").await?;
    for key in listed["items"].as_array().into_iter().flatten() {
        println!("{}", line(key));
    }
    Ok(())
}

/// Revokes key `id` and prints it.
pub async fn revoke(remote: &Remote, id: &str) -> anyhow::Result<()> {
    let answer = remote
        .request(Method::DELETE, &format!("/admin/keys/{id}"))
        .send()
        .await
        .context("reaching the service")?;
    let revoked = expect(answer, &[StatusCode::OK], "revoking the key").await?;
    println!("{}", line(&revoked));
    Ok(())
}

/// One key on one line: id, state, prefix, name, actions, operations, expiry, last use.
fn line(key: &Value) -> String {
    let list = |field: &str| {
        key[field]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(",")
    };
    let text = |field: &str| key[field].as_str().unwrap_or("-").to_owned();
    format!(
        "{}\t{}\t{}…\t{}\tactions={}\toperations={}\texpires={}\tlast_used={}",
        text("id"),
        text("state"),
        text("prefix"),
        text("name"),
        list("actions"),
        list("operations"),
        text("expires_at"),
        text("last_used_at"),
    )
}
