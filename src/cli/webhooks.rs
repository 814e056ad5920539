//! `webhooks create | list | enable | disable | delete | rotate-secret | test |
//! deliveries`: alert endpoints through the admin API of a running service.

use super::policies::{expect, Remote};
use anyhow::Context;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// The `webhooks` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Create an endpoint; prints its signing secret (shown this once) on stdout, and the
    /// endpoint as listed on stderr.
    Create {
        /// Its id ([A-Za-z0-9_.-], 1-64).
        #[arg(long)]
        id: String,
        /// The endpoint's URL, where events are POSTed (http or https; public addresses
        /// only unless the service allows private ones). `--url` is the service's.
        #[arg(long, value_name = "URL")]
        endpoint: String,
        /// Event types, comma-separated (budget.threshold, budget.threshold.resolved,
        /// webhook.test); default: all.
        #[arg(long, value_delimiter = ',')]
        events: Vec<String>,
        /// Action globs, comma-separated (sms.*); default: all.
        #[arg(long, value_delimiter = ',')]
        actions: Vec<String>,
    },
    /// List every endpoint (never a secret): id, state, URL, events, actions.
    List,
    /// Resume deliveries to an endpoint (its pending ones go out again).
    Enable {
        /// The endpoint's id.
        id: String,
    },
    /// Stop deliveries to an endpoint; its events wait, pending.
    Disable {
        /// The endpoint's id.
        id: String,
    },
    /// Delete an endpoint and its deliveries.
    Delete {
        /// The endpoint's id.
        id: String,
    },
    /// Make a new signing secret, printed on stdout (the old one also signs for 24 h).
    RotateSecret {
        /// The endpoint's id.
        id: String,
    },
    /// Send a `webhook.test` event to an endpoint; prints its event id.
    Test {
        /// The endpoint's id.
        id: String,
    },
    /// Print an endpoint's newest deliveries, one per line: event id, type, state,
    /// attempts, last status, last error, next attempt.
    Deliveries {
        /// The endpoint's id.
        id: String,
        /// How many (1-500).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
}

/// Runs `command` against the service.
pub async fn run(remote: &Remote, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Create {
            id,
            endpoint,
            events,
            actions,
        } => {
            let mut body = json!({"id": id, "url": endpoint});
            if !events.is_empty() {
                body["events"] = json!(events);
            }
            if !actions.is_empty() {
                body["actions"] = json!(actions);
            }
            let created = call(remote, Method::POST, "/admin/webhooks", Some(body)).await?;
            println!("{}", created["secret"].as_str().unwrap_or_default());
            eprintln!("the secret above is shown this once: give it to the receiver now");
            eprintln!("{}", line(&created));
        }
        Command::List => {
            let listed = call(remote, Method::GET, "/admin/webhooks", None).await?;
            for endpoint in listed["items"].as_array().into_iter().flatten() {
                println!("{}", line(endpoint));
            }
        }
        Command::Enable { id } => println!("{}", line(&switch(remote, &id, true).await?)),
        Command::Disable { id } => println!("{}", line(&switch(remote, &id, false).await?)),
        Command::Delete { id } => {
            call(remote, Method::DELETE, &path(&id, ""), None).await?;
            eprintln!("deleted {id}");
        }
        Command::RotateSecret { id } => {
            let rotated = call(remote, Method::POST, &path(&id, "/rotate-secret"), None).await?;
            println!("{}", rotated["secret"].as_str().unwrap_or_default());
            eprintln!(
                "the secret above is shown this once; the previous one also signs until {}",
                rotated["previous_valid_until"].as_str().unwrap_or("-")
            );
        }
        Command::Test { id } => {
            let sent = call(remote, Method::POST, &path(&id, "/test"), None).await?;
            println!("{}", sent["event_id"].as_str().unwrap_or_default());
        }
        Command::Deliveries { id, limit } => {
            let listed = call(
                remote,
                Method::GET,
                &path(&id, &format!("/deliveries?limit={limit}")),
                None,
            )
            .await?;
            for delivery in listed["items"].as_array().into_iter().flatten() {
                println!("{}", delivery_line(delivery));
            }
        }
    }
    Ok(())
}

/// `/admin/webhooks/{id}` then `rest`.
fn path(id: &str, rest: &str) -> String {
    let id: String = url_escape(id);
    format!("/admin/webhooks/{id}{rest}")
}

/// `id` with every byte outside the unreserved set percent-encoded.
fn url_escape(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One admin call; the answer's body when it succeeded (2xx), else an error.
async fn call(
    remote: &Remote,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<Value> {
    let what = format!("{method} {path}");
    let mut request = remote.request(method, path);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let answer = request.send().await.context("reaching the service")?;
    let ok = [
        StatusCode::OK,
        StatusCode::CREATED,
        StatusCode::ACCEPTED,
        StatusCode::NO_CONTENT,
    ];
    expect(answer, &ok, &what).await
}

/// Turns endpoint `id` on or off (its other fields as they are).
async fn switch(remote: &Remote, id: &str, enabled: bool) -> anyhow::Result<Value> {
    let current = call(remote, Method::GET, &path(id, ""), None).await?;
    let body = json!({"url": current["url"], "events": current["events"],
        "actions": current["actions"], "enabled": enabled});
    call(remote, Method::PUT, &path(id, ""), Some(body)).await
}

/// A JSON list's strings joined by commas, or `all` when empty.
fn joined(value: &Value) -> String {
    let items: Vec<&str> = value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    match items.is_empty() {
        true => "all".to_owned(),
        false => items.join(","),
    }
}

/// One endpoint on one line: id, state, URL, events, actions.
fn line(endpoint: &Value) -> String {
    let state = match (
        endpoint["enabled"].as_bool(),
        endpoint["disabled_at"].as_str(),
        endpoint["failing_since"].as_str(),
    ) {
        (Some(false), Some(at), _) => format!("disabled(failing; at {at})"),
        (Some(false), None, _) => "disabled".to_owned(),
        (_, _, Some(since)) => format!("failing(since {since})"),
        _ => "enabled".to_owned(),
    };
    format!(
        "{}\t{state}\t{}\tevents={}\tactions={}",
        endpoint["id"].as_str().unwrap_or("-"),
        endpoint["url"].as_str().unwrap_or("-"),
        joined(&endpoint["events"]),
        joined(&endpoint["actions"]),
    )
}

/// One delivery on one line.
fn delivery_line(delivery: &Value) -> String {
    let text = |field: &str| match &delivery[field] {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => "-".to_owned(),
    };
    format!(
        "{}\t{}\t{}\tattempts={}\tlast_status={}\tlast_error={}\tnext_attempt={}",
        text("event_id"),
        text("event_type"),
        text("state"),
        text("attempts"),
        text("last_status"),
        text("last_error"),
        text("next_attempt_at"),
    )
}
