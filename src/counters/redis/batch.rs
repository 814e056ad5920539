//! Decisions batched per connection, on a standalone Redis: while a decision's script call
//! is in flight on this thread's connection, the decisions that come next wait, and then go
//! together in one call of the batch script: `consume.lua`'s body run once per decision, in
//! the order they came, each atomic and exact as alone (its own call deadline, epochs and
//! generations checked, its own reply). Redis then parses, looks up and runs one script
//! call for many decisions. An idle connection adds no wait: a decision that finds nothing
//! in flight is sent at once, alone, as `consume.lua` itself.
//!
//! The queue is this thread's (as the connection is), and is handed on by whoever's call
//! completes: to the first decision still waiting, which sends every waiting decision (at
//! most [`MAX_BATCH`]) as one call and hands on in turn; when none waits, the queue is idle.
//! A decision waits at most the store's timeout from when it came; one that gave up before
//! it was sent is left out. A leader whose caller stops waiting still hands the queue on
//! (its guard does), and the decisions it carried are told their outcome is unknown, as
//! after a timeout: each is then voided once settled, if Redis ran it
//! (`engine::recovery::void`).
//!
//! On a Redis Cluster decisions go one by one: batching there would be per slot.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use redis::{Arg, Cmd, Script, Value};
use tokio::sync::oneshot;

use super::connection::Connection;
use super::script::consume::LUA;
use super::RedisCounterStore;
use crate::engine::store::{DecisionCalls, StoreError};

/// The most decisions one call carries.
pub(super) const MAX_BATCH: usize = 64;

/// The reply to one decision, with the connection it ran on (a `WAIT` must go there).
type Reply = Result<(Value, Connection), StoreError>;

/// What a waiting decision is told: its reply, or that it leads the next call.
enum Turn {
    /// Its reply (or the failure of the call that carried it).
    Done(Reply),
    /// It sends `own` with `others` (which waited after it) in one call; `leader` hands the
    /// queue on once it is done (or if this is never read).
    Lead {
        own: Cmd,
        others: Vec<Waiting>,
        leader: Leader,
    },
}

/// A decision waiting for the call in flight to complete.
struct Waiting {
    call: Cmd,
    turn: oneshot::Sender<Turn>,
}

/// One thread's queue for one store.
#[derive(Default)]
pub(super) struct Queue {
    /// A call is in flight (or about to be sent).
    busy: bool,
    waiting: Vec<Waiting>,
}

type SharedQueue = Arc<Mutex<Queue>>;

thread_local! {
    /// This thread's queue for each live store, by the store's `id` (as its connections).
    static QUEUES: RefCell<Vec<(Weak<()>, SharedQueue)>> = const { RefCell::new(Vec::new()) };
}

/// How decisions went (shared by a store's clones): every decision sent, the calls that
/// carried them, and the decisions sent in calls of several.
#[derive(Debug, Default)]
pub(super) struct Batched {
    decisions: AtomicU64,
    calls: AtomicU64,
    together: AtomicU64,
}

impl Batched {
    /// One call sent, carrying `decisions`.
    fn sent(&self, decisions: usize) {
        let n = decisions as u64;
        self.decisions.fetch_add(n, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        if n > 1 {
            self.together.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The decisions sent in calls of several so far.
    #[cfg(test)]
    pub(super) fn count(&self) -> u64 {
        self.together.load(Ordering::Relaxed)
    }

    /// Every decision sent so far, and the calls that carried them.
    pub(super) fn calls(&self) -> DecisionCalls {
        DecisionCalls {
            decisions: self.decisions.load(Ordering::Relaxed),
            calls: self.calls.load(Ordering::Relaxed),
        }
    }
}

/// The batch script: `consume.lua` as a function of its KEYS and ARGV, called once per
/// decision. Its own ARGV: the count of decisions, then per decision the count of its keys
/// and of its arguments, then every decision's arguments in order; KEYS: every decision's
/// keys in order. The reply: one element per decision, its reply as `consume.lua` gives it,
/// or `{-9, message}` where it raised an error (the others are answered all the same).
pub(super) fn script() -> Script {
    let (shebang, body) = LUA.split_once('\n').unwrap_or(("", LUA));
    Script::new(&format!(
        "{shebang}\nlocal function one(KEYS, ARGV)\n{body}\nend\n{}",
        include_str!("script/batch.lua")
    ))
}

impl RedisCounterStore {
    /// Runs one decision's `call` of the decision script: batched with the decisions that
    /// queue while a call is in flight on this thread's connection (standalone Redis), else
    /// on its own.
    pub(super) async fn exec_decision(&self, call: Cmd) -> Reply {
        if self.cluster {
            self.batched.sent(1);
            return self.exec_on(&self.script, &call).await;
        }
        let queue = self.queue();
        let (turn, told) = oneshot::channel();
        let lead = {
            let mut q = lock(&queue);
            match q.busy {
                true => {
                    q.waiting.push(Waiting { call, turn });
                    None
                }
                false => {
                    q.busy = true;
                    Some(call)
                }
            }
        };
        if let Some(call) = lead {
            let _leader = Leader(Some(queue));
            self.batched.sent(1);
            return self.exec_on(&self.script, &call).await;
        }
        let told = match tokio::time::timeout(self.timeout, told).await {
            Ok(Ok(turn)) => turn,
            // The call that carried it was dropped mid-way: it may have run.
            Ok(Err(_)) => return Err(unknown()),
            Err(_) => {
                return Err(StoreError::Timeout(format!(
                    "no answer from Redis within {} ms (waiting behind the call in flight)",
                    self.timeout.as_millis()
                )))
            }
        };
        match told {
            Turn::Done(reply) => reply,
            Turn::Lead {
                own,
                others,
                leader: _leader,
            } => self.lead(own, others).await,
        }
    }

    /// Sends `own` and `others` in one call (`own` alone when none waited), answers each
    /// of `others`, and returns `own`'s reply.
    async fn lead(&self, own: Cmd, others: Vec<Waiting>) -> Reply {
        if others.is_empty() {
            self.batched.sent(1);
            return self.exec_on(&self.script, &own).await;
        }
        let calls: Vec<&Cmd> = std::iter::once(&own)
            .chain(others.iter().map(|w| &w.call))
            .collect();
        self.batched.sent(calls.len());
        let command = batch_command(&self.batch, &calls);
        let reply = self.exec_on(&self.batch, &command).await;
        let mut replies = split(reply, calls.len());
        for (waiting, reply) in others.into_iter().zip(replies.drain(1..)) {
            // One that stopped waiting is answered 503 already: its outcome is in doubt.
            let _ = waiting.turn.send(Turn::Done(reply));
        }
        replies.pop().unwrap_or_else(|| Err(unknown()))
    }

    /// This thread's queue for this store.
    fn queue(&self) -> SharedQueue {
        QUEUES.with(|queues| {
            let mut queues = queues.borrow_mut();
            let id = Arc::as_ptr(&self.id);
            if let Some((_, queue)) = queues.iter().find(|(owner, _)| owner.as_ptr() == id) {
                return queue.clone();
            }
            queues.retain(|(owner, _)| owner.strong_count() > 0);
            let queue = SharedQueue::default();
            queues.push((Arc::downgrade(&self.id), queue.clone()));
            queue
        })
    }
}

/// The queue's lock (a panic while holding it leaves nothing half done).
fn lock(queue: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
    queue
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The failure of a decision whose call may or may not have run.
fn unknown() -> StoreError {
    StoreError::Unavailable("the call carrying this decision stopped half way".to_owned())
}

/// Hands its queue on when dropped (see [`hand_on`]), unless disarmed (`None`).
struct Leader(Option<SharedQueue>);

impl Drop for Leader {
    fn drop(&mut self) {
        if let Some(queue) = self.0.take() {
            hand_on(&queue);
        }
    }
}

/// Hands `queue` on: to the first decision still waiting (with those after it, up to
/// [`MAX_BATCH`]), or marks it idle when none waits.
fn hand_on(queue: &SharedQueue) {
    let mut q = lock(queue);
    // Those that stopped waiting (answered 503 already) are not sent.
    q.waiting.retain(|w| !w.turn.is_closed());
    while !q.waiting.is_empty() {
        let first = q.waiting.len().min(MAX_BATCH);
        let rest = q.waiting.split_off(first);
        let mut batch = std::mem::replace(&mut q.waiting, rest);
        let head = batch.remove(0);
        let lead = Turn::Lead {
            own: head.call,
            others: batch,
            leader: Leader(Some(queue.clone())),
        };
        match head.turn.send(lead) {
            Ok(()) => return,
            // It stopped waiting before it was sent: left out; the next leads.
            Err(Turn::Lead {
                others, mut leader, ..
            }) => {
                leader.0 = None;
                let later = std::mem::take(&mut q.waiting);
                q.waiting = others;
                q.waiting.extend(later);
            }
            Err(Turn::Done(_)) => {}
        }
    }
    q.busy = false;
}

/// A decision's call as the batch carries it: its keys, and its arguments.
type Parts<'a> = (Vec<&'a [u8]>, Vec<&'a [u8]>);

/// The batch script's call of `calls` (each an `EVALSHA` of the decision script).
fn batch_command(script: &Script, calls: &[&Cmd]) -> Cmd {
    let parts: Vec<Parts<'_>> = calls.iter().map(|call| keys_and_args(call)).collect();
    let keys: usize = parts.iter().map(|(k, _)| k.len()).sum();
    let size: usize = parts
        .iter()
        .flat_map(|(k, a)| k.iter().chain(a))
        .map(|v| v.len())
        .sum();
    let count = parts.iter().map(|(k, a)| k.len() + a.len()).sum::<usize>();
    let mut cmd = Cmd::with_capacity(4 + count + 2 * calls.len(), 64 + size + 8 * calls.len());
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    for (k, _) in &parts {
        for key in k {
            cmd.arg(*key);
        }
    }
    cmd.arg(calls.len());
    for (k, a) in &parts {
        cmd.arg(k.len()).arg(a.len());
    }
    for (_, a) in &parts {
        for arg in a {
            cmd.arg(*arg);
        }
    }
    cmd
}

/// The keys and the arguments of an `EVALSHA <sha> <numkeys> keys… args…`.
fn keys_and_args(call: &Cmd) -> Parts<'_> {
    let values: Vec<&[u8]> = call
        .args_iter()
        .filter_map(|arg| match arg {
            Arg::Simple(value) => Some(value),
            _ => None,
        })
        .collect();
    let keys = values
        .get(2)
        .and_then(|n| std::str::from_utf8(n).ok())
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    let rest = values.get(3..).unwrap_or_default();
    let (keys, args) = rest.split_at(keys.min(rest.len()));
    (keys.to_vec(), args.to_vec())
}

/// Each decision's reply from the batch's, `n` of them: the call's failure for each when
/// it failed (or its reply is not one per decision).
fn split(reply: Reply, n: usize) -> Vec<Reply> {
    let (value, connection) = match reply {
        Ok(reply) => reply,
        Err(error) => return (0..n).map(|_| Err(again(&error))).collect(),
    };
    let items = match value {
        Value::Array(items) if items.len() == n => items,
        other => {
            let why = format!("the batch script answered {other:?} for {n} decisions");
            return (0..n)
                .map(|_| Err(StoreError::Protocol(why.clone())))
                .collect();
        }
    };
    items
        .into_iter()
        .map(|item| match raised(&item) {
            Some(why) => Err(StoreError::Protocol(why)),
            None => Ok((item, connection.clone())),
        })
        .collect()
}

/// The failure of a call that carried several decisions, told to each.
fn again(error: &StoreError) -> StoreError {
    match error {
        StoreError::Unavailable(why) => StoreError::Unavailable(why.clone()),
        StoreError::NotConnected(why) => StoreError::NotConnected(why.clone()),
        StoreError::Misconfigured(why) => StoreError::Misconfigured(why.clone()),
        StoreError::Unreplicated(why) => StoreError::Unreplicated(why.clone()),
        StoreError::Timeout(why) => StoreError::Timeout(why.clone()),
        StoreError::Protocol(why) => StoreError::Protocol(why.clone()),
        StoreError::Rebuilding { shard } => StoreError::Rebuilding { shard: *shard },
    }
}

/// The error a decision raised in the batch script (`{-9, message}`), if it did.
fn raised(item: &Value) -> Option<String> {
    let Value::Array(parts) = item else {
        return None;
    };
    match parts.as_slice() {
        [Value::Int(-9), Value::BulkString(why)] => Some(format!(
            "the decision script failed: {}",
            String::from_utf8_lossy(why)
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
