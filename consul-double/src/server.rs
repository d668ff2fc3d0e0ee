//! The accept loop. It serves the axum router over hyper's HTTP/1 connection driver itself
//! (instead of `axum::serve`) so that each request carries a [`ConnHandle`]: a blocking
//! query hit by the drop fault uses it to close its TCP connection abruptly, with no
//! response bytes, which is what a client sees when a Consul agent dies mid-query.

use std::sync::Arc;

use axum::extract::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tower::ServiceExt;

/// Lets a handler close the connection its request arrived on.
#[derive(Clone, Debug)]
pub(crate) struct ConnHandle {
    kill: Arc<Notify>,
}

impl ConnHandle {
    /// Closes the connection now: the connection task drops it without answering.
    pub(crate) fn kill(&self) {
        self.kill.notify_one();
    }
}

/// Accepts connections until `shutdown` turns true, then aborts every open connection.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    conns.spawn(serve_conn(stream, router.clone()));
                }
                Err(_) => {
                    // Out of file descriptors or similar: back off briefly and retry.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            },
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

async fn serve_conn(stream: tokio::net::TcpStream, router: Router) {
    let kill = Arc::new(Notify::new());
    let handle = ConnHandle { kill: kill.clone() };
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(handle.clone());
        router.clone().oneshot(req)
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = conn => {}
        _ = kill.notified() => {}
    }
}
