//! A TCP fault proxy for loopback tests: sits between a client and a server and delays or loses
//! the server's replies on demand.
//!
//! Until the proxy refuses, requests always reach the server; what the proxy changes is what comes
//! back, which is exactly the case a lock client cannot resolve alone: the server applied the
//! command, the client does not know. Modes can be switched while connections are open.
//!
//! ```no_run
//! # async fn demo(upstream: std::net::SocketAddr) -> std::io::Result<()> {
//! use std::time::Duration;
//! use leasehold_testkit::fault_proxy::{FaultProxy, ProxyMode};
//! let proxy = FaultProxy::start(upstream).await?;
//! proxy.set_mode(ProxyMode::DelayReplies(Duration::from_millis(500)));
//! // point the client at proxy.addr() ...
//! # Ok(()) }
//! ```

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with the server's replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProxyMode {
    /// Forward everything unchanged.
    Pass,
    /// Forward every reply after this delay (a client with a shorter timeout gives up).
    DelayReplies(Duration),
    /// Forward requests, then throw the reply away and close the client's connection: the server
    /// applied the command, the client never learns the outcome.
    DropReplies,
    /// Refuse new connections and close open ones at once (the server looks down): from the
    /// switch on, no request reaches the server.
    Refuse,
}

/// A running proxy; stops (and closes every connection) on drop.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    accept: JoinHandle<()>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl FaultProxy {
    /// Starts a proxy on a free port of 127.0.0.1 forwarding to `upstream` (which must be a
    /// loopback address), in [`ProxyMode::Pass`].
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        if !upstream.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the fault proxy only forwards to loopback addresses",
            ));
        }
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(ProxyMode::Pass);
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let mode = mode.clone();
            let conns = conns.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    if *mode.borrow() == ProxyMode::Refuse {
                        drop(client);
                        continue;
                    }
                    let task = tokio::spawn(proxy(client, upstream, mode.subscribe()));
                    let mut conns = conns.lock().unwrap_or_else(PoisonError::into_inner);
                    conns.retain(|t| !t.is_finished());
                    conns.push(task);
                }
            }
        });
        Ok(FaultProxy {
            addr,
            mode,
            accept,
            conns,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://<addr>`, for Redis clients.
    pub fn redis_url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Switches the mode; open connections follow at their next reply.
    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        for task in self
            .conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            task.abort();
        }
    }
}

async fn proxy(client: TcpStream, upstream: SocketAddr, mut mode: watch::Receiver<ProxyMode>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let refusing = mode.clone();
    let requests = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                // A request read after the switch to `Refuse`, before the reply side has seen
                // it, must not reach the server: a server that is down applies nothing.
                Ok(_) if *refusing.borrow() == ProxyMode::Refuse => return,
                Ok(n) => {
                    if server_tx.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let replies = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = tokio::select! {
                read = server_rx.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
                changed = mode.changed() => {
                    if changed.is_err() || *mode.borrow() == ProxyMode::Refuse {
                        return;
                    }
                    continue;
                }
            };
            let current = *mode.borrow();
            match current {
                ProxyMode::Pass => {}
                ProxyMode::DelayReplies(delay) => tokio::time::sleep(delay).await,
                ProxyMode::DropReplies | ProxyMode::Refuse => return,
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Either side ending ends the connection: both sockets are dropped, the client sees it closed.
    tokio::select! {
        _ = requests => {}
        _ = replies => {}
    }
}
