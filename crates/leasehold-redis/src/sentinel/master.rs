//! One round of the search for the master: every sentinel asked, the master named under the
//! highest configuration epoch connected to and asked its role.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use redis::aio::MultiplexedConnection;
use redis::{ProtocolVersion, PushInfo, PushKind, RedisError, Role};

use super::access::{Named, SentinelAccess};
use super::unfound::{Refusal, Unfound};

/// A master the store talks to: a node the sentinels named that answered as a master.
#[derive(Clone)]
pub(crate) struct Master {
    pub(super) connection: MultiplexedConnection,
    /// Set when the connection dropped: nothing more is sent on it.
    pub(super) broken: Arc<AtomicBool>,
    /// A client for the node (RESP2, for the subscriber connection).
    pub(super) client: redis::Client,
    /// `host:port`, for messages.
    pub(super) address: String,
    /// Which master of this link's life it is (each one found gets the next number).
    pub(super) generation: u64,
}

/// One round of the search: asks every sentinel, takes the master named under the highest
/// configuration epoch, connects to it and checks it answers as a master. `on_disconnect` runs
/// when the connection to the master found drops (its disconnection push), after the master is
/// marked broken.
pub(super) async fn find(
    access: &SentinelAccess,
    on_disconnect: impl Fn() + Send + Sync + 'static,
) -> Result<Master, Unfound> {
    let asked = futures::future::join_all(
        access
            .spec
            .sentinels
            .iter()
            .map(|(host, port)| access.ask(host, *port)),
    )
    .await;
    let mut problems = Vec::new();
    let mut refused = None;
    let mut best: Option<Named> = None;
    for answer in asked {
        match answer {
            Ok(named) if best.as_ref().is_none_or(|b| named.epoch > b.epoch) => {
                best = Some(named);
            }
            Ok(_) => {}
            Err(unasked) => {
                problems.push(unasked.problem);
                refused = refused.or(unasked.refused);
            }
        }
    }
    let Some(named) = best else {
        return Err(Unfound {
            named: false,
            problem: format!("no sentinel answered ({})", problems.join("; ")),
            refused,
        });
    };
    let unanswered = |problem| Unfound {
        named: true,
        problem,
        refused: None,
    };
    let address = format!("{}:{}", named.host, named.port);
    let broken = Arc::new(AtomicBool::new(false));
    let checked = async {
        // RESP3, for the disconnection push: a dropped connection is known before a command
        // is sent on it (and fails in doubt), so the command waits for the new master instead.
        let flag = broken.clone();
        let config = access
            .connection_config()
            .set_push_sender(move |push: PushInfo| {
                if push.kind == PushKind::Disconnection {
                    flag.store(true, Ordering::Release);
                    on_disconnect();
                }
                Ok::<(), std::convert::Infallible>(())
            });
        let mut connection = access
            .node_client(&named.host, named.port, ProtocolVersion::RESP3)?
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let role: Role = redis::cmd("ROLE").query_async(&mut connection).await?;
        let client = access.node_client(&named.host, named.port, ProtocolVersion::RESP2)?;
        Ok::<_, RedisError>((client, connection, role))
    };
    let named_by = format!(
        "{address} (named by sentinel {}, configuration epoch {})",
        named.sentinel, named.epoch
    );
    let (client, connection, role) =
        tokio::time::timeout(access.connect_timeout + access.response_timeout, checked)
            .await
            .map_err(|_| unanswered(format!("{named_by} did not answer")))?
            .map_err(|e| Unfound {
                refused: Refusal::of(&address, &named_by, &e),
                ..unanswered(format!("{named_by} could not be used: {e}"))
            })?;
    match role {
        Role::Primary { .. } => Ok(Master {
            connection,
            broken,
            client,
            address,
            generation: 0,
        }),
        Role::Replica {
            primary_ip,
            primary_port,
            ..
        } => Err(unanswered(format!(
            "{named_by} answers role=slave (a replica of {primary_ip}:{primary_port}): the \
             sentinels have not named the new master yet"
        ))),
        Role::Sentinel { .. } => Err(unanswered(format!(
            "{named_by} is a sentinel, not a data node"
        ))),
        other => Err(unanswered(format!(
            "{named_by} answers an unknown role ({other:?})"
        ))),
    }
}
