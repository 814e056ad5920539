use super::consume::parse_reply;
use crate::engine::store::{Algorithm, Charge, Evaluation, Outcome, StoreError};
use crate::keys;
use redis::Value;

/// One calendar charge of 1 against a limit of 5.
pub(in crate::counters::redis) fn one_charge() -> Vec<Charge> {
    vec![Charge {
        key: keys::CounterKey::read("k"),
        algorithm: Algorithm::Calendar { period_end_ms: 10 },
        limit: 5,
        cost: 1,
        enforce: true,
    }]
}

#[test]
fn a_well_formed_reply_becomes_an_evaluation() {
    let reply = Value::Array([0, 5, 0, 10, 10].map(Value::Int).to_vec());
    let evaluation = parse_reply(reply, &one_charge()).expect("parses");
    let denied = Outcome {
        used: 5,
        allowed: false,
        resets_at_ms: 10,
        retry_at_ms: Some(10),
    };
    assert_eq!(
        evaluation,
        Evaluation {
            allowed: false,
            outcomes: vec![denied]
        }
    );
}

#[test]
fn replies_of_the_wrong_shape_are_protocol_errors() {
    let replies = [
        Value::Okay,
        Value::Array([1, 5, 1, 10].map(Value::Int).to_vec()),
        Value::Array([1, 5, 2, 10, -1].map(Value::Int).to_vec()),
        Value::Array([1, -5, 1, 10, -1].map(Value::Int).to_vec()),
        Value::Array(vec![
            Value::Int(1),
            Value::Nil,
            Value::Int(1),
            Value::Int(0),
            Value::Int(-1),
        ]),
    ];
    for reply in replies {
        let error = parse_reply(reply.clone(), &one_charge());
        assert!(
            matches!(error, Err(StoreError::Protocol(_))),
            "{reply:?}: {error:?}"
        );
    }
}
