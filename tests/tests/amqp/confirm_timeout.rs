//! A publisher confirm that never comes: the connection to RabbitMQ goes
//! through a proxy of the test's own that, once told to, swallows
//! everything the broker sends (the connection is lost without being
//! closed, as behind a dead NAT or a killed node whose peer never saw a
//! reset). The publish must end, with an outage after the publisher's
//! confirm timeout, rather than wait for the heartbeats a minute or more.

use crate::common::amqp::*;
use crate::common::hooks;
use idem_runtime::amqp::Connector;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A loopback proxy to `upstream`; while the flag is set, what the broker
/// sends is read and dropped.
async fn swallowing_proxy(upstream: String) -> (String, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    let swallow = Arc::new(AtomicBool::new(false));
    let s = swallow.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(&upstream).await else {
                continue;
            };
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut cr, &mut sw).await;
            });
            let s = s.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n) = sr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if !s.load(Ordering::SeqCst) && cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (addr, swallow)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_that_never_comes_is_an_outage_after_the_timeout() {
    let _hooks = hooks::shared().await;
    let Some(conn) = broker().await else {
        return;
    };
    let (t, exchange, topic) = topology(&conn, "confirm_timeout").await;
    let url = amqp_url();
    let upstream = url
        .split('@')
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("host:port in the AMQP URL")
        .to_owned();
    let (proxy, swallow) = swallowing_proxy(upstream.clone()).await;
    let publisher = Publisher::new(Connector::new(url.replace(&upstream, &proxy)), &exchange)
        .confirm_timeout(Duration::from_millis(500));
    publisher
        .publish(&topic, "c-1", br#"{"n":1}"#)
        .await
        .expect("confirmed through the proxy");

    swallow.store(true, Ordering::SeqCst);
    // Without the timeout this waits for the connection's heartbeats
    // (60 s by default); 20 s tells the two apart.
    let lost = tokio::time::timeout(
        Duration::from_secs(20),
        publisher.publish(&topic, "c-2", br#"{"n":2}"#),
    )
    .await
    .expect("the publish ended")
    .expect_err("no confirm came");
    assert!(lost.is_outage() && lost.is_retryable(), "{lost:#}");
    assert!(
        format!("{lost:#}").contains("no publisher confirm"),
        "{lost:#}"
    );
    // The broker took both copies: the second one's confirm was lost.
    let channel = conn.create_channel().await.expect("channel");
    idem_testkit::wait_for("both copies in the queue", Duration::from_secs(10), || {
        let channel = channel.clone();
        let queue = t.queue.clone();
        async move {
            let declared = channel
                .queue_declare(
                    queue.as_str().into(),
                    idem_runtime::amqp::lapin::options::QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    Default::default(),
                )
                .await
                .expect("the queue");
            declared.message_count() == 2
        }
    })
    .await;
}
