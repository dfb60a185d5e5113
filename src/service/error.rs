//! Why a request got no decision; mapped to gRPC codes and HTTP statuses in one place each
//! (`transport`).

use crate::limiter::EngineError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RlsError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("overloaded: too many requests in flight, retry later")]
    Overloaded,
    #[error("rate limiter unavailable")]
    Unavailable,
}

impl From<EngineError> for RlsError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Overloaded => RlsError::Overloaded,
            EngineError::Stopped | EngineError::Unavailable | EngineError::Store(_) => {
                RlsError::Unavailable
            }
        }
    }
}
