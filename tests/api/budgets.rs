//! Budgets over real HTTP on every counter store: attributes on consumes, `match`
//! conditions (and deny lists), scopes naming the subject and attributes, overrides by
//! budget, and the budgets every answer and ledger entry names.

use crate::helpers::{
    app_with, spawn_app, spawn_with, Answer, CounterBackend, PolicyBackend, TestApp,
};
use crate::on_counter_stores;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

fn sms(id: &str, limit: u64) -> Value {
    json!({"id": id, "action": "sms", "measure": "count", "limit": limit,
        "window": {"type": "calendar", "period": "day"}})
}

/// `sms` with `extra` fields merged in.
fn sms_with(id: &str, limit: u64, extra: Value) -> Value {
    let mut policy = sms(id, limit);
    for (key, value) in extra.as_object().unwrap() {
        policy[key] = value.clone();
    }
    policy
}

async fn send_sms(app: &TestApp, subject: &str, attributes: Value) -> Answer {
    app.quota(
        "/quota/consume",
        json!({"action": "sms", "subject": subject, "attributes": attributes}),
    )
    .await
}

/// The policy ids an answer lists, in order.
fn listed(answer: &Answer) -> Vec<String> {
    answer.body["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["policy_id"].as_str().unwrap().to_owned())
        .collect()
}

fn part<'a>(answer: &'a Answer, policy: &str) -> &'a Value {
    answer.body["policies"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["policy_id"] == policy))
        .unwrap_or_else(|| panic!("{policy} in {}", answer.body))
}

async fn usage_with(app: &TestApp, subject: &str, attributes: &[(&str, &str)]) -> Answer {
    let mut query = vec![("action".to_owned(), "sms".to_owned())];
    query.push(("subject".to_owned(), subject.to_owned()));
    for (key, value) in attributes {
        query.push((format!("attributes[{key}]"), (*value).to_owned()));
    }
    app.send(
        app.client
            .get(format!("{}/quota/usage", app.address))
            .query(&query),
    )
    .await
}

async fn a_match_applies_a_policy_only_to_the_requests_it_lists(counters: CounterBackend) {
    let free = sms_with(
        "free-plan",
        2,
        json!({"match": {"plan": ["free", "trial"]}}),
    );
    let app = app_with(counters, &[sms("per-user", 10), free]).await;
    let free_user = send_sms(&app, "u-1", json!({"plan": "free"})).await;
    assert_eq!(free_user.status, StatusCode::OK, "{}", free_user.body);
    assert_eq!(listed(&free_user), ["free-plan", "per-user"]);
    assert_eq!(
        part(&free_user, "free-plan")["budget"],
        json!({"subject": "u-1"})
    );
    let paid_user = send_sms(&app, "u-1", json!({"plan": "paid"})).await;
    assert_eq!(listed(&paid_user), ["per-user"], "a value not listed");
    let no_plan = send_sms(&app, "u-1", json!({})).await;
    assert_eq!(
        listed(&no_plan),
        ["per-user"],
        "a missing key does not match"
    );
    send_sms(&app, "u-1", json!({"plan": "trial"})).await;
    let third = send_sms(&app, "u-1", json!({"plan": "free"})).await;
    assert_eq!(
        third.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        third.body
    );
    assert_eq!(part(&third, "free-plan")["allowed"], false);
    assert_eq!(
        part(&third, "per-user")["used"],
        4,
        "the denial charged nothing"
    );
    let paid = send_sms(&app, "u-1", json!({"plan": "paid"})).await;
    assert_eq!(
        paid.status,
        StatusCode::OK,
        "the free-plan cap does not apply"
    );
}

async fn a_match_with_limit_0_is_a_deny_list(counters: CounterBackend) {
    let deny = sms_with(
        "blocked-countries",
        0,
        json!({"match": {"country": ["KP", "IR"]}}),
    );
    let app = app_with(counters, &[sms("per-user", 10), deny]).await;
    let blocked = send_sms(&app, "u-1", json!({"country": "KP"})).await;
    assert_eq!(
        blocked.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        blocked.body
    );
    assert_eq!(blocked.body["retry_after_seconds"], Value::Null, "never");
    assert_eq!(part(&blocked, "blocked-countries")["allowed"], false);
    assert_eq!(part(&blocked, "per-user")["used"], 0);
    let fine = send_sms(&app, "u-1", json!({"country": "NG"})).await;
    assert_eq!(fine.status, StatusCode::OK, "{}", fine.body);
    assert_eq!(listed(&fine), ["per-user"]);
}

async fn an_action_whose_policies_all_skip_the_request_allows_it_listing_none(
    counters: CounterBackend,
) {
    let only_free = sms_with("free-plan", 1, json!({"match": {"plan": ["free"]}}));
    let app = app_with(counters, &[only_free]).await;
    let answer = send_sms(&app, "u-1", json!({"plan": "paid"})).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body["policies"], json!([]));
    // A hold that charges nothing still exists: it can be settled.
    let hold = app
        .quota(
            "/quota/holds",
            json!({"action": "sms", "subject": "u-1", "ttl_seconds": 60,
                   "attributes": {"plan": "paid"}}),
        )
        .await;
    assert_eq!(hold.status, StatusCode::OK, "{}", hold.body);
    let hold_id = hold.body["hold_id"].as_str().unwrap();
    let released = app
        .quota(&format!("/quota/holds/{hold_id}/release"), json!({}))
        .await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.body);
}

async fn a_scope_with_an_attribute_counts_each_value_apart_and_needs_it(counters: CounterBackend) {
    let per_org = sms_with("per-user-org", 2, json!({"scope": ["subject", "org"]}));
    let app = app_with(counters, &[sms("per-user", 10), per_org]).await;
    for _ in 0..2 {
        let answer = send_sms(&app, "u-1", json!({"org": "acme"})).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    }
    let third = send_sms(&app, "u-1", json!({"org": "acme"})).await;
    assert_eq!(
        third.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        third.body
    );
    assert_eq!(
        part(&third, "per-user-org")["budget"],
        json!({"subject": "u-1", "org": "acme"})
    );
    let other_org = send_sms(&app, "u-1", json!({"org": "globex"})).await;
    assert_eq!(other_org.status, StatusCode::OK, "another budget");
    assert_eq!(part(&other_org, "per-user-org")["used"], 1);
    assert_eq!(part(&other_org, "per-user")["used"], 3);

    let missing = send_sms(&app, "u-1", json!({})).await;
    let problem = missing.assert_problem(422);
    assert_eq!(problem["errors"][0]["field"], "attributes.org", "{problem}");
    let usage = app.usage("sms", "u-1").await;
    assert_eq!(usage.status.as_u16(), 422, "{}", usage.body);
    let usage = usage_with(&app, "u-1", &[("org", "acme")]).await;
    assert_eq!(usage.status, StatusCode::OK, "{}", usage.body);
    assert_eq!(part(&usage, "per-user-org")["used"], 2);
    assert_eq!(
        part(&usage, "per-user")["used"],
        3,
        "the 422 charged nothing"
    );
}

async fn an_override_names_a_budget_of_the_policys_scope(counters: CounterBackend) {
    let per_org = sms_with("per-user-org", 1, json!({"scope": ["subject", "org"]}));
    let app = app_with(counters, &[per_org]).await;
    let path = "/admin/policies/per-user-org/overrides";
    let put = app
        .send(
            app.admin(Method::PUT, &format!("{path}/u-1,acme"))
                .json(&json!({"limit": 3})),
        )
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.body);
    let wrong = app
        .send(
            app.admin(Method::PUT, &format!("{path}/u-1"))
                .json(&json!({"limit": 3})),
        )
        .await;
    assert_eq!(wrong.assert_problem(422)["errors"][0]["field"], "subject");
    for expected in [StatusCode::OK, StatusCode::OK, StatusCode::OK] {
        let answer = send_sms(&app, "u-1", json!({"org": "acme"})).await;
        assert_eq!(answer.status, expected, "{}", answer.body);
        assert_eq!(part(&answer, "per-user-org")["limit"], 3);
    }
    let over = send_sms(&app, "u-1", json!({"org": "acme"})).await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
    let other = send_sms(&app, "u-1", json!({"org": "globex"})).await;
    assert_eq!(
        part(&other, "per-user-org")["limit"],
        1,
        "no override there"
    );

    let mut changed = sms_with("per-user-org", 1, json!({"scope": ["subject"]}));
    changed.as_object_mut().unwrap().remove("id");
    let refused = app
        .send(
            app.admin(Method::PUT, "/admin/policies/per-user-org")
                .json(&changed),
        )
        .await;
    refused.assert_problem(409);
}

async fn answers_and_ledger_entries_name_budgets_and_keep_attributes(counters: CounterBackend) {
    let per_org = sms_with("per-user-org", 5, json!({"scope": ["subject", "org"]}));
    let app = app_with(counters, &[sms("per-user", 10), per_org]).await;
    let attributes = json!({"org": "acme", "tz": "Asia/Tokyo"});
    let charged = app
        .quota(
            "/quota/consume",
            json!({"action": "sms", "subject": "u-1", "attributes": attributes,
                   "idempotency_key": "k-1"}),
        )
        .await;
    assert_eq!(charged.status, StatusCode::OK, "{}", charged.body);
    let retry = app
        .quota(
            "/quota/consume",
            json!({"action": "sms", "subject": "u-1", "attributes": {"org": "other"},
                   "idempotency_key": "k-1"}),
        )
        .await;
    assert_eq!(retry.body["replayed"], true);
    assert_eq!(
        retry.body["policies"], charged.body["policies"],
        "a replay names the original budgets"
    );
    let id = charged.body["consumption_id"].as_str().unwrap();
    let refund = app
        .quota("/quota/refund", json!({"consumption_id": id}))
        .await;
    assert_eq!(refund.status, StatusCode::OK, "{}", refund.body);
    assert_eq!(
        refund.body["entry"]["attributes"], attributes,
        "{}",
        refund.body
    );
    assert_eq!(part(&refund, "per-user-org")["used"], 0, "{}", refund.body);

    app.engine.drain_ledger_now().await;
    let page = app
        .send(
            app.client
                .get(format!("{}/quota/ledger?subject=u-1", app.address)),
        )
        .await;
    let items = page.body["items"].as_array().unwrap();
    let kinds: Vec<&str> = items.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["refund", "charge"]);
    for item in items {
        assert_eq!(item["attributes"], attributes, "{item}");
        assert_eq!(
            item["policies"],
            json!([
                {"policy_id": "per-user", "amount": 1, "budget": {"subject": "u-1"}},
                {"policy_id": "per-user-org", "amount": 1,
                 "budget": {"subject": "u-1", "org": "acme"}},
            ]),
            "{item}"
        );
    }
}

async fn a_hold_charges_its_budgets_and_gives_back_to_them(counters: CounterBackend) {
    let per_org = sms_with("per-user-org", 5, json!({"scope": ["subject", "org"]}));
    let app = app_with(counters, &[per_org]).await;
    let hold = app
        .quota(
            "/quota/holds",
            json!({"action": "sms", "subject": "u-1", "ttl_seconds": 60,
                   "attributes": {"org": "acme"}}),
        )
        .await;
    assert_eq!(hold.status, StatusCode::OK, "{}", hold.body);
    assert_eq!(part(&hold, "per-user-org")["used"], 1);
    let hold_id = hold.body["hold_id"].as_str().unwrap();
    let released = app
        .quota(&format!("/quota/holds/{hold_id}/release"), json!({}))
        .await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.body);
    assert_eq!(released.body["entry"]["attributes"], json!({"org": "acme"}));
    let usage = usage_with(&app, "u-1", &[("org", "acme")]).await;
    assert_eq!(part(&usage, "per-user-org")["used"], 0, "{}", usage.body);
}

/// A global budget (`scope: []`) and a per-country one, shared by every subject, next to
/// each subject's own; all charged or none.
async fn shared_budgets_are_charged_with_the_subjects_all_or_none(counters: CounterBackend) {
    let platform = sms_with("platform", 5, json!({"scope": []}));
    let country = sms_with("per-country", 3, json!({"scope": ["country"]}));
    let app = app_with(counters, &[sms("per-user", 2), platform, country]).await;
    let mut allowed = 0;
    for subject in ["u-1", "u-2", "u-3"] {
        let answer = send_sms(&app, subject, json!({"country": "NG"})).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        assert_eq!(part(&answer, "platform")["budget"], json!({}));
        assert_eq!(
            part(&answer, "per-country")["budget"],
            json!({"country": "NG"})
        );
        allowed += 1;
    }
    // NG is full: the 4th is denied by the country budget, and charges nothing anywhere.
    let denied = send_sms(&app, "u-4", json!({"country": "NG"})).await;
    assert_eq!(
        denied.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        denied.body
    );
    assert_eq!(part(&denied, "per-country")["allowed"], false);
    assert_eq!(part(&denied, "platform")["allowed"], true);
    assert_eq!(
        part(&denied, "platform")["used"],
        allowed,
        "nothing charged"
    );
    assert_eq!(part(&denied, "per-user")["used"], 0, "nothing charged");
    let ghana = send_sms(&app, "u-4", json!({"country": "GH"})).await;
    assert_eq!(
        ghana.status,
        StatusCode::OK,
        "another country, {}",
        ghana.body
    );
    assert_eq!(part(&ghana, "platform")["used"], 4);
    let missing = send_sms(&app, "u-5", json!({})).await;
    assert_eq!(
        missing.assert_problem(422)["errors"][0]["field"],
        "attributes.country"
    );
    // A refund gives back to every budget it charged, the shared ones too.
    let id = ghana.body["consumption_id"].as_str().unwrap();
    let refund = app
        .quota("/quota/refund", json!({"consumption_id": id}))
        .await;
    assert_eq!(refund.status, StatusCode::OK, "{}", refund.body);
    assert_eq!(part(&refund, "platform")["used"], 3, "{}", refund.body);
    assert_eq!(part(&refund, "per-country")["used"], 0, "{}", refund.body);
    // Overrides name the country, or `*` for the global budget.
    let path = "/admin/policies";
    for (segment, policy) in [("NG", "per-country"), ("*", "platform")] {
        let put = app
            .send(
                app.admin(Method::PUT, &format!("{path}/{policy}/overrides/{segment}"))
                    .json(&json!({"limit": 100})),
            )
            .await;
        assert_eq!(put.status, StatusCode::CREATED, "{}", put.body);
    }
    let wrong = app
        .send(
            app.admin(Method::PUT, &format!("{path}/platform/overrides/NG"))
                .json(&json!({"limit": 100})),
        )
        .await;
    wrong.assert_problem(422);
    let raised = send_sms(&app, "u-6", json!({"country": "NG"})).await;
    assert_eq!(raised.status, StatusCode::OK, "{}", raised.body);
    assert_eq!(part(&raised, "per-country")["limit"], 100);
    assert_eq!(part(&raised, "platform")["limit"], 100);
    // A hold charges every budget; its release gives every one back.
    let platform_used = part(&raised, "platform")["used"].as_u64().unwrap();
    let hold = app
        .quota(
            "/quota/holds",
            json!({"action": "sms", "subject": "u-7", "ttl_seconds": 60,
                   "attributes": {"country": "GH"}}),
        )
        .await;
    assert_eq!(hold.status, StatusCode::OK, "{}", hold.body);
    assert_eq!(part(&hold, "platform")["used"], platform_used + 1);
    assert_eq!(part(&hold, "per-country")["used"], 1, "{}", hold.body);
    let hold_id = hold.body["hold_id"].as_str().unwrap();
    let released = app
        .quota(&format!("/quota/holds/{hold_id}/release"), json!({}))
        .await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.body);
    assert_eq!(part(&released, "platform")["used"], platform_used);
    assert_eq!(
        part(&released, "per-country")["used"],
        0,
        "{}",
        released.body
    );
}

/// 300 concurrent consumes over 50 subjects against a global budget of 100 and per-subject
/// budgets of 3: exactly 100 allowed, none over 3. On Redis, from two instances.
async fn shared_budgets_hold_exactly_under_concurrency(counters: CounterBackend) {
    let platform = sms_with("platform", 100, json!({"scope": []}));
    let first = spawn_app(PolicyBackend::Postgres, counters).await;
    for policy in [sms("per-user", 3), platform] {
        first.must_create_policy(policy).await;
    }
    let mut apps = vec![std::sync::Arc::new(first)];
    if counters != CounterBackend::Memory {
        let second = spawn_with(apps[0].settings.clone()).await;
        apps.push(std::sync::Arc::new(second));
    }
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let app = apps[i % apps.len()].clone();
            tokio::spawn(async move {
                let answer = send_sms(&app, &format!("s-{}", i % 50), json!({})).await;
                (i % 50, answer.status)
            })
        })
        .collect();
    let mut per_subject = [0u32; 50];
    let mut allowed = 0;
    for task in tasks {
        let (subject, status) = task.await.unwrap();
        if status == StatusCode::OK {
            allowed += 1;
            per_subject[subject] += 1;
        } else {
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        }
    }
    assert_eq!(allowed, 100, "exactly the global budget");
    assert!(per_subject.iter().all(|n| *n <= 3), "{per_subject:?}");
}

mod shared {
    use super::*;

    // On Redis Cluster the shared budgets sit in other slots: the cross-slot protocol.
    on_counter_stores!(
        shared_budgets_are_charged_with_the_subjects_all_or_none,
        shared_budgets_hold_exactly_under_concurrency,
    );

    /// The embedded default rebuilds shared budgets on a restart, like every counter.
    #[tokio::test]
    async fn a_shared_budget_survives_a_crash_of_the_embedded_default() {
        let platform = sms_with("platform", 4, json!({"scope": ["country"]}));
        let app = app_with(CounterBackend::Memory, &[platform]).await;
        for subject in ["u-1", "u-2", "u-3"] {
            let answer = send_sms(&app, subject, json!({"country": "NG"})).await;
            assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        }
        let app = app.crash_restart().await;
        let fourth = send_sms(&app, "u-4", json!({"country": "NG"})).await;
        assert_eq!(part(&fourth, "platform")["used"], 4, "{}", fourth.body);
        let fifth = send_sms(&app, "u-5", json!({"country": "NG"})).await;
        assert_eq!(
            fifth.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{}",
            fifth.body
        );
    }
}

mod zones {
    use super::*;

    /// A day in the subject's own zone: `tz` names it, `UTC` when absent.
    pub(super) fn zoned_day(limit: u64) -> Value {
        json!({"id": "per-user-local-day", "action": "sms", "measure": "count", "limit": limit,
        "window": {"type": "calendar", "period": "day", "timezone": "UTC",
                   "timezone_attribute": "tz"}})
    }

    async fn a_period_runs_to_its_end_in_the_zone_it_started_in(counters: CounterBackend) {
        // The clock starts at 2026-11-21T12:00Z: 02:00 on the 22nd in Kiritimati (UTC+14),
        // 01:00 on the 21st in Niue (UTC-11).
        let app = app_with(counters, &[zoned_day(3)]).await;
        let first = send_sms(&app, "u-1", json!({"tz": "Pacific/Kiritimati"})).await;
        assert_eq!(first.status, StatusCode::OK, "{}", first.body);
        let ends = "2026-11-22T10:00:00Z"; // Kiritimati's midnight
        assert_eq!(part(&first, "per-user-local-day")["resets_at"], ends);
        app.advance(60);
        let niue = send_sms(&app, "u-1", json!({"tz": "Pacific/Niue"})).await;
        assert_eq!(niue.status, StatusCode::OK, "{}", niue.body);
        let policy = part(&niue, "per-user-local-day");
        assert_eq!(
            policy["resets_at"], ends,
            "the running period wins: {policy}"
        );
        assert_eq!(policy["used"], 2, "no fresh day for another zone");
        let utc = send_sms(&app, "u-1", json!({})).await;
        assert_eq!(part(&utc, "per-user-local-day")["used"], 3);
        let over = send_sms(&app, "u-1", json!({"tz": "Etc/GMT+12"})).await;
        assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS, "{}", over.body);
        assert_eq!(
            over.body["retry_after_seconds"],
            22 * 3600 - 60,
            "{}",
            over.body
        );

        // Once it ended, the next period follows the request's zone.
        app.advance(22 * 3600);
        let next = send_sms(&app, "u-1", json!({"tz": "Pacific/Niue"})).await;
        assert_eq!(next.status, StatusCode::OK, "{}", next.body);
        let policy = part(&next, "per-user-local-day");
        assert_eq!(policy["used"], 1, "{policy}");
        // 10:01Z is 23:01 on the 21st in Niue: a short period, to Niue's midnight.
        assert_eq!(policy["resets_at"], "2026-11-22T11:00:00Z", "{policy}");
        let bad = send_sms(&app, "u-1", json!({"tz": "Mars/Olympus_Mons"})).await;
        assert_eq!(
            bad.assert_problem(422)["errors"][0]["field"],
            "attributes.tz"
        );
    }

    async fn a_refund_goes_back_to_the_period_it_was_charged_in(counters: CounterBackend) {
        let app = app_with(counters, &[zoned_day(5)]).await;
        let old = send_sms(&app, "u-1", json!({"tz": "Asia/Tokyo"})).await;
        assert_eq!(old.status, StatusCode::OK, "{}", old.body);
        // Tokyo's day ends at 15:00Z; the next period starts with the next charge.
        app.advance(4 * 3600);
        let new = send_sms(&app, "u-1", json!({"tz": "Asia/Tokyo"})).await;
        assert_eq!(part(&new, "per-user-local-day")["used"], 1, "{}", new.body);
        let id = old.body["consumption_id"].as_str().unwrap();
        let refund = app
            .quota("/quota/refund", json!({"consumption_id": id}))
            .await;
        assert_eq!(refund.status, StatusCode::OK, "{}", refund.body);
        assert_eq!(
            part(&refund, "per-user-local-day")["used"],
            1,
            "the units of an ended period do not come off this one: {}",
            refund.body
        );
    }

    on_counter_stores!(
        a_period_runs_to_its_end_in_the_zone_it_started_in,
        a_refund_goes_back_to_the_period_it_was_charged_in,
    );
}

use zones::zoned_day;

/// The embedded default keeps a zoned period across a crash: it is rebuilt from the ledger
/// (the charges replayed at their own instants start the same periods).
#[tokio::test]
async fn a_zoned_period_survives_a_crash_of_the_embedded_default() {
    let app = app_with(CounterBackend::Memory, &[zoned_day(3)]).await;
    send_sms(&app, "u-1", json!({"tz": "Pacific/Kiritimati"})).await;
    app.advance(60);
    let app = app.crash_restart().await;
    let after = send_sms(&app, "u-1", json!({"tz": "Pacific/Niue"})).await;
    let policy = part(&after, "per-user-local-day");
    assert_eq!(policy["used"], 2, "{policy}");
    assert_eq!(policy["resets_at"], "2026-11-22T10:00:00Z", "{policy}");
}

/// `timezone_attribute` is a calendar window's, names an attribute, and reads back.
#[tokio::test]
async fn a_zone_attribute_is_validated_and_reads_back() {
    let app = app_with(CounterBackend::Memory, &[]).await;
    let created = app.must_create_policy(zoned_day(3)).await;
    assert_eq!(created["window"]["timezone_attribute"], "tz", "{created}");
    let read = app.admin_get("/admin/policies/per-user-local-day").await;
    assert_eq!(
        read.body["window"]["timezone_attribute"], "tz",
        "{}",
        read.body
    );
    for (window, status) in [
        (
            json!({"type": "calendar", "period": "day", "timezone_attribute": "Tz"}),
            422,
        ),
        (
            json!({"type": "calendar", "period": "day", "timezone_attribute": "subject"}),
            422,
        ),
        (
            json!({"type": "rolling", "seconds": 60, "bucket_seconds": 60,
                "timezone_attribute": "tz"}),
            400,
        ),
    ] {
        let mut policy = zoned_day(1);
        policy["id"] = json!("bad");
        policy["window"] = window.clone();
        let answer = app.create_policy(policy).await;
        assert!(
            answer.status.as_u16() == status || answer.status.as_u16() == 422,
            "{window}: {} {}",
            answer.status,
            answer.body
        );
        assert!(answer.status.is_client_error(), "{window}");
    }
}

on_counter_stores!(
    a_match_applies_a_policy_only_to_the_requests_it_lists,
    a_match_with_limit_0_is_a_deny_list,
    an_action_whose_policies_all_skip_the_request_allows_it_listing_none,
    a_scope_with_an_attribute_counts_each_value_apart_and_needs_it,
    an_override_names_a_budget_of_the_policys_scope,
    answers_and_ledger_entries_name_budgets_and_keep_attributes,
    a_hold_charges_its_budgets_and_gives_back_to_them,
);

/// Bad attributes, scopes and conditions are 422 naming the field, and change nothing.
#[tokio::test]
async fn bad_attributes_scopes_and_matches_are_422_naming_the_field() {
    let app = app_with(CounterBackend::Memory, &[sms("per-user", 1)]).await;
    let cases = [
        (json!({"Country": "NG"}), "attributes"),
        (json!({"subject": "u-2"}), "attributes.subject"),
        (json!({"country": ""}), "attributes.country"),
        (json!({"country": "x".repeat(129)}), "attributes.country"),
    ];
    for (attributes, field) in cases {
        let answer = send_sms(&app, "u-1", attributes.clone()).await;
        let problem = answer.assert_problem(422);
        assert_eq!(
            problem["errors"][0]["field"], field,
            "{attributes}: {problem}"
        );
    }
    let usage = app.usage("sms", "u-1").await;
    assert_eq!(part(&usage, "per-user")["used"], 0, "nothing was charged");

    let policies = [
        (json!({"scope": ["org", "org"]}), "scope[1]"),
        (json!({"scope": ["a", "b", "c", "d", "e"]}), "scope"),
        (json!({"match": {"plan": []}}), "match.plan"),
        (json!({"match": {"Plan": ["free"]}}), "match.Plan"),
    ];
    for (extra, field) in policies {
        let answer = app.create_policy(sms_with("bad", 1, extra.clone())).await;
        let problem = answer.assert_problem(422);
        assert_eq!(problem["errors"][0]["field"], field, "{extra}: {problem}");
    }
    // Attributes as plain parameters (what generated clients send) count as attributes, and
    // are checked as such.
    for (name, status) in [
        ("country", 200),
        ("attributes[country]", 200),
        ("Bad-Key", 422),
    ] {
        let answer = app
            .send(
                app.client
                    .get(format!("{}/quota/usage", app.address))
                    .query(&[("action", "sms"), ("subject", "u-1"), (name, "NG")]),
            )
            .await;
        assert_eq!(answer.status.as_u16(), status, "{name}: {}", answer.body);
    }
}

/// Random mixes of scopes, conditions and attributes (consumes, checks and refunds, time
/// moving on) get identical answers from the embedded default and from Redis.
#[tokio::test]
async fn random_mixes_of_budgets_answer_alike_on_memory_and_redis() {
    let policies = [
        sms("per-user", 4),
        sms_with("per-country", 6, json!({"scope": ["country"]})),
        sms_with("platform", 15, json!({"scope": []})),
        sms_with(
            "free-per-user-plan",
            2,
            json!({"scope": ["subject", "plan"], "match": {"plan": ["free", "trial"]}}),
        ),
        sms_with("blocked", 0, json!({"match": {"country": ["KP"]}})),
        sms_with(
            "local-day",
            5,
            json!({"window": {"type": "calendar", "period": "day", "timezone_attribute": "tz"}}),
        ),
    ];
    let memory = app_with(CounterBackend::Memory, &policies).await;
    let redis = app_with(CounterBackend::Redis, &policies).await;
    // A fixed-seed generator (xorshift): a failure reproduces.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let mut consumed: Vec<(String, String)> = Vec::new();
    let mut statuses = std::collections::BTreeMap::<u16, u32>::new();
    for step in 0..160 {
        let mut attributes = serde_json::Map::new();
        if let Some(country) = ["NG", "GH", "KP", "US"].get(next(5) as usize) {
            attributes.insert("country".into(), json!(country));
        }
        if let Some(plan) = ["free", "paid", "trial"].get(next(4) as usize) {
            attributes.insert("plan".into(), json!(plan));
        }
        if let Some(tz) = ["Asia/Tokyo", "Pacific/Niue", "Nowhere/Atlantis"].get(next(5) as usize) {
            attributes.insert("tz".into(), json!(tz));
        }
        let subject = format!("u-{}", next(5));
        let body = json!({"action": "sms", "subject": subject, "attributes": attributes});
        let (path, body) = match next(10) {
            0..=6 => ("/quota/consume", body),
            7 => ("/quota/check", body),
            _ => match consumed.get(next(consumed.len().max(1) as u64) as usize) {
                Some((on_memory, on_redis)) => {
                    let (a, b) = (on_memory.clone(), on_redis.clone());
                    let m = memory
                        .quota("/quota/refund", json!({"consumption_id": a}))
                        .await;
                    let r = redis
                        .quota("/quota/refund", json!({"consumption_id": b}))
                        .await;
                    assert_eq!(m.status, r.status, "step {step}: {} / {}", m.body, r.body);
                    assert_eq!(m.body["policies"], r.body["policies"], "step {step}");
                    continue;
                }
                None => ("/quota/consume", body),
            },
        };
        let m = memory.quota(path, body.clone()).await;
        let r = redis.quota(path, body.clone()).await;
        assert_eq!(
            m.status, r.status,
            "step {step} {body}: {} / {}",
            m.body, r.body
        );
        *statuses.entry(m.status.as_u16()).or_default() += 1;
        for field in ["allowed", "policies", "retry_after_seconds", "errors"] {
            assert_eq!(m.body[field], r.body[field], "step {step} {body}: {field}");
        }
        if let (Some(a), Some(b)) = (
            m.body["consumption_id"].as_str(),
            r.body["consumption_id"].as_str(),
        ) {
            consumed.push((a.to_owned(), b.to_owned()));
        }
        if next(6) == 0 {
            let seconds = [30, 3_600, 6 * 3_600][next(3) as usize];
            memory.advance(seconds);
            redis.advance(seconds);
        }
    }
    assert!(
        consumed.len() > 20,
        "the mix allowed some: {}",
        consumed.len()
    );
    for status in [200, 422, 429] {
        assert!(
            statuses.get(&status) > Some(&3),
            "{status} seldom: {statuses:?}"
        );
    }
}
