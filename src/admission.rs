//! Admission control: at most `QUOTA_MAX_IN_FLIGHT` `/quota/*` requests are served at once;
//! the next `QUOTA_MAX_QUEUED` wait for a free slot, newest first, at most
//! `QUOTA_QUEUE_WAIT_MS`; the rest are answered 503 with the `overloaded` problem type.
//!
//! Under a flood, requests that are all served at once make every Redis call late: the
//! calls pass their deadline, the circuit breaker takes the service's own queue for a
//! Redis outage, and `QUOTA_ON_STORE_ERROR=allow` would let the flood through unchecked.
//! Bounding the requests in flight keeps the admitted ones fast, so their calls stay
//! within the deadline, and an overloaded answer is never a reason to fail open.
//!
//! Why a queue, and which request gets a freed slot. Callers retry: answering every
//! request past the limit at once turns each refused caller into a loop that spends the
//! service's CPU on refusals, and goodput collapses (measured: 0.24x at 2,000
//! connections). A request that waits costs nothing but a parked task, so the excess
//! waits, and is refused only when its wait runs out, or at once when the queue is full
//! (the oldest first): refusals then come at a rate the service can afford.
//!
//! A freed slot goes to the newest waiter (adaptive LIFO): under a flood the requests
//! that get a slot have hardly waited, so their latency stays that of the admitted load,
//! and the ones left at the bottom of the stack are the ones refused. A waiter that has
//! waited longer than [`FRESH`] is stale: while the instance is saturated (a request had to
//! queue within [`ARRIVING`]), a freed slot goes to a fresh waiter or is left for the next
//! arrival, not to a stale waiter, which would be answered late. Once requests stop
//! queueing (a burst is over, arrivals find free slots), stale waiters get the free slots,
//! and a waiter whose wait ran out takes a slot no arrival took: after a burst, the queue
//! is served, not left to time out while slots stand free.
//! Admin, health and metrics endpoints are not counted: they stay responsive. The HTTP
//! side is `api::admission` (a middleware); gRPC admits each call itself.
//!
//! Pacing. In the Redis mode an allowed consume's ledger entry waits in a stream for the
//! drain, which shares the machine's cores with the requests. Under a sustained full load
//! the requests can take more CPU than leaves the drain enough to keep up, and entries
//! would wait longer and longer (seconds, then tens of seconds) for SQL. While the drain's
//! latest commit carried an entry older than `QUOTA_LEDGER_PACE_MS`, each admitted request
//! waits [`PACE`] with its slot before it is served: callers that await their answers send
//! fewer, and the drain catches up. A drain that commits nothing (SQL is down) paces
//! nothing: the backlog bound is for outages (see `crate::engine::pipeline::backlog`).

use crate::engine::load::Load;
use crate::engine::pipeline::lag::Lag;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// A waiter that has waited longer than this is stale (see the module's documentation).
pub(crate) const FRESH: Duration = Duration::from_millis(10);

/// The instance counts as saturated while a request had to queue within this long.
pub(crate) const ARRIVING: Duration = Duration::from_millis(10);

/// How long an admitted request waits while the ledger's drain is behind (see the module's
/// documentation).
pub(crate) const PACE: Duration = Duration::from_millis(1);

/// How requests are admitted: the configured bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most requests served at once (at least 1).
    pub in_flight: usize,
    /// The most requests waiting for a slot (0: none wait, the excess is refused at once).
    pub queued: usize,
    /// The longest a request waits for a slot.
    pub wait: Duration,
}

/// The slots of the requests in flight, and the requests waiting for one.
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    state: Mutex<State>,
    shed: AtomicU64,
    /// Told of every request that waits or is shed, so that timeouts meanwhile are taken
    /// for overload.
    load: Arc<Load>,
    /// The ledger writer's lag, and past what lag of its latest commit requests are paced
    /// (none when `None`).
    pacing: Option<(Arc<Lag>, Duration)>,
    paced: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    in_flight: usize,
    /// Newest at the back. A waiter whose receiver is gone (its request gave up) is
    /// skipped.
    waiting: VecDeque<Waiter>,
    /// When a request last arrived to find no free slot (and queued).
    last_queued: Option<Instant>,
}

/// A request waiting for a slot: a slot is handed over by sending on `slot`.
#[derive(Debug)]
struct Waiter {
    slot: oneshot::Sender<()>,
    since: Instant,
}

impl Waiter {
    fn left(&self) -> bool {
        self.slot.is_closed()
    }
}

/// A slot of a request in flight; dropping it frees the slot (for the newest waiter).
#[derive(Debug)]
#[must_use]
pub(crate) struct Slot(Arc<Admission>);

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.0.release() {
            return;
        }
        // The freed slot was left to the next arrival; if none comes within [`ARRIVING`],
        // the newest waiter gets it (never idle while requests wait for it).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let admission = self.0.clone();
            runtime.spawn(async move {
                tokio::time::sleep(ARRIVING).await;
                while admission.hand_over() {
                    tokio::time::sleep(ARRIVING).await;
                }
            });
        }
    }
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The queue was full (or there is none): refused at once.
    QueueFull,
    /// No slot came free within the wait, or newer requests took them.
    Waited,
}

/// A request waiting for a slot. If it is dropped (its wait ran out, or its caller left)
/// after a slot was handed to it, the slot is passed on, never lost.
struct Ticket {
    admission: Arc<Admission>,
    slot: oneshot::Receiver<()>,
}

impl Ticket {
    /// Stops waiting: the slot, if one was handed over meanwhile.
    fn close(&mut self) -> Option<Slot> {
        self.slot.close();
        self.slot
            .try_recv()
            .ok()
            .map(|()| Slot(self.admission.clone()))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        drop(self.close());
    }
}

impl Admission {
    /// Admits as `limits` say (at least one request in flight), telling `load` of the
    /// requests that wait or are refused.
    pub(crate) fn new(limits: Limits, load: Arc<Load>) -> Self {
        Self {
            limits: Limits {
                in_flight: limits.in_flight.max(1),
                ..limits
            },
            state: Mutex::default(),
            shed: AtomicU64::new(0),
            load,
            pacing: None,
            paced: AtomicU64::new(0),
        }
    }

    /// Paces admitted requests while `lag`'s latest commit carried an entry older than
    /// `after` (see the module's documentation); a zero `after` never paces.
    pub(crate) fn pacing(mut self, lag: Arc<Lag>, after: Duration) -> Self {
        self.pacing = (!after.is_zero()).then_some((lag, after));
        self
    }

    /// Requests that waited for the ledger's drain since the start.
    pub(crate) fn paced(&self) -> u64 {
        self.paced.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent whatever panicked while holding it: every change is
        // a single push, pop or count.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Requests being served now.
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight
    }

    /// Requests waiting for a slot now (some may have given up and not been skipped yet).
    pub fn queued(&self) -> usize {
        self.lock().waiting.len()
    }

    /// The most requests served at once.
    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    /// Requests answered 503 overloaded since the start.
    pub(crate) fn shed(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }

    /// A slot now, or after waiting for one (newest first), or the reason there is none;
    /// then, while the ledger's drain is behind, [`PACE`] more.
    pub(crate) async fn admit(self: &Arc<Self>) -> Result<Slot, Refused> {
        let slot = self.slot().await?;
        if let Some((lag, after)) = &self.pacing {
            if lag.behind_now(*after) {
                self.paced.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(PACE).await;
            }
        }
        Ok(slot)
    }

    /// A slot now, or after waiting for one (newest first), or the reason there is none.
    async fn slot(self: &Arc<Self>) -> Result<Slot, Refused> {
        let slot = {
            let now = Instant::now();
            let mut state = self.lock();
            if state.in_flight < self.limits.in_flight {
                state.in_flight += 1;
                return Ok(Slot(self.clone()));
            }
            self.load.shed();
            if self.limits.queued == 0 {
                return Err(self.refused(Refused::QueueFull));
            }
            while state.waiting.front().is_some_and(Waiter::left) {
                state.waiting.pop_front();
            }
            if state.waiting.len() >= self.limits.queued {
                // The oldest waiter is refused (its sender dropped wakes it); the newest
                // takes its place.
                state.waiting.pop_front();
            }
            state.last_queued = Some(now);
            let (sender, slot) = oneshot::channel();
            state.waiting.push_back(Waiter {
                slot: sender,
                since: now,
            });
            slot
        };
        let mut ticket = Ticket {
            admission: self.clone(),
            slot,
        };
        match tokio::time::timeout(self.limits.wait, &mut ticket.slot).await {
            Ok(Ok(())) => {
                // Received: the ticket has nothing left to pass on.
                Ok(Slot(self.clone()))
            }
            Ok(Err(_)) => Err(self.refused(Refused::Waited)),
            // A slot handed over just as the wait ran out is still taken, and so is a free
            // one that no arrival is about to take.
            Err(_) => match ticket.close() {
                Some(slot) => Ok(slot),
                None => self
                    .take_free()
                    .ok_or_else(|| self.refused(Refused::Waited)),
            },
        }
    }

    /// Whether arriving requests take the slots as they are freed: one arrived to find no
    /// free slot within [`ARRIVING`] (the instance is saturated). Then a freed slot is left to
    /// the newest arrivals rather than given to a stale waiter; otherwise arrivals find free
    /// slots, and a stale waiter is better served than left to time out.
    fn arrivals_keep_up(&self, state: &State, now: Instant) -> bool {
        state
            .last_queued
            .is_some_and(|last| now.saturating_duration_since(last) < ARRIVING)
    }

    /// A free slot for a waiter whose wait ran out, if one is free and arrivals do not keep
    /// up with the slots.
    fn take_free(self: &Arc<Self>) -> Option<Slot> {
        let mut state = self.lock();
        if state.in_flight < self.limits.in_flight && !self.arrivals_keep_up(&state, Instant::now())
        {
            state.in_flight += 1;
            return Some(Slot(self.clone()));
        }
        None
    }

    fn refused(&self, why: Refused) -> Refused {
        self.shed.fetch_add(1, Ordering::Relaxed);
        self.load.shed();
        why
    }

    /// Frees a slot, and hands the free slots to the newest waiters: to any, once
    /// requests stop arriving, else only to fresh ones (the next arrival takes the slot);
    /// whether a free slot was left to arrivals while a waiter waits.
    fn release(&self) -> bool {
        self.lock().in_flight -= 1;
        self.hand_over()
    }

    /// Hands the free slots to the newest waiters (see [`Admission::release`]); whether a
    /// free slot was left to arrivals while a waiter waits.
    fn hand_over(&self) -> bool {
        let now = Instant::now();
        let mut state = self.lock();
        let keeping_up = self.arrivals_keep_up(&state, now);
        while state.in_flight < self.limits.in_flight {
            let Some(newest) = state.waiting.back() else {
                return false;
            };
            let stale = now.saturating_duration_since(newest.since) > FRESH;
            if !newest.left() && stale && keeping_up {
                return true;
            }
            let newest = state.waiting.pop_back().expect("a waiter at the back");
            if newest.slot.send(()).is_ok() {
                state.in_flight += 1;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests;
