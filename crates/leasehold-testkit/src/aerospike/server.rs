//! The accept loop and per-connection request loop.
//!
//! Each connection reads one frame at a time and answers it before reading the next, as the
//! client pipelines nothing on a connection. Every frame waits while the node is frozen; then info
//! frames are answered at once, and data messages wait while the fixture is paused, then go
//! through fault injection and the store. A frame
//! that cannot be parsed closes its connection with a `tracing::warn!`; it never takes down the
//! server.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::batch;
use super::command::{self, Kind, NsConfig};
use super::faults::{Fault, Faults, RequestKey};
use super::info::NodeInfo;
use super::result_code as rc;
use super::scan;
use super::store::Store;
use super::wire::{self, Message, Reply, WireError};

/// State shared by the server task and the fixture handle.
pub(crate) struct Shared {
    pub(crate) store: Mutex<Store>,
    pub(crate) ns: NsConfig,
    pub(crate) info: NodeInfo,
    pub(crate) faults: Faults,
    /// Set when the fixture speaks TLS: every connection is a TLS one.
    pub(crate) tls: Option<TlsAcceptor>,
    /// Set when the fixture has a user: data messages need a login first.
    pub(crate) security: Option<super::admin::Security>,
    /// Data messages received (single-record commands and scans), faulted ones included.
    pub(crate) requests: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("ns", &self.ns)
            .field("info", &self.info)
            .field("faults", &self.faults)
            .field("tls", &self.tls.is_some())
            .field("security", &self.security)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn store(&self) -> MutexGuard<'_, Store> {
        // The store is never left half-updated by a panic (none can happen while it is held):
        // recover from poisoning instead of propagating it.
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs the server until `shutdown` turns true; then every connection is closed.
pub(crate) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    let sweeper = {
        let shared = shared.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                let now = tokio::time::Instant::now();
                shared.store().purge_expired(now);
            }
        }
    };
    connections.spawn(sweeper);
    loop {
        tokio::select! {
            () = stopped(&mut shutdown) => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    tracing::debug!("aerospike fixture: connection from {peer}");
                    let shared = shared.clone();
                    connections.spawn(async move {
                        // Replies are written whole; no need to wait for more.
                        let _ = stream.set_nodelay(true);
                        let served = match shared.tls.clone() {
                            None => connection(stream, &shared).await,
                            Some(acceptor) => match acceptor.accept(stream).await {
                                Ok(tls) => connection(tls, &shared).await,
                                Err(e) => {
                                    tracing::info!("aerospike fixture: TLS handshake with {peer} failed: {e}");
                                    Ok(())
                                }
                            },
                        };
                        if let Err(e) = served {
                            tracing::warn!("aerospike fixture: closing connection from {peer}: {e}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("aerospike fixture: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            // Reap finished connection tasks so the set does not grow without bound.
            Some(_) = connections.join_next(), if connections.len() > 1 => {}
        }
    }
    connections.shutdown().await;
}

/// Resolves once the stop flag is set (or its sender is gone).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Why a connection was closed.
#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("malformed frame: {0}")]
    Wire(#[from] WireError),
}

async fn connection<S>(mut stream: S, shared: &Shared) -> Result<(), ConnError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut authenticated = false;
    loop {
        let mut header = [0u8; 8];
        match stream.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let proto = match wire::parse_proto(header) {
            Ok(p) => p,
            Err(WireError::FrameType(wire::TYPE_COMPRESSED)) => {
                return Err(WireError::FrameType(wire::TYPE_COMPRESSED).into());
            }
            Err(e) => return Err(e.into()),
        };
        let mut body = vec![0u8; proto.len];
        stream.read_exact(&mut body).await?;
        // A frozen node answers nothing until thawed.
        shared.faults.wait_thawed().await;
        if proto.frame_type == wire::TYPE_INFO {
            let answer = shared.info.answer(&body, shared.faults.partition_state());
            stream
                .write_all(&wire::frame(wire::TYPE_INFO, &answer))
                .await?;
            // A TLS stream sends what it buffered only on flush (a no-op on plain TCP).
            stream.flush().await?;
            continue;
        }
        if proto.frame_type == wire::TYPE_ADMIN {
            let answer = super::admin::answer(shared.security.as_ref(), &body, &mut authenticated);
            stream.write_all(&answer).await?;
            stream.flush().await?;
            continue;
        }
        let msg = Message::parse(&body)?;
        if shared.security.is_some() && !authenticated {
            // Guess: a secured node refuses data messages before a login on the connection.
            let mut reply = Reply::code(rc::NOT_AUTHENTICATED);
            if command::classify(&msg) == Kind::Scan {
                reply.info3 = wire::INFO3_LAST;
            }
            stream.write_all(&reply.to_frame()).await?;
            stream.flush().await?;
            continue;
        }
        if !data_message(&mut stream, shared, &msg).await? {
            return Ok(());
        }
    }
}

/// Serves one data message; returns whether the connection stays open.
async fn data_message<S>(stream: &mut S, shared: &Shared, msg: &Message) -> Result<bool, ConnError>
where
    S: AsyncWrite + Unpin,
{
    shared
        .requests
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    shared.faults.wait_resumed().await;
    let kind = command::classify(msg);
    if kind == Kind::Batch {
        return batch_message(stream, shared, msg).await;
    }
    let digest = command::digest_of(msg);
    let fault = shared.faults.take(RequestKey {
        set: msg.field(wire::FIELD_SET).unwrap_or_default(),
        digest: digest.as_ref().map(|d| &d[..]),
    });
    match fault {
        Some(Fault::DropConnection) => return Ok(false),
        Some(Fault::Hold) => shared.faults.hold().await,
        Some(Fault::ResultCode(code)) => {
            let mut reply = Reply::code(code);
            if kind == Kind::Scan {
                reply.info3 = wire::INFO3_LAST;
            }
            stream.write_all(&reply.to_frame()).await?;
            stream.flush().await?;
            return Ok(true);
        }
        _ => {}
    }
    let frames = match kind {
        Kind::Single => {
            let reply = command::execute(&mut shared.store(), &shared.ns, msg);
            vec![reply.to_frame()]
        }
        Kind::Scan => scan::scan(&shared.store(), &shared.ns, msg),
        Kind::Batch | Kind::Unsupported => {
            tracing::warn!("aerospike fixture: unsupported data message (UDF or index query)");
            vec![Reply {
                info3: wire::INFO3_LAST,
                result_code: rc::PARAMETER_ERROR,
                ..Reply::default()
            }
            .to_frame()]
        }
    };
    match fault {
        Some(Fault::DropReply) => return Ok(false),
        Some(Fault::DelayReply(delay)) => tokio::time::sleep(delay).await,
        _ => {}
    }
    for frame in frames {
        stream.write_all(&frame).await?;
    }
    stream.flush().await?;
    Ok(true)
}

/// Serves one batch message (see [`super::batch`]); returns whether the connection stays open.
/// A fault that matches any row applies to the whole message (it is one request on one
/// connection), except a result code, which answers the rows it matches, as a server answers
/// per record.
async fn batch_message<S>(stream: &mut S, shared: &Shared, msg: &Message) -> Result<bool, ConnError>
where
    S: AsyncWrite + Unpin,
{
    let rows = match batch::parse(msg) {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!("aerospike fixture: refusing a batch it cannot parse: {e}");
            stream
                .write_all(&batch::refused(rc::PARAMETER_ERROR))
                .await?;
            stream.flush().await?;
            return Ok(true);
        }
    };
    let keys: Vec<RequestKey<'_>> = rows
        .iter()
        .map(|row| RequestKey {
            set: row.msg.field(wire::FIELD_SET).unwrap_or_default(),
            digest: Some(&row.digest[..]),
        })
        .collect();
    let fault = shared.faults.take_batch(&keys);
    let mut forced = vec![None; rows.len()];
    match &fault {
        Some((Fault::DropConnection, _)) => return Ok(false),
        Some((Fault::Hold, _)) => shared.faults.hold().await,
        Some((Fault::ResultCode(code), matched)) => {
            for (slot, hit) in forced.iter_mut().zip(matched) {
                if *hit {
                    *slot = Some(*code);
                }
            }
        }
        _ => {}
    }
    let frame = batch::execute(&mut shared.store(), &shared.ns, &rows, &forced);
    match fault {
        Some((Fault::DropReply, _)) => return Ok(false),
        Some((Fault::DelayReply(delay), _)) => tokio::time::sleep(delay).await,
        _ => {}
    }
    stream.write_all(&frame).await?;
    stream.flush().await?;
    Ok(true)
}
