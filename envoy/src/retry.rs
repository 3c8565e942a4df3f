//! Retries: which outcomes of an upstream attempt a route's `retry_policy` retries.

use std::time::Duration;

/// The conditions of Envoy's `retry_on`, as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetryOn(u16);

impl RetryOn {
    pub const FIVE_XX: RetryOn = RetryOn(1);
    pub const GATEWAY_ERROR: RetryOn = RetryOn(1 << 1);
    pub const CONNECT_FAILURE: RetryOn = RetryOn(1 << 2);
    pub const RESET: RetryOn = RetryOn(1 << 3);
    pub const RETRIABLE_STATUS_CODES: RetryOn = RetryOn(1 << 4);
    pub const REFUSED_STREAM: RetryOn = RetryOn(1 << 5);

    /// Parse a comma-separated `retry_on`. gRPC conditions (`cancelled`, `unavailable`, …)
    /// and names we do not know retry nothing here, as Envoy ignores what it cannot apply.
    pub fn parse(s: &str) -> RetryOn {
        let mut bits = 0;
        for part in s.split(',').map(str::trim) {
            bits |= match part {
                "5xx" => Self::FIVE_XX.0,
                "gateway-error" => Self::GATEWAY_ERROR.0,
                "connect-failure" => Self::CONNECT_FAILURE.0,
                "reset" => Self::RESET.0,
                "retriable-status-codes" => Self::RETRIABLE_STATUS_CODES.0,
                "refused-stream" => Self::REFUSED_STREAM.0,
                _ => 0,
            };
        }
        RetryOn(bits)
    }

    pub fn has(self, other: RetryOn) -> bool {
        self.0 & other.0 != 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    pub on: RetryOn,
    pub num_retries: u32,
    pub per_try_timeout: Option<Duration>,
    pub retriable_status_codes: Vec<u16>,
}

/// How one upstream attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Response headers with this status.
    Status(u16),
    /// No connection could be made.
    ConnectFailure,
    /// The connection or stream broke before a response.
    Reset,
    /// The per-try timeout fired.
    PerTryTimeout,
}

impl Outcome {
    /// Whether outlier detection counts it as a 5xx (Envoy folds locally originated
    /// failures into the 5xx count unless they are split).
    pub fn is_5xx(self) -> bool {
        match self {
            Outcome::Status(s) => (500..600).contains(&s),
            _ => true,
        }
    }
}

/// Whether `policy` retries an attempt that ended with `outcome`.
pub fn retriable(policy: &RetryPolicy, outcome: Outcome) -> bool {
    let on = policy.on;
    match outcome {
        Outcome::Status(s) => {
            (on.has(RetryOn::FIVE_XX) && (500..600).contains(&s))
                || (on.has(RetryOn::GATEWAY_ERROR) && matches!(s, 502..=504))
                || (on.has(RetryOn::RETRIABLE_STATUS_CODES) && policy.retriable_status_codes.contains(&s))
        }
        Outcome::ConnectFailure => on.has(RetryOn::CONNECT_FAILURE) || on.has(RetryOn::FIVE_XX),
        Outcome::Reset => on.has(RetryOn::RESET) || on.has(RetryOn::FIVE_XX) || on.has(RetryOn::REFUSED_STREAM),
        Outcome::PerTryTimeout => on.has(RetryOn::FIVE_XX) || on.has(RetryOn::GATEWAY_ERROR),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(on: &str, codes: &[u16]) -> RetryPolicy {
        RetryPolicy {
            on: RetryOn::parse(on),
            num_retries: 2,
            per_try_timeout: None,
            retriable_status_codes: codes.to_vec(),
        }
    }

    #[test]
    fn five_xx_covers_failures_and_server_errors() {
        let p = policy("5xx", &[]);
        assert!(retriable(&p, Outcome::Status(500)));
        assert!(retriable(&p, Outcome::Status(503)));
        assert!(!retriable(&p, Outcome::Status(404)));
        assert!(retriable(&p, Outcome::ConnectFailure));
        assert!(retriable(&p, Outcome::Reset));
        assert!(retriable(&p, Outcome::PerTryTimeout));
    }

    #[test]
    fn gateway_error_only_502_to_504() {
        let p = policy("gateway-error", &[]);
        assert!(!retriable(&p, Outcome::Status(500)));
        assert!(retriable(&p, Outcome::Status(502)));
        assert!(retriable(&p, Outcome::Status(504)));
        assert!(!retriable(&p, Outcome::ConnectFailure));
    }

    #[test]
    fn istio_default() {
        let p = policy("connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes", &[503]);
        assert!(retriable(&p, Outcome::ConnectFailure));
        assert!(retriable(&p, Outcome::Status(503)));
        assert!(!retriable(&p, Outcome::Status(500)));
        assert!(retriable(&p, Outcome::Reset));
    }
}
