//! `counters verify`: asks a running service to compare its live counters with its
//! ledger (`GET /admin/counters/verify`) and prints each drifting budget.

use super::policies::Remote;
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// How `counters verify` ends, as its exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every budget agrees with the ledger.
    Agrees = 0,
    /// Some budget drifts.
    Drifts = 1,
    /// The service could not tell (unreachable, a store down, an error).
    CannotTell = 2,
}

/// Runs the verify on the service (of `action`, or all) and prints what it found.
pub async fn verify(remote: &Remote, action: Option<&str>) -> Verdict {
    match ask(remote, action).await {
        Ok(body) => report(&body),
        Err(error) => {
            eprintln!("cannot tell: {error:#}");
            Verdict::CannotTell
        }
    }
}

async fn ask(remote: &Remote, action: Option<&str>) -> anyhow::Result<Value> {
    let mut request = remote.request(Method::GET, "/admin/counters/verify");
    if let Some(action) = action {
        request = request.query(&[("action", action)]);
    }
    let answer = request
        .send()
        .await
        .map_err(|error| anyhow::anyhow!("reaching the service: {error}"))?;
    super::policies::expect(answer, &[StatusCode::OK], "verifying the counters").await
}

/// Prints the drift (or that there is none) and judges it.
fn report(body: &Value) -> Verdict {
    let checked = body["checked"].as_u64().unwrap_or(0);
    let Some(drift) = body["drift"].as_array() else {
        eprintln!("cannot tell: the service answered without a drift list: {body}");
        return Verdict::CannotTell;
    };
    for item in drift {
        let budget = match &item["budget"] {
            Value::Object(values) => values
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(","),
            _ => format!("key {}", item["key"].as_str().unwrap_or_default()),
        };
        println!(
            "drift: policy {} budget {{{budget}}}: live {} ledger {}",
            item["policy_id"].as_str().unwrap_or("(unknown)"),
            item["live"],
            item["ledger"],
        );
    }
    let not_compared = body["not_compared"].as_u64().unwrap_or(0);
    match drift.len() {
        0 if not_compared > 0 => {
            println!(
                "cannot tell: {checked} budgets agree with the ledger, but {not_compared} \
                 shared by subjects could not be compared (consumes across Redis Cluster \
                 slots were in flight throughout); try again"
            );
            Verdict::CannotTell
        }
        0 => {
            let budgets = if checked == 1 {
                "budget agrees"
            } else {
                "budgets agree"
            };
            println!("no drift: {checked} {budgets} with the ledger");
            Verdict::Agrees
        }
        n => {
            println!("{n} of {checked} budgets drift from the ledger");
            Verdict::Drifts
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_verdict_follows_the_drift_list() {
        assert_eq!(report(&json!({"checked": 3, "drift": []})), Verdict::Agrees);
        let drift = json!({"checked": 3, "drift": [{"policy_id": "p", "budget": {"subject": "u"},
            "key": "k", "live": 5, "ledger": 4}]});
        assert_eq!(report(&drift), Verdict::Drifts);
        assert_eq!(report(&json!({"type": "problem"})), Verdict::CannotTell);
        let unsettled = json!({"checked": 3, "drift": [], "not_compared": 2});
        assert_eq!(report(&unsettled), Verdict::CannotTell);
    }
}
