//! Admission control: at most `QUOTA_MAX_IN_FLIGHT` `/quota/*` requests are served at once,
//! and the excess is answered at once with 503 and the `overloaded` problem type.
//!
//! Under a flood, requests that wait inside the service make every Redis call late: the
//! calls pass their deadline, the circuit breaker takes the service's own queue for a
//! Redis outage, and `QUOTA_ON_STORE_ERROR=allow` would let the flood through unchecked.
//! Shedding the excess before any work keeps the admitted requests fast, so their calls
//! stay within the deadline, and an overloaded answer is never a reason to fail open.
//! Admin, health and metrics endpoints are not counted: they stay responsive.

use super::problem::ApiError;
use super::AppState;
use crate::engine::load::Load;
use crate::logs::Throttle;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The permits of the requests in flight.
#[derive(Debug)]
pub struct Admission {
    permits: Arc<Semaphore>,
    limit: usize,
    shed: AtomicU64,
    /// Told of every shed request, so that timeouts meanwhile are taken for overload.
    load: Arc<Load>,
}

impl Admission {
    /// Admits at most `limit` requests at once (at least 1), telling `load` of the others.
    pub(crate) fn new(limit: usize, load: Arc<Load>) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            shed: AtomicU64::new(0),
            load,
        }
    }

    /// Requests being served now.
    pub fn in_flight(&self) -> usize {
        self.limit - self.permits.available_permits()
    }

    /// The most requests served at once.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Requests answered 503 overloaded since the start.
    pub(crate) fn shed(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }
}

/// Serves a `/quota/*` request only if a permit is free, holding it until the answer is
/// built; answers the others 503 overloaded without reading their body.
pub(crate) async fn middleware(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let admission = req
        .app_data::<web::Data<AppState>>()
        // The path the router matches (percent-decoded), so `/%71uota/…` is counted too.
        .filter(|_| req.match_info().as_str().starts_with("/quota/"))
        .map(|state| state.admission.clone());
    let Some(admission) = admission else {
        return Ok(next.call(req).await?.map_into_left_body());
    };
    match admission.permits.clone().try_acquire_owned() {
        Ok(_permit) => Ok(next.call(req).await?.map_into_left_body()),
        Err(_) => {
            admission.shed.fetch_add(1, Ordering::Relaxed);
            static SITE: Throttle = Throttle::new();
            if let Some(count) = SITE.event() {
                tracing::warn!(
                    count,
                    limit = admission.limit,
                    "shedding load: quota requests answered 503 overloaded"
                );
            }
            admission.load.shed();
            let error = ApiError::Overloaded(format!(
                "the service has {} requests in flight, the most it serves at once; retry shortly",
                admission.limit
            ));
            Ok(req.error_response(error).map_into_right_body())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_count_the_requests_in_flight() {
        let admission = Admission::new(2, Arc::default());
        assert_eq!((admission.in_flight(), admission.limit()), (0, 2));
        let first = admission.permits.clone().try_acquire_owned();
        let second = admission.permits.clone().try_acquire_owned();
        assert!(first.is_ok() && second.is_ok());
        assert_eq!(admission.in_flight(), 2);
        assert!(admission.permits.clone().try_acquire_owned().is_err());
        drop(first);
        assert_eq!(admission.in_flight(), 1);
        assert_eq!(Admission::new(0, Arc::default()).limit(), 1, "at least one");
    }
}
