//! The Envoy rate-limit service (`envoy.service.ratelimit.v3`) over gRPC, in-process: answers,
//! algorithms, queued waiting, usage budgets, and the README's grpcurl walkthrough.

mod admin;
mod algorithms;
mod answers;
mod budgets;
mod grpcurl;
mod queue;
mod refused_by;
mod request_limits;
mod reservations;
mod shadow;
