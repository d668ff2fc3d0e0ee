//! A TCP proxy in front of a MySQL server that reads the client's packets (3-byte length,
//! sequence, payload) and can, once armed, hold back the first `COMMIT` a client sends (or the
//! server's answer to it) until released, or drop the connection at it: a COMMIT that gets no
//! answer, or fails, as from a server or network that stopped answering at the worst moment.
//! It can also delay every statement that contains some text (a read made slow, to widen a
//! window between two reads), or only the next few such, or every statement (a slow server or
//! network).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the proxy does to the next `COMMIT` once armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Holds the COMMIT itself back: the server never gets it until released.
    Commit,
    /// Lets the COMMIT through and holds back the server's answer.
    Answer,
    /// Closes the connection instead of sending the COMMIT: it fails, nothing committed.
    Drop,
}

/// Statements containing a text, how late they are sent, and for how many more statements
/// (`None`: every one).
type Delays = Arc<Mutex<Vec<(Vec<u8>, Duration, Option<usize>)>>>;

/// A proxy on its own loopback port in front of the server at `upstream`.
pub struct SqlProxy {
    pub port: u16,
    armed: Arc<Mutex<Option<Hold>>>,
    release: Arc<tokio::sync::Notify>,
    held: Arc<AtomicBool>,
    /// Statements containing the text are sent this much later.
    delays: Delays,
}

impl SqlProxy {
    pub async fn start(upstream: u16) -> SqlProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed: Arc<Mutex<Option<Hold>>> = Arc::default();
        let release = Arc::new(tokio::sync::Notify::new());
        let held = Arc::new(AtomicBool::new(false));
        let delays: Delays = Arc::default();
        let (a, r, h, d) = (armed.clone(), release.clone(), held.clone(), delays.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    continue;
                };
                // A packet's head and payload go in two writes: without this, each statement
                // would wait out the peer's delayed ACK (some 40 ms).
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let (mut client_rx, mut client_tx) = client.into_split();
                let (mut server_rx, mut server_tx) = server.into_split();
                let (armed, release, held, delays) = (a.clone(), r.clone(), h.clone(), d.clone());
                let committing = Arc::new(AtomicBool::new(false));
                let seen = committing.clone();
                // Client to server, a packet at a time.
                tokio::spawn(async move {
                    loop {
                        let mut head = [0u8; 4];
                        if client_rx.read_exact(&mut head).await.is_err() {
                            return;
                        }
                        let len = usize::from(head[0])
                            | usize::from(head[1]) << 8
                            | usize::from(head[2]) << 16;
                        let mut payload = vec![0u8; len];
                        if client_rx.read_exact(&mut payload).await.is_err() {
                            return;
                        }
                        if payload == b"\x03COMMIT" {
                            let hold = armed.lock().unwrap().take();
                            match hold {
                                Some(Hold::Commit) => {
                                    held.store(true, Ordering::SeqCst);
                                    release.notified().await;
                                }
                                Some(Hold::Answer) => seen.store(true, Ordering::SeqCst),
                                Some(Hold::Drop) => {
                                    held.store(true, Ordering::SeqCst);
                                    return;
                                }
                                None => {}
                            }
                        }
                        // An empty text matches every statement.
                        let delay = delays
                            .lock()
                            .unwrap()
                            .iter_mut()
                            .find(|(text, _, left)| {
                                *left != Some(0)
                                    && (text.is_empty()
                                        || payload.windows(text.len()).any(|w| w == text))
                            })
                            .map(|(_, delay, left)| {
                                if let Some(left) = left {
                                    *left -= 1;
                                }
                                *delay
                            });
                        if let Some(delay) = delay {
                            tokio::time::sleep(delay).await;
                        }
                        if server_tx.write_all(&head).await.is_err()
                            || server_tx.write_all(&payload).await.is_err()
                        {
                            return;
                        }
                    }
                });
                let (release, held) = (r.clone(), h.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match server_rx.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if committing.swap(false, Ordering::SeqCst) {
                            held.store(true, Ordering::SeqCst);
                            release.notified().await;
                        }
                        if client_tx.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        SqlProxy {
            port,
            armed,
            release,
            held,
            delays,
        }
    }

    /// The next `COMMIT` any client sends gets `hold`.
    pub fn arm(&self, hold: Hold) {
        self.held.store(false, Ordering::SeqCst);
        *self.armed.lock().unwrap() = Some(hold);
    }

    /// Whether it is still armed (no COMMIT came since).
    pub fn armed(&self) -> bool {
        self.armed.lock().unwrap().is_some()
    }

    /// Takes back an arming no COMMIT used.
    pub fn disarm(&self) {
        *self.armed.lock().unwrap() = None;
    }

    /// Whether the armed hold happened.
    pub fn holding(&self) -> bool {
        self.held.load(Ordering::SeqCst)
    }

    /// Lets what it holds go.
    pub fn release(&self) {
        self.release.notify_waiters();
    }

    /// Every statement containing `text` is sent `delay` late.
    pub fn delay(&self, text: &str, delay: Duration) {
        self.delays
            .lock()
            .unwrap()
            .push((text.as_bytes().to_vec(), delay, None));
    }

    /// The next `times` statements containing `text` are sent `delay` late.
    pub fn delay_times(&self, text: &[u8], delay: Duration, times: usize) {
        self.delays
            .lock()
            .unwrap()
            .push((text.to_vec(), delay, Some(times)));
    }

    /// Every statement sent `delay` late (`None`: no delay at all, the texts' ones too).
    pub fn slow(&self, delay: Option<Duration>) {
        let mut delays = self.delays.lock().unwrap();
        delays.clear();
        delays.extend(delay.map(|d| (Vec::new(), d, None)));
    }

    /// A URL of database `database` through the proxy.
    pub fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }
}
