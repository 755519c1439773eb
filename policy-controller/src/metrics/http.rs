//! The `/metrics` endpoint: plain HTTP on its own address, so that a
//! scraper needs no gRPC and the plan port stays gRPC only.

use std::net::SocketAddr;

use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use tokio::net::TcpListener;

/// What Prometheus expects for the text format.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Binds first, so that a taken or bad address fails the process at start
/// instead of leaving it running without metrics.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("--metrics-addr {addr}: {e}"))
}

/// Serves `render()` at `/metrics` until the process ends.
pub async fn serve<F>(listener: TcpListener, render: F)
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let render = render.clone();
            async move {
                // Rendering reads the hub under its lock for a moment;
                // off the async runtime all the same.
                let text = tokio::task::spawn_blocking(render)
                    .await
                    .unwrap_or_else(|e| format!("# rendering failed: {e}\n"));
                ([(CONTENT_TYPE, CONTENT_TYPE_TEXT)], text)
            }
        }),
    );
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "metrics server stopped");
    }
}
