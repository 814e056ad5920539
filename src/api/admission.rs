//! Admission control over HTTP: a `/quota/*` request is served once `crate::admission`
//! gives it a slot; the ones refused are answered 503 overloaded.

use super::problem::ApiError;
use super::AppState;
use crate::admission::Refused;
use crate::logs::Throttle;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web;

/// Serves a `/quota/*` request once it has a slot, holding the slot until the answer is
/// built; answers the ones refused 503 overloaded without reading their body.
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
    match admission.admit().await {
        Ok(_slot) => Ok(next.call(req).await?.map_into_left_body()),
        Err(why) => {
            static SITE: Throttle = Throttle::new();
            let limits = admission.limits();
            if let Some(count) = SITE.event() {
                tracing::warn!(
                    count,
                    in_flight = limits.in_flight,
                    queued = limits.queued,
                    "shedding load: quota requests answered 503 overloaded"
                );
            }
            let detail = match why {
                Refused::QueueFull => format!(
                    "the service has {} requests in flight and {} waiting, the most it takes; \
                     retry shortly",
                    limits.in_flight, limits.queued
                ),
                Refused::Waited => format!(
                    "the service has {} requests in flight, the most it serves at once, and no \
                     slot came free for this one; retry shortly",
                    limits.in_flight
                ),
            };
            Ok(req
                .error_response(ApiError::Overloaded(detail))
                .map_into_right_body())
        }
    }
}
