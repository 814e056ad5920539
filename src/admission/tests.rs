use super::*;
use std::time::Instant;

fn admission(in_flight: usize, queued: usize, wait_ms: u64) -> Arc<Admission> {
    let limits = Limits {
        in_flight,
        queued,
        wait: Duration::from_millis(wait_ms),
    };
    Arc::new(Admission::new(limits, Arc::default()))
}

/// A request waiting for a slot in its own task: when it was served, or why not.
fn waiter(admission: &Arc<Admission>) -> tokio::task::JoinHandle<Result<Instant, Refused>> {
    let admission = admission.clone();
    tokio::spawn(async move { admission.admit().await.map(|_slot| Instant::now()) })
}

/// Waits (a little) until `admission` has `n` requests queued.
async fn until_queued(admission: &Admission, n: usize) {
    for _ in 0..500 {
        if admission.queued() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("{} queued, not {n}", admission.queued());
}

#[tokio::test]
async fn slots_count_the_requests_in_flight_and_at_least_one_is_served() {
    let admission = admission(2, 0, 10);
    let first = admission.admit().await.expect("a free slot");
    let second = admission.admit().await.expect("a free slot");
    assert_eq!(admission.in_flight(), 2);
    assert_eq!(
        admission.admit().await.expect_err("refused"),
        Refused::QueueFull
    );
    assert_eq!(admission.shed(), 1);
    drop(first);
    assert_eq!(admission.in_flight(), 1);
    drop(second);
    assert_eq!(admission.in_flight(), 0);
    let none = Admission::new(
        Limits {
            in_flight: 0,
            queued: 0,
            wait: Duration::ZERO,
        },
        Arc::default(),
    );
    assert_eq!(none.limits().in_flight, 1, "at least one");
}

#[tokio::test]
async fn a_freed_slot_goes_to_the_newest_waiter() {
    let admission = admission(1, 8, 5_000);
    let slot = admission.admit().await.expect("a free slot");
    let older = waiter(&admission);
    until_queued(&admission, 1).await;
    let newer = waiter(&admission);
    until_queued(&admission, 2).await;
    drop(slot);
    let newer = newer
        .await
        .expect("the task ran")
        .expect("the newest waiter is served");
    let older = older
        .await
        .expect("the task ran")
        .expect("then the older one");
    assert!(newer <= older, "newest first");
    assert_eq!((admission.in_flight(), admission.queued()), (0, 0));
    assert_eq!(admission.shed(), 0);
}

#[tokio::test]
async fn a_full_queue_refuses_its_oldest_waiter_and_keeps_the_newest() {
    let admission = admission(1, 1, 5_000);
    let slot = admission.admit().await.expect("a free slot");
    let older = waiter(&admission);
    until_queued(&admission, 1).await;
    let newer = waiter(&admission);
    let started = Instant::now();
    assert_eq!(
        older.await.expect("the task ran").map(drop),
        Err(Refused::Waited)
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused at once"
    );
    assert_eq!(admission.queued(), 1);
    drop(slot);
    assert_eq!(newer.await.expect("the task ran").map(drop), Ok(()));
    assert_eq!((admission.in_flight(), admission.shed()), (0, 1));
}

#[tokio::test]
async fn a_request_waits_at_most_the_queue_wait() {
    let admission = admission(1, 8, 50);
    let slot = admission.admit().await.expect("a free slot");
    let started = Instant::now();
    assert_eq!(
        admission.admit().await.expect_err("refused"),
        Refused::Waited
    );
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(50), "{waited:?}");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    assert_eq!(admission.shed(), 1);
    // The refused request left a stale entry; a freed slot skips it.
    drop(slot);
    assert_eq!((admission.in_flight(), admission.queued()), (0, 0));
}

#[tokio::test]
async fn a_slot_handed_to_a_request_that_left_is_passed_on() {
    let admission = admission(1, 8, 5_000);
    let slot = admission.admit().await.expect("a free slot");
    // A waiter whose caller leaves after the slot was handed over but before it ran.
    let (sender, receiver) = oneshot::channel();
    admission.lock().waiting.push_back(Waiter {
        slot: sender,
        since: Instant::now(),
    });
    let ticket = Ticket {
        admission: admission.clone(),
        slot: receiver,
    };
    drop(slot);
    assert_eq!(admission.in_flight(), 1, "handed over, still in flight");
    drop(ticket);
    assert_eq!(admission.in_flight(), 0, "the slot was freed, not lost");
    let _again = admission.admit().await.expect("the slot is free again");
}

#[tokio::test]
async fn under_contention_no_more_than_the_limit_run_at_once_and_no_slot_is_lost() {
    let admission = admission(4, 64, 5_000);
    let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..48)
        .map(|_| {
            let (admission, running, most) = (admission.clone(), running.clone(), most.clone());
            tokio::spawn(async move {
                let _slot = admission.admit().await.expect("all fit in the queue");
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                running.fetch_sub(1, Ordering::SeqCst);
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("the task ran");
    }
    assert_eq!(most.load(Ordering::SeqCst), 4);
    assert_eq!((admission.in_flight(), admission.queued()), (0, 0));
    assert_eq!(admission.shed(), 0);
}

#[tokio::test]
async fn a_slot_left_for_arrivals_goes_to_a_waiter_when_none_arrives() {
    let admission = admission(1, 8, 5_000);
    let slot = admission.admit().await.expect("a free slot");
    let started = Instant::now();
    let stale = waiter(&admission);
    tokio::time::sleep(FRESH * 3).await;
    queued_now(&admission); // arrivals seemed to keep up: the slot is left to them
    drop(slot);
    let served = stale.await.expect("the waiter ran").expect("served");
    let waited = served.duration_since(started);
    assert!(
        waited < Duration::from_secs(1),
        "the freed slot sat idle for {waited:?} while a request waited for it"
    );
}

/// Marks a request as having queued just now (the instance is saturated).
fn queued_now(admission: &Admission) {
    admission.lock().last_queued = Some(Instant::now());
}

/// An instance whose two slots are taken (the first and second returned) with one waiter
/// queued behind them, which has waited long enough to be stale.
async fn full_with_a_stale_waiter(
    wait_ms: u64,
    stale_after: Duration,
) -> (
    Arc<Admission>,
    Slot,
    Slot,
    tokio::task::JoinHandle<Result<Instant, Refused>>,
) {
    let admission = admission(2, 8, wait_ms);
    let first = admission.admit().await.expect("a free slot");
    let second = admission.admit().await.expect("a free slot");
    let stale = waiter(&admission);
    until_queued(&admission, 1).await;
    tokio::time::sleep(stale_after).await;
    (admission, first, second, stale)
}

#[tokio::test]
async fn while_requests_arrive_a_freed_slot_is_left_for_them_not_for_a_stale_waiter() {
    let (admission, first, second, stale) = full_with_a_stale_waiter(5_000, FRESH * 3).await;
    queued_now(&admission);
    drop(second);
    assert_eq!(
        (admission.in_flight(), admission.queued()),
        (1, 1),
        "the slot is left free for the next arrival"
    );
    let fresh = admission
        .admit()
        .await
        .expect("an arrival takes the free slot");
    assert_eq!(admission.in_flight(), 2);
    // Arrivals pause: the next freed slot goes to the stale waiter after all.
    tokio::time::sleep(ARRIVING * 2).await;
    let freed = Instant::now();
    drop(fresh);
    let served = stale
        .await
        .expect("the task ran")
        .expect("served once arrivals paused");
    assert!(served >= freed);
    drop(first);
    assert_eq!((admission.in_flight(), admission.queued()), (0, 0));
    assert_eq!(admission.shed(), 0);
}

#[tokio::test]
async fn a_waiter_whose_wait_ran_out_takes_a_slot_no_arrival_took() {
    let (admission, _first, second, stale) = full_with_a_stale_waiter(100, FRESH * 3).await;
    queued_now(&admission);
    drop(second);
    assert_eq!(
        admission.in_flight(),
        1,
        "left for an arrival that never comes"
    );
    assert_eq!(
        stale.await.expect("the task ran").map(drop),
        Ok(()),
        "taken when the wait ran out"
    );
    assert_eq!(admission.shed(), 0);
}

#[tokio::test]
async fn after_a_burst_a_stale_waiter_gets_the_next_freed_slot() {
    // The burst is over: nothing has queued since the waiter, which is stale by now.
    let (admission, _first, second, stale) =
        full_with_a_stale_waiter(5_000, ARRIVING.max(FRESH) * 3).await;
    drop(second);
    let served = tokio::time::timeout(Duration::from_secs(1), stale)
        .await
        .expect("served at once, not left to wait out its 5 s while a slot stood free");
    assert_eq!(served.expect("the task ran").map(drop), Ok(()));
    assert_eq!((admission.in_flight(), admission.shed()), (1, 0));
}

#[tokio::test]
async fn admitted_requests_wait_while_the_drains_latest_commit_carried_an_old_entry() {
    let lag = Arc::new(Lag::default());
    let limits = Limits {
        in_flight: 4,
        queued: 0,
        wait: Duration::from_millis(10),
    };
    let admission = Arc::new(
        Admission::new(limits, Arc::default()).pacing(lag.clone(), Duration::from_millis(500)),
    );
    let _slot = admission.admit().await.expect("a free slot");
    assert_eq!(admission.paced(), 0, "nothing committed yet");

    let now = chrono::Utc::now();
    lag.observe_all(now, [now - chrono::Duration::seconds(2)].into_iter());
    let start = Instant::now();
    let _slot = admission.admit().await.expect("a free slot");
    assert!(start.elapsed() >= PACE, "paced: {:?}", start.elapsed());
    assert_eq!(admission.paced(), 1);

    lag.observe_all(chrono::Utc::now(), std::iter::empty());
    let _slot = admission.admit().await.expect("a free slot");
    assert_eq!(admission.paced(), 1, "the drain caught up: not paced");

    let never =
        Arc::new(Admission::new(limits, Arc::default()).pacing(lag.clone(), Duration::ZERO));
    lag.observe_all(now, [now - chrono::Duration::seconds(2)].into_iter());
    let _slot = never.admit().await.expect("a free slot");
    assert_eq!(never.paced(), 0, "QUOTA_LEDGER_PACE_MS=0 never paces");
}
