//! `policies diff FILE --backtest DAYS`: the file's policies tried on the last DAYS days of
//! the ledger (`POST /admin/backtest`), printed beside the diff.

use super::policies::{expect, Remote};
use anyhow::Context;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Backtests the policies of `file` (by id, canonical) over the last `days` days and
/// prints what they would have done, one paragraph per policy.
pub async fn print(
    remote: &Remote,
    file: &BTreeMap<String, Value>,
    days: u32,
) -> anyhow::Result<()> {
    // The last `days` days by the service's clock.
    let body = json!({"policies": file.values().collect::<Vec<_>>(), "days": days});
    let answer = remote
        .request(Method::POST, "/admin/backtest")
        .json(&body)
        .send()
        .await
        .context("reaching the service")?;
    let found = expect(answer, &[StatusCode::OK], "backtesting the file's policies").await?;
    println!(
        "backtest over the last {days} day(s) of the ledger ({} entries replayed):",
        found["entries"]
    );
    for policy in found["policies"].as_array().into_iter().flatten() {
        println!("{}", describe(policy));
    }
    Ok(())
}

/// `{"country": "de"}` as `country=de`.
fn budget(value: &Value) -> String {
    value
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join(",")
}

/// One policy's figures, on two lines.
fn describe(policy: &Value) -> String {
    let n = |field: &str| policy[field].as_u64().unwrap_or(0);
    let peak = match &policy["peak"] {
        Value::Null => "nothing charged".to_owned(),
        peak => format!(
            "peak {} of {} ({})",
            peak["used"],
            peak["limit"],
            budget(&peak["budget"])
        ),
    };
    let top: Vec<String> = policy["top_denied"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| format!("{} ({})", budget(&d["budget"]), d["denied"]))
        .collect();
    let top = match top.is_empty() {
        true => "none".to_owned(),
        false => top.join(", "),
    };
    // Requests recorded in the ledger's totals are not entries: a backtest cannot see them.
    let unseen = match n("in_totals") {
        0 => String::new(),
        unseen => format!("\n    not replayed: {unseen} requests recorded in totals"),
    };
    format!(
        "  {}: {} requests, {} denied ({} newly), {} newly allowed; {peak}\n    denied most: {top}{unseen}",
        policy["policy_id"].as_str().unwrap_or("-"),
        n("requests"),
        n("denied"),
        n("newly_denied"),
        n("newly_allowed"),
    )
}
