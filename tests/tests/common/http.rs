//! What the HTTP tests share (`http/`): a server on an ephemeral loopback
//! port, a client that never goes through a proxy, and a layer that loses
//! answers.

use axum::Router;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use std::time::Duration;

/// The header that asks [`lossy`] to lose this request's answer.
pub(crate) const LOSE: &str = "x-test-lose-answer";

/// Serves `app` on `127.0.0.1:0`; the base URL.
pub(crate) async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, lossy(app)).await;
    });
    format!("http://{addr}")
}

/// A client without proxies.
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a plain HTTP client builds")
}

/// A network that loses answers: a request carrying [`LOSE`] runs to
/// completion on a task of its own (it commits), then its answer is held
/// back for 5 s, long after the client gave up. Other requests run
/// inline, so a client that hangs up cancels its handler.
fn lossy(app: Router) -> Router {
    app.layer(axum::middleware::from_fn(lose))
}

async fn lose(req: Request, next: Next) -> Response {
    if !req.headers().contains_key(LOSE) {
        // Inline: a client that hangs up cancels the handler.
        return next.run(req).await;
    }
    let resp = tokio::spawn(next.run(req)).await.expect("handler task");
    tokio::time::sleep(Duration::from_secs(5)).await;
    resp
}
