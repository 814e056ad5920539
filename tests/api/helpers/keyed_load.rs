//! Keyed consumes from several clients at once, remembering every one answered 200: what a
//! failover test checks was kept.

use super::TestApp;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Clients consuming `action` for `u-1`, each with a fresh idempotency key, until stopped.
pub struct KeyedLoad {
    answered: Arc<Mutex<Vec<(String, String)>>>,
    stop: Arc<AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

/// The body of a keyed consume of `action` for `u-1`.
pub fn keyed_consume(action: &str, key: &str) -> serde_json::Value {
    serde_json::json!({"action": action, "subject": "u-1", "idempotency_key": key})
}

impl KeyedLoad {
    /// Starts `clients` clients against `app`.
    pub fn start(app: &Arc<TestApp>, action: &str, clients: usize) -> Self {
        let answered: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let clients = (0..clients)
            .map(|client| {
                let (app, answered, stop) = (app.clone(), answered.clone(), stop.clone());
                let action = action.to_owned();
                tokio::spawn(async move {
                    let mut n = 0;
                    while !stop.load(Ordering::Acquire) {
                        n += 1;
                        let key = format!("c{client}-{n}");
                        let answer = app
                            .quota("/quota/consume", keyed_consume(&action, &key))
                            .await;
                        if answer.status == 200 {
                            let id = answer.body["consumption_id"].as_str().unwrap().to_owned();
                            answered.lock().unwrap().push((key, id));
                        }
                    }
                })
            })
            .collect();
        Self {
            answered,
            stop,
            clients,
        }
    }

    /// How many consumes were answered 200 so far.
    pub fn served(&self) -> usize {
        self.answered.lock().unwrap().len()
    }

    /// Stops the clients; every key answered 200, with its consumption id.
    pub async fn stop(self) -> Vec<(String, String)> {
        self.stop.store(true, Ordering::Release);
        for client in self.clients {
            client.await.unwrap();
        }
        let answered = self.answered.lock().unwrap().clone();
        answered
    }

    /// Asserts that retrying each of `answered` on `app` replays its first answer. A shard
    /// found older than the ledger (a failover, an old snapshot) answers 503 until it is
    /// rebuilt, within seconds: the retry is then retried, as a client would.
    pub async fn assert_replayed(app: &TestApp, action: &str, answered: &[(String, String)]) {
        for (key, id) in answered {
            let retried = super::eventually(
                std::time::Duration::from_secs(20),
                "the shard is rebuilt",
                || async {
                    let retried = app
                        .quota("/quota/consume", keyed_consume(action, key))
                        .await;
                    let detail = retried.body["detail"].as_str().unwrap_or_default();
                    let rebuilding = retried.status == 503 && detail.contains("being rebuilt");
                    (!rebuilding).then_some(retried)
                },
            )
            .await;
            assert_eq!(retried.status, 200, "{key}: {}", retried.body);
            assert_eq!(
                retried.body["replayed"], true,
                "{key} was answered 200: {}",
                retried.body
            );
            assert_eq!(retried.body["consumption_id"].as_str(), Some(id.as_str()));
        }
    }
}
