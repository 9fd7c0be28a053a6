//! Seed 002's reconnect loop: a caller-owned attempt counter keeps a connection to a server
//! that goes down and comes back.
//!
//! The example runs both sides on 127.0.0.1. The server greets one client, then crashes (its
//! listener and connection go away), stays down for a while, comes back on the same port and
//! tells the client to retry from zero (like a ZooKeeper watch would), greets it again and
//! finally tells it to stop. The client waits in a `select!` over the done signal, the reset
//! signal and the backoff sleep, and prints each attempt, its delay and its result.
//!
//! ```text
//! cargo run --example reconnect
//! ```

use std::error::Error;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep, timeout};
use tower_retry_hedge::backoff::{Backoff, Exponential};

/// How long the server stays down.
const OUTAGE: Duration = Duration::from_millis(600);

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    // Small delays so that the example finishes in about a second: 20 ms, x2, at most 320 ms,
    // ±20 % (gRPC's jitter). A real reconnect loop would rather use `Table::seed_default()`
    // (up to 5 s) or `Exponential::google()` (up to 32 s).
    let schedule = Exponential::grpc(Duration::from_millis(20), Duration::from_millis(320), 2.0)?;

    let listener = listen("127.0.0.1:0".parse()?)?;
    let addr = listener.local_addr()?;
    let reset = Arc::new(Notify::new());
    let done = Arc::new(Notify::new());
    println!("[server] listening on {addr}");
    let server = tokio::spawn(server(listener, Arc::clone(&reset), Arc::clone(&done)));

    // A safety net: an example must never hang.
    timeout(
        Duration::from_secs(10),
        keep_connected(addr, &schedule, &reset, &done),
    )
    .await?;
    server.await??;
    Ok(())
}

/// The client: seed 002's loop. The attempt counter is a plain integer owned right here.
async fn keep_connected(addr: SocketAddr, schedule: &impl Backoff, reset: &Notify, done: &Notify) {
    let start = Instant::now();
    let mut attempt: u32 = 0;
    loop {
        let delay = schedule.delay(attempt);
        tokio::select! {
            biased;
            _ = done.notified() => {
                println!("[client] +{:>4} ms  done", start.elapsed().as_millis());
                return;
            }
            _ = reset.notified() => {
                let at = start.elapsed().as_millis();
                println!("[client] +{at:>4} ms  reset: retrying from zero");
                attempt = 0;
                continue;
            }
            _ = sleep(delay) => {}
        }

        let conn = match TcpStream::connect(addr).await {
            Ok(conn) => conn,
            Err(err) => {
                println!(
                    "[client] +{:>4} ms  attempt {attempt} after {delay:.1?}: {err}",
                    start.elapsed().as_millis()
                );
                // A refused connection is worth another try; a fatal error would return here.
                attempt = attempt.saturating_add(1);
                continue;
            }
        };
        println!(
            "[client] +{:>4} ms  attempt {attempt} after {delay:.1?}: connected",
            start.elapsed().as_millis()
        );
        attempt = 0;

        // Use the connection until it fails; then the loop reconnects, starting from zero.
        let outcome = read_until_closed(conn).await;
        println!(
            "[client] +{:>4} ms  connection lost: {outcome}",
            start.elapsed().as_millis()
        );
    }
}

/// Reads and prints what the server sends until it closes the connection.
async fn read_until_closed(mut conn: TcpStream) -> String {
    let mut buf = [0u8; 64];
    loop {
        match conn.read(&mut buf).await {
            Ok(0) => return "closed by the server".to_owned(),
            Ok(n) => println!(
                "[client]           received {:?}",
                String::from_utf8_lossy(buf.get(..n).unwrap_or_default())
            ),
            Err(err) => return err.to_string(),
        }
    }
}

/// The server: up, down for `OUTAGE`, up again on the same port, then done.
async fn server(listener: TcpListener, reset: Arc<Notify>, done: Arc<Notify>) -> io::Result<()> {
    let addr = listener.local_addr()?;

    let (mut conn, _) = listener.accept().await?;
    conn.write_all(b"hello").await?;
    sleep(Duration::from_millis(100)).await;
    drop(conn);
    drop(listener);
    println!("[server] down for {OUTAGE:?}");
    sleep(OUTAGE).await;

    let listener = listen(addr)?;
    println!("[server] back up on {addr}: telling the client to retry from zero");
    reset.notify_one();
    let (mut conn, _) = listener.accept().await?;
    conn.write_all(b"hello again").await?;
    sleep(Duration::from_millis(100)).await;
    println!("[server] shutting down for good");
    done.notify_one();
    Ok(())
}

/// Binds a listener with `SO_REUSEADDR`, so that the port can be bound again while the
/// crashed server's connection lingers in `TIME_WAIT`.
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(16)
}
