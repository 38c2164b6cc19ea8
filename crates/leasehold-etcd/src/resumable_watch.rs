//! One etcd watch that survives its member: the loop both the waiters' watch
//! ([`crate::waiting`]) and the observers' watch ([`crate::changes`]) run.
//!
//! The stream opens on a member that answers. It is given up when it breaks, when etcd cancels
//! it, or when any request of this store finds its member failing, and opened again on a live
//! member from the revision after the last one it saw, so etcd replays what happened in the gap
//! and nothing is lost. Only when etcd cannot replay (the gap was compacted away, or no watch
//! ever came up) does the follower hear that events may have been missed, once the new watch is
//! confirmed.

use std::ops::ControlFlow;
use std::time::Duration;

use etcd_client::{KeyValue, WatchOptions, WatchResponse};

use crate::members::{Members, Retry};

/// The pause before a broken watch is opened again.
pub(crate) const REWATCH_DELAY: Duration = Duration::from_millis(200);

/// What a watch loop does with what it hears.
pub(crate) trait Follower {
    /// The watch was confirmed by etcd (first opened, or opened again); `missed`: events may
    /// have been lost since the last confirmed watch, so what the follower knows is stale.
    fn confirmed(&mut self, missed: bool) -> ControlFlow<()>;

    /// One response's events (`at`: the response's revision, see [`revision_of`]).
    fn events(&mut self, response: &WatchResponse, at: i64) -> ControlFlow<()>;

    /// Whether to open the watch again after it ended (checked before the pause).
    fn goes_on(&self) -> bool {
        true
    }
}

/// The revision an event happened at: its key's modification revision, or the response's `at`
/// (a deletion's key value may carry none).
pub(crate) fn revision_of(kv: &KeyValue, at: i64) -> i64 {
    if kv.mod_revision() > 0 {
        kv.mod_revision()
    } else {
        at
    }
}

/// Watches `key` with `options` (a prefix, a range, filters) until the follower stops, opening
/// the watch again after every break (see the module docs). `what` names the watch in logs.
pub(crate) async fn follow(
    members: &Members,
    key: &str,
    options: WatchOptions,
    what: &str,
    follower: &mut impl Follower,
) {
    // The revision to watch from after a break: one past the last this watch has seen.
    let mut resume: Option<i64> = None;
    // Events may have been missed: said at the next confirmation.
    let mut missed = false;
    loop {
        let options = match resume {
            Some(from) => options.clone().with_start_revision(from),
            None => options.clone(),
        };
        let opened = members
            .run_at(Retry::Safe, |client| {
                let (key, options) = (key.to_owned(), options.clone());
                let mut watch = client.watch_client();
                async move { watch.watch(key, Some(options)).await }
            })
            .await;
        match opened {
            Ok((mut stream, member)) => {
                let mut failures = members.failures();
                loop {
                    // A member found failing by any request of this store takes the watch down
                    // with it: the watch resumes on another member.
                    let next = tokio::select! {
                        next = stream.message() => next,
                        changed = failures.changed() => {
                            if changed.is_ok() && !members.is_suspect(member) {
                                continue;
                            }
                            tracing::debug!(key, member = members.name(member),
                                "the member under this {what} failed; watching on another");
                            break;
                        }
                    };
                    let response = match next {
                        Ok(Some(response)) => response,
                        Ok(None) => break,
                        Err(error) => {
                            // The stream broke under us: its member goes last for a while, so
                            // the watch is not opened on it again at once.
                            members.failed_by(member, &error);
                            tracing::debug!(key, member = members.name(member), %error,
                                "the {what} broke; watching again");
                            break;
                        }
                    };
                    if response.canceled() {
                        if response.compact_revision() > 0 {
                            // The replay's start was compacted: what happened since is gone.
                            resume = None;
                            missed = true;
                        }
                        break;
                    }
                    if response.created() {
                        if resume.is_none() {
                            // A fresh watch sees what happens after the revision it was made at.
                            resume = response.header().map(|h| h.revision() + 1);
                        }
                        if follower.confirmed(std::mem::take(&mut missed)).is_break() {
                            return;
                        }
                    }
                    let at = response.header().map_or(0, |h| h.revision());
                    for event in response.events() {
                        if let Some(kv) = event.kv() {
                            // From events, not the header: a catching-up response's header may
                            // be ahead of the events it carries.
                            let next = revision_of(kv, at) + 1;
                            resume = Some(resume.map_or(next, |r| r.max(next)));
                        }
                    }
                    if follower.events(&response, at).is_break() {
                        return;
                    }
                }
            }
            Err(failed) => {
                tracing::debug!(key, at = %failed.at, error = %failed.error,
                    "could not open the {what}; retrying");
            }
        }
        if !follower.goes_on() {
            return;
        }
        if resume.is_none() {
            missed = true;
        }
        tokio::time::sleep(REWATCH_DELAY).await;
    }
}
