//! A black-hole proxy: forwards TCP between clients and one node until it is told to black-hole
//! the node, then forwards nothing either way and answers nothing — the node looks alive to the
//! kernel (connections are accepted) but is cut off, as behind a network partition, not refused.
//!
//! Bytes sent during the black hole wait in the sockets' buffers and are delivered when the
//! proxy heals, as TCP delivers them after a partition heals; by then the client has usually
//! given up on them and reconnected. (testkit's `FaultProxy` delays or drops replies but always
//! forwards requests; a partition forwards neither.)

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running proxy in front of one node; stops (closing its connections) on drop.
#[derive(Debug)]
pub struct BlackholeProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    /// `true` while black-holed.
    cut: watch::Sender<bool>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl BlackholeProxy {
    /// Starts a proxy on a free port of 127.0.0.1 forwarding to `upstream`, on the current tokio
    /// runtime.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (cut, _) = watch::channel(false);
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let cut = cut.clone();
            let tasks = tasks.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let task = tokio::spawn(connection(client, upstream, cut.subscribe()));
                    let mut tasks = tasks.lock().unwrap_or_else(PoisonError::into_inner);
                    tasks.retain(|t| !t.is_finished());
                    tasks.push(task);
                }
            }
        });
        tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(accept);
        Ok(BlackholeProxy {
            addr,
            upstream,
            cut,
            tasks,
        })
    }

    /// The address clients use instead of the node's.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The node behind it.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Cuts the node off (`true`) or heals (`false`).
    pub fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for BlackholeProxy {
    fn drop(&mut self) {
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            task.abort();
        }
    }
}

async fn connection(client: TcpStream, upstream: SocketAddr, mut cut: watch::Receiver<bool>) {
    // A connection opened during the black hole reaches the node only once it heals.
    if cut.wait_for(|c| !*c).await.is_err() {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_rx, client_tx) = client.into_split();
    let (server_rx, server_tx) = server.into_split();
    tokio::select! {
        _ = pump(client_rx, server_tx, cut.clone()) => {}
        _ = pump(server_rx, client_tx, cut) => {}
    }
}

/// Copies one direction, reading nothing while the node is cut off.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut cut: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if cut.wait_for(|c| !*c).await.is_err() {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            // Cut while waiting to read: stop reading at once.
            _ = cut.wait_for(|c| *c) => continue,
        };
        // Read just before a cut: hold these bytes too until the node is back.
        if cut.wait_for(|c| !*c).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_cut_node_answers_nothing_until_healed() {
        let echo = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let upstream = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let proxy = BlackholeProxy::start(upstream).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut buf = [0u8; 4];
        c.write_all(b"ping").await.unwrap();
        c.read_exact(&mut buf).await.unwrap();
        proxy.set_cut(true);
        c.write_all(b"pong").await.unwrap();
        let silent = tokio::time::timeout(Duration::from_millis(200), c.read_exact(&mut buf)).await;
        assert!(silent.is_err(), "nothing comes back while cut");
        proxy.set_cut(false);
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
    }
}
