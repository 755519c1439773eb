//! The `/metrics` endpoint of both processes: plain HTTP on its own TCP
//! address, apart from the controller's gRPC plan port and the enforcer's
//! CNI socket, so that a scraper needs no gRPC and reaches it over the pod
//! network.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use tokio::net::TcpListener;

/// What Prometheus expects for the text format.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One scrape's text, being rendered.
pub type Rendering = Pin<Box<dyn Future<Output = String> + Send>>;

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
    F: Fn() -> Rendering + Clone + Send + Sync + 'static,
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

/// A render that blocks (the controller's reads the hub under its lock for
/// a moment), run off the async runtime all the same.
pub fn blocking<F>(render: F) -> impl Fn() -> Rendering + Clone + Send + Sync + 'static
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    move || {
        let render = render.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(render)
                .await
                .unwrap_or_else(|e| format!("# rendering failed: {e}\n"))
        })
    }
}
