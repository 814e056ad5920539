//! `X-Request-Id`: echoed when the caller sends a usable one, generated (and unique)
//! otherwise, on every answer: successes, problems and unknown routes alike.

use crate::helpers::{spawn_app, CounterBackend, PolicyBackend};
use std::collections::HashSet;

#[tokio::test]
async fn a_request_id_sent_by_the_caller_is_echoed_on_successes_and_on_problems() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let cases = [
        ("/healthz", None, "trace-4f2a/1"),
        ("/no/such/route", Some(404), "trace with spaces: 2"),
        (
            "/quota/usage?action=nope&subject=x",
            Some(404),
            &"x".repeat(128),
        ),
        ("/quota/usage", Some(422), "~!"),
    ];
    for (path, problem, id) in cases {
        let request = app.client.get(format!("{}{path}", app.address));
        let answer = app.send(request.header("x-request-id", id)).await;
        if let Some(status) = problem {
            answer.assert_problem(status);
        }
        assert_eq!(answer.header("x-request-id"), Some(id), "{path}");
    }
}

#[tokio::test]
async fn without_a_usable_request_id_every_answer_gets_a_fresh_unique_one() {
    let app = spawn_app(PolicyBackend::Sqlite, CounterBackend::Memory).await;
    let too_long = "x".repeat(129);
    let unusable: [Option<&[u8]>; 5] = [
        None,
        None,
        Some(too_long.as_bytes()),
        Some(b"tab\there"),
        Some("caf\u{e9}".as_bytes()),
    ];
    let mut seen = HashSet::new();
    for given in unusable {
        for path in ["/healthz", "/no/such/route"] {
            let mut request = app.client.get(format!("{}{path}", app.address));
            if let Some(bytes) = given {
                let value = reqwest::header::HeaderValue::from_bytes(bytes).unwrap();
                request = request.header("x-request-id", value);
            }
            let answer = app.send(request).await;
            let id = answer
                .header("x-request-id")
                .expect("an id on every answer");
            assert!(uuid::Uuid::parse_str(id).is_ok(), "{path}: {id}");
            assert!(seen.insert(id.to_owned()), "{id} was handed out twice");
        }
    }
}
