//! Webhooks, end to end: a real receiver (a small HTTP server on a socket, started by the
//! test) that checks every delivery's Standard Webhooks signature.

use crate::helpers::{spawn_app, CounterBackend, PolicyBackend, TestApp};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    id: String,
    timestamp: String,
    signature: String,
    body: String,
    /// The status it answered.
    answered: u16,
}

/// A webhook receiver: answers 500 to its first `fail_first` requests, then 200.
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    async fn start(fail_first: usize) -> Self {
        Self::start_at("127.0.0.1:0", fail_first).await
    }

    /// A receiver listening on `address`.
    async fn start_at(address: &str, fail_first: usize) -> Self {
        let listener = tokio::net::TcpListener::bind(address).await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let got: Arc<Mutex<Vec<Received>>> = Arc::default();
        let seen = got.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let seen = seen.clone();
                tokio::spawn(async move {
                    let Some((headers, body)) = read_request(&mut socket).await else {
                        return;
                    };
                    let header = |name: &str| {
                        headers
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
                            })
                            .unwrap_or_default()
                    };
                    let answered = {
                        let mut seen = seen.lock().unwrap();
                        let answered = if seen.len() < fail_first { 500 } else { 200 };
                        seen.push(Received {
                            id: header("webhook-id"),
                            timestamp: header("webhook-timestamp"),
                            signature: header("webhook-signature"),
                            body,
                            answered,
                        });
                        answered
                    };
                    let reply = format!(
                        "HTTP/1.1 {answered} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    );
                    let _ = socket.write_all(reply.as_bytes()).await;
                });
            }
        });
        Self { url, got, task }
    }

    fn received(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }

    /// Waits (the test clock moving `step` seconds per round) until `done` holds.
    async fn until(
        &self,
        app: &TestApp,
        step: i64,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        for _ in 0..200 {
            let got = self.received();
            if done(&got) {
                return got;
            }
            app.advance(step);
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!(
            "the receiver never got what was expected: {:?}",
            self.received()
        );
    }
}

async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<(String, String)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buffer).into_owned();
        if let Some((headers, body)) = text.split_once("\r\n\r\n") {
            let length: usize = headers
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if body.len() >= length {
                return Some((headers.to_owned(), body[..length].to_owned()));
            }
        }
    }
}

/// Whether `r` is signed with `secret` as the Standard Webhooks specification says.
fn signed_with(r: &Received, secret: &str) -> bool {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{}.{}.{}", r.id, r.timestamp, r.body).as_bytes());
    let expected = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    );
    r.signature.split(' ').any(|s| s == expected)
}

async fn create_webhook(app: &TestApp, body: Value) -> (StatusCode, Value) {
    let answer = app
        .send(
            app.admin(reqwest::Method::POST, "/admin/webhooks")
                .json(&body),
        )
        .await;
    (answer.status, answer.body)
}

async fn sms_with_thresholds(app: &TestApp) {
    app.must_create_policy(
        json!({"id": "sms", "action": "sms.send", "measure": "count",
        "limit": 10, "window": {"type": "calendar", "period": "day"},
        "alert_thresholds": [50, 100]}),
    )
    .await;
}

async fn ten_consumes_deliver_two_signed_events(counters: CounterBackend) {
    let app = spawn_app(PolicyBackend::Postgres, counters).await;
    sms_with_thresholds(&app).await;
    let receiver = Receiver::start(0).await;
    let (status, created) = create_webhook(&app, json!({"id": "ops", "url": receiver.url})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let secret = created["secret"]
        .as_str()
        .expect("the secret, once")
        .to_owned();
    for _ in 0..10 {
        assert_eq!(
            app.consume("sms.send", "user-1", 1).await.status,
            StatusCode::OK
        );
    }
    app.engine.drain_ledger_now().await;
    let got = receiver.until(&app, 0, |got| got.len() >= 2).await;
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let got_later = receiver.received();
    assert_eq!(got_later.len(), 2, "exactly two: {got:?}");
    for r in &got_later {
        assert!(signed_with(r, &secret), "{r:?}");
        let event: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(event["id"], json!(r.id), "webhook-id is the event's id");
    }
    // Attempted at once, they may arrive in either order.
    let mut used: Vec<u64> = got_later
        .iter()
        .map(|r| {
            serde_json::from_str::<Value>(&r.body).unwrap()["used"]
                .as_u64()
                .unwrap()
        })
        .collect();
    used.sort_unstable();
    assert_eq!(used, vec![5, 10]);
    let listed = app.admin_get("/admin/webhooks").await;
    assert!(
        listed.body["items"][0].get("secret").is_none(),
        "{}",
        listed.body
    );
    let deliveries = app.admin_get("/admin/webhooks/ops/deliveries").await;
    let states: Vec<&Value> = deliveries.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["state"])
        .collect();
    assert_eq!(
        states,
        vec![&json!("delivered"), &json!("delivered")],
        "{}",
        deliveries.body
    );
}

#[tokio::test]
async fn a_failing_receiver_gets_the_event_again_with_the_same_id_after_backoff() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    sms_with_thresholds(&app).await;
    let receiver = Receiver::start(3).await;
    let (status, created) = create_webhook(
        &app,
        json!({"id": "ops", "url": receiver.url,
        "events": ["budget.threshold"], "actions": ["sms.*"]}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    for _ in 0..5 {
        app.consume("sms.send", "user-1", 1).await;
    }
    // Each round moves the test clock 10 s: the retries fall due.
    let got = receiver
        .until(&app, 10, |got| got.iter().any(|r| r.answered == 200))
        .await;
    assert_eq!(got.len(), 4, "three failures, then a delivery: {got:?}");
    assert!(
        got.iter().all(|r| r.id == got[0].id),
        "the same webhook-id every time"
    );
    // The receiver answered before the dispatcher records its answer.
    let delivery =
        crate::helpers::eventually(std::time::Duration::from_secs(5), "recorded", || async {
            let deliveries = app.admin_get("/admin/webhooks/ops/deliveries").await;
            let delivery = deliveries.body["items"][0].clone();
            (delivery["state"] != "pending").then_some(delivery)
        })
        .await;
    assert_eq!(
        (&delivery["state"], &delivery["attempts"]),
        (&json!("delivered"), &json!(4)),
        "{delivery}"
    );
}

#[tokio::test]
async fn urls_that_are_not_public_http_are_422_and_a_test_event_is_delivered() {
    let mut settings =
        crate::helpers::fresh_settings(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    settings.webhook_allow_private = false;
    let app = crate::helpers::spawn_with(settings).await;
    for url in [
        "http://127.0.0.1:9/hook",
        "http://localhost/hook",
        "http://169.254.169.254/",
        "ftp://example.com/",
    ] {
        let (status, body) = create_webhook(&app, json!({"id": "x", "url": url})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{url}: {body}");
        assert_eq!(body["errors"][0]["field"], "url", "{body}");
    }
    let (status, body) = create_webhook(
        &app,
        json!({"id": "x", "url": "https://example.com/h",
        "events": ["budget.exploded"]}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let listed = app.admin_get("/admin/webhooks").await;
    assert_eq!(listed.body["items"], json!([]), "nothing was created");

    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let receiver = Receiver::start(0).await;
    let (_, created) = create_webhook(&app, json!({"id": "ops", "url": receiver.url})).await;
    let old = created["secret"].as_str().unwrap().to_owned();
    let rotated = app
        .send(app.admin(reqwest::Method::POST, "/admin/webhooks/ops/rotate-secret"))
        .await;
    let new = rotated.body["secret"].as_str().unwrap().to_owned();
    assert_ne!(old, new);
    let sent = app
        .send(app.admin(reqwest::Method::POST, "/admin/webhooks/ops/test"))
        .await;
    assert_eq!(sent.status, StatusCode::ACCEPTED, "{}", sent.body);
    let got = receiver.until(&app, 0, |got| !got.is_empty()).await;
    assert_eq!(got[0].id, sent.body["event_id"].as_str().unwrap());
    assert!(
        signed_with(&got[0], &new) && signed_with(&got[0], &old),
        "both secrets sign during the grace: {:?}",
        got[0]
    );
}

/// The events delivered, as (webhook-id, subject, type, threshold), sorted.
fn delivered(got: &[Received]) -> Vec<(String, String, String, u64)> {
    let mut seen: Vec<(String, String, String, u64)> = got
        .iter()
        .filter(|r| r.answered == 200)
        .map(|r| {
            let event: Value = serde_json::from_str(&r.body).unwrap();
            (
                r.id.clone(),
                event["budget"]["subject"].as_str().unwrap().to_owned(),
                event["type"].as_str().unwrap().to_owned(),
                event["threshold"].as_u64().unwrap(),
            )
        })
        .collect();
    seen.sort();
    seen.dedup();
    seen
}

/// The receiver is down (nothing listens) while the crossings happen and for 30 s of the
/// service's clock after; started again, it gets every event; and after a kill -9 right
/// after a crossing, that event arrives too.
async fn a_receiver_down_for_30_s_and_a_kill_9_lose_nothing(counters: CounterBackend) {
    let app = spawn_app(PolicyBackend::Postgres, counters).await;
    sms_with_thresholds(&app).await;
    let address = format!("127.0.0.1:{}", crate::helpers::free_port());
    let url = format!("http://{address}/hook");
    let (status, created) = create_webhook(&app, json!({"id": "ops", "url": url})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    for _ in 0..10 {
        app.consume("sms.send", "user-1", 1).await;
    }
    app.engine.drain_ledger_now().await;
    for _ in 0..6 {
        app.advance(5);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let deliveries = app.admin_get("/admin/webhooks/ops/deliveries").await;
    let failed = deliveries.body["items"].as_array().unwrap();
    assert!(
        failed.len() == 2
            && failed
                .iter()
                .all(|d| d["state"] == "pending" && d["attempts"].as_u64() >= Some(1)),
        "attempted, and failed: {}",
        deliveries.body
    );
    let receiver = Receiver::start_at(&address, 0).await;
    let got = receiver
        .until(&app, 60, |got| delivered(got).len() >= 2)
        .await;
    let thresholds: Vec<u64> = delivered(&got).iter().map(|d| d.3).collect();
    assert_eq!(thresholds.len(), 2, "{got:?}");

    // A crossing for user-2, then kill -9 at once: its event is delivered after the restart.
    for _ in 0..5 {
        app.consume("sms.send", "user-2", 1).await;
    }
    let app = app.crash_restart().await;
    let got = receiver
        .until(&app, 60, |got| {
            delivered(got).iter().any(|d| d.1 == "user-2" && d.3 == 50)
        })
        .await;
    let events = delivered(&got);
    assert_eq!(
        events.len(),
        3,
        "one event per crossing, no more: {events:?}"
    );
}

/// Two instances on one Redis (or cluster) take 300 consumes at once, over 20 users of a
/// 10-a-day policy alerting at 50% and 100%: each crossing (user, threshold) is delivered,
/// under one id only.
async fn two_instances_racing_deliver_each_crossing_once(counters: CounterBackend) {
    let first = spawn_app(PolicyBackend::Postgres, counters).await;
    sms_with_thresholds(&first).await;
    let receiver = Receiver::start(0).await;
    let (status, created) = create_webhook(&first, json!({"id": "ops", "url": receiver.url})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let mut apps = vec![std::sync::Arc::new(first)];
    if counters != CounterBackend::Memory {
        apps.push(std::sync::Arc::new(
            crate::helpers::spawn_with(apps[0].settings.clone()).await,
        ));
    }
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let app = apps[i % apps.len()].clone();
            tokio::spawn(async move {
                let answer = app
                    .consume("sms.send", &format!("user-{}", i % 20), 1)
                    .await;
                assert!(
                    matches!(
                        answer.status,
                        StatusCode::OK | StatusCode::TOO_MANY_REQUESTS
                    ),
                    "{}",
                    answer.body
                );
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    for app in &apps {
        app.engine.drain_ledger_now().await;
    }
    let got = receiver
        .until(&apps[0], 0, |got| delivered(got).len() >= 40)
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let events = delivered(&receiver.received());
    let crossings: std::collections::BTreeSet<(String, u64)> =
        events.iter().map(|d| (d.1.clone(), d.3)).collect();
    assert_eq!(
        (events.len(), crossings.len()),
        (40, 40),
        "20 users x 2 thresholds, each under one id: {got:?}"
    );
}

crate::on_counter_stores!(
    ten_consumes_deliver_two_signed_events,
    a_receiver_down_for_30_s_and_a_kill_9_lose_nothing,
    two_instances_racing_deliver_each_crossing_once
);

/// `quota-ledger webhooks ARGS` against `app`: exit status, stdout, stderr.
/// An event that commits after one with a higher `seq` is delivered too. Two appends at
/// once (the drain's two lanes, two instances) do that: each holds the appends' advisory
/// lock, shared, until it commits (as here, by hand), and the dispatcher moves a cursor
/// only up to the `seq` every event below which is settled. Moved past the lower one, it
/// would never deliver it.
#[tokio::test]
async fn an_event_committed_after_a_later_one_is_delivered_too_on_postgres() {
    let app = spawn_app(PolicyBackend::Postgres, CounterBackend::Memory).await;
    let receiver = Receiver::start(0).await;
    let (status, created) = create_webhook(&app, json!({"id": "ops", "url": receiver.url})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let pool = sqlx::PgPool::connect(&app.settings.database_url)
        .await
        .unwrap();
    let append = |id: &'static str| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query("SELECT pg_advisory_xact_lock_shared(8173014559320534628)")
                .execute(&mut *tx)
                .await
                .unwrap();
            sqlx::query(
                "INSERT INTO alert_events (id, event_type, at, payload) \
                 VALUES ($1, 'budget.threshold', now(), $2)",
            )
            .bind(id)
            .bind(json!({"id": id, "type": "budget.threshold", "action": "sms.send"}))
            .execute(&mut *tx)
            .await
            .unwrap();
            tx
        }
    };
    let slow = append("ev-slow").await;
    append("ev-fast").await.commit().await.unwrap();
    // Ticks of the dispatcher pass while the slow one is in flight.
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    slow.commit().await.unwrap();
    let got = receiver.until(&app, 0, |got| got.len() >= 2).await;
    let mut ids: Vec<&str> = got.iter().map(|r| r.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["ev-fast", "ev-slow"]);
}

async fn webhooks_cli(app: &TestApp, args: &[&str]) -> (i32, String, String) {
    let args: Vec<&str> = std::iter::once("webhooks")
        .chain(args.iter().copied())
        .collect();
    crate::helpers::cli(app, &args).await
}

#[tokio::test]
async fn the_cli_manages_endpoints_sends_a_test_and_reads_the_deliveries() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let receiver = Receiver::start(0).await;
    let (code, out, err) = webhooks_cli(
        &app,
        &[
            "create",
            "--id",
            "ops",
            "--endpoint",
            &receiver.url,
            "--events",
            "budget.threshold,webhook.test",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let secret = out.trim().to_owned();
    assert!(
        secret.starts_with("whsec_"),
        "the secret alone on stdout: {out}"
    );
    assert!(err.contains("shown this once"), "{err}");

    let (code, listed, _) = webhooks_cli(&app, &["list"]).await;
    assert_eq!(code, 0);
    assert_eq!(
        listed.trim(),
        format!(
            "ops\tenabled\t{}\tevents=budget.threshold,webhook.test\tactions=all",
            receiver.url
        )
    );
    assert!(!listed.contains(&secret[6..]), "never the secret: {listed}");

    let (code, event_id, err) = webhooks_cli(&app, &["test", "ops"]).await;
    assert_eq!(code, 0, "{err}");
    let got = receiver.until(&app, 0, |got| !got.is_empty()).await;
    assert_eq!(got[0].id, event_id.trim());
    assert!(signed_with(&got[0], &secret), "{:?}", got[0]);
    let (code, deliveries, _) = webhooks_cli(&app, &["deliveries", "ops"]).await;
    assert_eq!(code, 0);
    assert!(
        deliveries.starts_with(&format!(
            "{}\twebhook.test\tdelivered\tattempts=1\tlast_status=200",
            event_id.trim()
        )),
        "{deliveries}"
    );

    let (code, off, _) = webhooks_cli(&app, &["disable", "ops"]).await;
    assert_eq!(
        (code, off.split('\t').nth(1)),
        (0, Some("disabled")),
        "{off}"
    );
    let read = app.admin_get("/admin/webhooks/ops").await;
    assert_eq!(read.body["enabled"], json!(false), "{}", read.body);
    let (code, rotated, _) = webhooks_cli(&app, &["rotate-secret", "ops"]).await;
    assert!(code == 0 && rotated.trim().starts_with("whsec_") && rotated.trim() != secret);

    let (code, _, err) = webhooks_cli(&app, &["delete", "ops"]).await;
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = webhooks_cli(&app, &["delete", "ops"]).await;
    assert!(code != 0 && err.contains("404"), "{err}");
    let (code, _, err) =
        webhooks_cli(&app, &["create", "--id", "x", "--endpoint", "ftp://a"]).await;
    assert!(code != 0 && err.contains("url"), "the field named: {err}");
}

/// A self-signed certificate for `127.0.0.1` and `localhost` (valid until 2126), and its
/// key: no public authority vouches for it.
const SELF_SIGNED_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBmjCCAUGgAwIBAgIUCNhKpm/0qUPiBxS059ZIWQA2rlAwCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJbG9jYWxob3N0MCAXDTI2MTEyNzIyMDg1MVoYDzIxMjYxMTAz
MjIwODUxWjAUMRIwEAYDVQQDDAlsb2NhbGhvc3QwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAAQZW8n9ISdrNYslbpwArKba8HRTxAAoFHWaOt14OS5C397G36ZXEHEC
J0EDAQA5/HK1GxoejsxIsOEkpN4Y0h+fo28wbTAdBgNVHQ4EFgQUEahRI7gGQNpK
r7eFZMA+VXOAKLIwHwYDVR0jBBgwFoAUEahRI7gGQNpKr7eFZMA+VXOAKLIwDwYD
VR0TAQH/BAUwAwEB/zAaBgNVHREEEzARgglsb2NhbGhvc3SHBH8AAAEwCgYIKoZI
zj0EAwIDRwAwRAIgYa5op9EP74dLawsfeobEXyEWv9Z8/Qh3sME3W25AZmACIBWZ
7CCTpw4NkbCIhEcFwsxQM6lQTz6fVmkPGWC8L9jh
-----END CERTIFICATE-----
";
const SELF_SIGNED_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgBzuoj+/zK0TRVI/U
3B0BkCVipov1pBI1P2uM8u3aK+6hRANCAAQZW8n9ISdrNYslbpwArKba8HRTxAAo
FHWaOt14OS5C397G36ZXEHECJ0EDAQA5/HK1GxoejsxIsOEkpN4Y0h+f
-----END PRIVATE KEY-----
";

/// An `https://` endpoint is reached over TLS, and its certificate is checked: a receiver
/// whose certificate no authority signed never gets the event (the handshake fails, and
/// the delivery log says why).
#[tokio::test]
async fn an_https_endpoint_gets_tls_and_an_untrusted_certificate_is_refused() {
    use tokio_rustls::rustls::{self, pki_types::pem::PemObject};
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(SELF_SIGNED_CERT.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(SELF_SIGNED_KEY.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/hook", listener.local_addr().unwrap());
    let handshakes: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = handshakes.clone();
    let server = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let outcome = match acceptor.accept(socket).await {
                Ok(_) => "accepted".to_owned(),
                Err(error) => error.to_string(),
            };
            seen.lock().unwrap().push(outcome);
        }
    });

    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let (status, created) = create_webhook(&app, json!({"id": "tls", "url": url})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let sent = app
        .send(app.admin(reqwest::Method::POST, "/admin/webhooks/tls/test"))
        .await;
    assert_eq!(sent.status, StatusCode::ACCEPTED, "{}", sent.body);
    let delivery = crate::helpers::eventually(
        std::time::Duration::from_secs(20),
        "a failed attempt in the delivery log",
        || async {
            let listed = app.admin_get("/admin/webhooks/tls/deliveries").await;
            let delivery = listed.body["items"][0].clone();
            (delivery["attempts"].as_u64() >= Some(1)).then_some(delivery)
        },
    )
    .await;
    server.abort();
    let error = delivery["last_error"].as_str().unwrap_or_default();
    assert!(
        delivery["state"] == "pending" && error.contains("certificate"),
        "refused for its certificate: {delivery}"
    );
    let handshakes = handshakes.lock().unwrap().clone();
    assert!(
        !handshakes.is_empty() && handshakes.iter().all(|h| h != "accepted"),
        "the service spoke TLS, and gave up in the handshake: {handshakes:?}"
    );
}
