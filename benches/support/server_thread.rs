//! A benchmark's server on a thread of its own, with a current-thread runtime, as a server in
//! another process would run: with one multi-thread runtime for client and server, rates
//! flipped between two modes from run to run (see `benches/loopback.rs`).

use std::future::Future;
use std::net::SocketAddr;
use std::thread::JoinHandle;

use tokio::net::TcpListener;

/// Runs `serve` on a thread named `name` with a current-thread runtime, given a listener on
/// 127.0.0.1 (port 0); returns the listener's address and the thread, which ends when `serve`
/// does.
pub fn serve_on_own_thread<F, Fut>(
    name: &str,
    serve: F,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)>
where
    F: FnOnce(TcpListener) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = addr_tx.send(Err(error));
                    return;
                }
            };
            runtime.block_on(async move {
                let listener = match TcpListener::bind("127.0.0.1:0").await {
                    Ok(listener) => listener,
                    Err(error) => {
                        let _ = addr_tx.send(Err(error));
                        return;
                    }
                };
                let _ = addr_tx.send(listener.local_addr());
                serve(listener).await;
            });
        })?;
    let addr = addr_rx
        .recv()
        .map_err(|_| std::io::Error::other("the server thread ended before listening"))??;
    Ok((addr, thread))
}
