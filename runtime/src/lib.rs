//! What the controller and the enforcer both run besides the wire API
//! (which stays in `palisade-proto`): one implementation of each piece, so
//! the two processes cannot drift apart.

/// The Prometheus text format both processes serve their metrics in.
pub mod exposition;
/// The `/metrics` HTTP server.
pub mod metrics_http;
/// OTLP/gRPC span export.
pub mod otlp_export;
/// The process's tracer, set up from its flags.
pub mod telemetry;
/// W3C trace context in gRPC metadata and in plan messages.
pub mod trace_context;
/// Addresses, client connections, TLS and serving.
pub mod transport;
