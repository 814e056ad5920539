//! One Redis exchange: its deadline, how its failure is classified, and the wall clock a
//! call's deadline is given in.

use crate::engine::store::StoreError;
use redis::{ErrorKind, RedisError, RetryMethod};
use std::time::Duration;

/// Runs one Redis exchange with a deadline, classifying its failure.
pub(super) async fn bounded<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, RedisError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(classify(&error)),
        Err(_) => Err(StoreError::Timeout(format!(
            "no answer from Redis within {} ms",
            timeout.as_millis()
        ))),
    }
}

/// A refusal by the server of the request itself (a script error, WRONGTYPE, CROSSSLOT,
/// NOPERM, a malformed URL) is a bug: `Protocol`. Everything else is transient and worth
/// retrying: I/O errors, timeouts, a dropped or corrupted connection, failover (MOVED, TRYAGAIN,
/// CLUSTERDOWN, READONLY), LOADING, BUSY, OOM: `Unavailable`.
pub(super) fn classify(error: &RedisError) -> StoreError {
    let refused = match error.kind() {
        ErrorKind::Server(_) | ErrorKind::Extension => {
            matches!(error.retry_method(), RetryMethod::NoRetry)
                && !matches!(
                    error.code(),
                    Some("BUSY" | "OOM" | "LOADING" | "MASTERDOWN" | "NOREPLICAS" | "MISCONF")
                )
        }
        ErrorKind::InvalidClientConfig | ErrorKind::UnexpectedReturnType => true,
        _ => false,
    };
    match refused {
        true => StoreError::Protocol(error.to_string()),
        false if error.is_timeout() => StoreError::Timeout(error.to_string()),
        false => StoreError::Unavailable(error.to_string()),
    }
}

/// This machine's wall clock, Unix ms: what Redis's TIME is compared with (not the
/// engine's clock, which tests run fake).
pub(super) fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A duration in whole milliseconds.
pub(super) fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_failures_are_unavailable_and_refusals_are_protocol_errors() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(matches!(classify(&io), StoreError::Unavailable(_)));
        let config = RedisError::from((ErrorKind::InvalidClientConfig, "bad URL"));
        assert!(matches!(classify(&config), StoreError::Protocol(_)));
    }
}
