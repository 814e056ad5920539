//! The real binary with `QUOTA_LOG_FORMAT=json`: every line a request causes carries its
//! request id, the access line names the route, and no line holds a subject or a token.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

const SUBJECT: &str = "carol-2b8e-personal";
const TOKEN: &str = "json-logs-admin-token-5e1f";

/// The running binary, killed on drop, and the lines of its standard output.
struct Binary {
    child: Child,
    lines: Receiver<String>,
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Binary {
    fn start() -> Self {
        let db =
            std::env::temp_dir().join(format!("quota-ledger-logs-{}.db", uuid::Uuid::new_v4()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_quota-ledger"))
            .env_clear()
            .env("QUOTA_LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .env("QUOTA_LISTEN", "127.0.0.1:0")
            .env("DATABASE_URL", format!("sqlite://{}", db.display()))
            .env("QUOTA_ADMIN_TOKEN", TOKEN)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the quota-ledger binary");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// Lines up to and including the first one that `stop` accepts.
    fn lines_until(&self, stop: impl Fn(&str) -> bool) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("no such line; saw:\n{}", seen.join("\n")));
            let done = stop(&line);
            seen.push(line);
            if done {
                return seen;
            }
        }
    }
}

fn request_id(line: &Value) -> Option<&str> {
    line["span"]["request_id"].as_str()
}

#[tokio::test]
async fn json_logs_carry_the_request_id_on_every_line_of_a_request_and_never_a_subject_or_token() {
    let binary = Binary::start();
    let startup = binary.lines_until(|l| l.contains("listening on port"));
    let port: u16 = startup[startup.len() - 1]
        .split("listening on port ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .and_then(|port| port.parse().ok())
        .expect("the port in the startup line");
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let send = |request: reqwest::RequestBuilder, id: &str| {
        let request = request.header("x-request-id", id).bearer_auth(TOKEN);
        async move { request.send().await.expect("sending").status() }
    };

    let policy = json!({"id": "p", "action": "a", "measure": "count", "limit": 5,
                        "window": {"type": "calendar", "period": "day"}});
    let create = client.post(format!("{base}/admin/policies")).json(&policy);
    assert_eq!(send(create, "logs-create").await, StatusCode::CREATED);
    let over = client.put(format!("{base}/admin/policies/p/overrides/{SUBJECT}"));
    assert_eq!(
        send(over.json(&json!({"limit": 9})), "logs-override").await,
        StatusCode::CREATED
    );
    let usage = client.get(format!("{base}/quota/usage?action=a&subject={SUBJECT}"));
    assert_eq!(send(usage, "logs-usage").await, StatusCode::OK);
    let last = client.get(format!("{base}/healthz"));
    assert_eq!(send(last, "logs-last").await, StatusCode::OK);

    let text = binary.lines_until(|l| l.contains("logs-last") && l.contains("request answered"));
    let lines: Vec<Value> = text
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect();
    let of =
        |id: &str| -> Vec<&Value> { lines.iter().filter(|l| request_id(l) == Some(id)).collect() };
    let access = |id: &str| -> Value {
        let answered = of(id)
            .into_iter()
            .filter(|l| l["fields"]["message"] == "request answered")
            .collect::<Vec<_>>();
        assert_eq!(answered.len(), 1, "one access line for {id}");
        answered[0]["fields"].clone()
    };

    let created = of("logs-create");
    assert!(
        created
            .iter()
            .any(|l| l["fields"]["message"] == "policy created"),
        "the handler's own line carries the request id too: {created:?}"
    );
    let line = access("logs-create");
    assert_eq!(
        (line["method"].as_str(), line["path"].as_str()),
        (Some("POST"), Some("/admin/policies"))
    );
    assert_eq!(line["status"], 201);
    assert!(
        line["latency_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
        "{line}"
    );
    let routes = [
        (
            "logs-override",
            "/admin/policies/{id}/overrides/{subject}",
            201,
        ),
        ("logs-usage", "/quota/usage", 200),
        ("logs-last", "/healthz", 200),
    ];
    for (id, route, status) in routes {
        let line = access(id);
        assert_eq!(
            (line["path"].as_str(), line["status"].as_u64()),
            (Some(route), Some(status))
        );
    }
    for line in startup.iter().chain(&text) {
        assert!(
            !line.contains(SUBJECT) && !line.contains(TOKEN),
            "leaked: {line}"
        );
    }
}
