//! The `/metrics` endpoint: plain HTTP on its own TCP address, apart from
//! the CNI socket, so that a scraper reaches it over the pod network.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

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
    F: Fn() -> Pin<Box<dyn Future<Output = String> + Send>> + Clone + Send + Sync + 'static,
{
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let text = render();
            async move { ([(CONTENT_TYPE, CONTENT_TYPE_TEXT)], text.await) }
        }),
    );
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "metrics server stopped");
    }
}
