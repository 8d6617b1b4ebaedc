//! Patroni's REST API, over a plain HTTP/1.0 request (the API closes the
//! connection after each answer): the role checks (`GET /primary`,
//! `/replica`, `/sync`) and the dynamic configuration (`PATCH /config`).

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one request may take: a frozen node's API accepts the
/// connection (the kernel does) and never answers.
const REQUEST_WITHIN: Duration = Duration::from_millis(800);

/// The status code and the body of `method path` on the API at `port`;
/// `None` when it does not answer in time (down, frozen).
pub(super) async fn request(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        let body = body.unwrap_or("");
        let head = format!(
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.ok()?;
        stream.write_all(body.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        // `HTTP/1.0 200 OK`
        let code = answer.split_whitespace().nth(1)?.parse::<u16>().ok()?;
        let body = answer
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Some((code, body))
    };
    tokio::time::timeout(REQUEST_WITHIN, exchange)
        .await
        .ok()
        .flatten()
}

/// Whether `GET path` answers 200 (`/primary`: this node holds the leader
/// lock and runs as the primary; `/replica`: a running replica; `/sync`:
/// the synchronous standby).
pub(super) async fn is(port: u16, path: &str) -> bool {
    matches!(request(port, "GET", path, None).await, Some((200, _)))
}
