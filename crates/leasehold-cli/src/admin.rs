//! `inspect`, `list` and `release --force`: what ops people need for a stuck lock.

use std::time::{Duration, SystemTime};

use leasehold::{Lease, LockInfo, LockStore};
use serde::Serialize;

use crate::cli::{Global, InspectArgs, ListArgs, ReleaseArgs};
use crate::exit::{self, CliError};
use crate::store::Target;

/// A lock as printed (`--json` prints exactly these fields).
#[derive(Debug, Serialize)]
pub(crate) struct LockView {
    key: String,
    holder: Option<String>,
    host: Option<String>,
    pid: Option<u32>,
    acquired_at_ms: Option<u128>,
    age_ms: Option<u128>,
    ttl_left_ms: Option<u128>,
    fencing_token: Option<u64>,
}

impl LockView {
    pub(crate) fn new(info: &LockInfo) -> Self {
        let epoch_ms = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .ok()
        };
        LockView {
            key: info.key.to_string(),
            holder: info.token.as_ref().map(|t| t.to_string()),
            host: info
                .token
                .as_ref()
                .and_then(|t| t.host())
                .map(str::to_owned),
            pid: info.token.as_ref().and_then(|t| t.pid()),
            acquired_at_ms: info.acquired_at.and_then(epoch_ms),
            age_ms: info
                .acquired_at
                .and_then(|t| t.elapsed().ok())
                .map(|d| d.as_millis()),
            ttl_left_ms: info.ttl_remaining.map(|d| d.as_millis()),
            fencing_token: info.fencing_token,
        }
    }

    /// One sentence: who holds it and for how long.
    pub(crate) fn sentence(&self) -> String {
        let who = match (&self.holder, &self.host, self.pid) {
            (Some(token), Some(host), Some(pid)) => format!("{token} (host {host}, pid {pid})"),
            (Some(token), ..) => token.clone(),
            (None, ..) => "a holder that stores no owner token".to_owned(),
        };
        let ttl = match self.ttl_left_ms {
            Some(ms) => format!("for {} more", human(Duration::from_millis(ms as u64))),
            None => "with no expiry".to_owned(),
        };
        format!("{} is held by {who} {ttl}", self.key)
    }
}

/// `1.2s`, `3m4s`: durations for people.
pub(crate) fn human(d: Duration) -> String {
    if d < Duration::from_secs(10) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".to_owned())
}

pub(crate) async fn inspect(global: &Global, args: InspectArgs) -> Result<u8, CliError> {
    let target = Target::connect(global).await?;
    let key = target.key(&args.key)?;
    let info = target
        .store
        .inspect(&key)
        .await
        .map_err(|e| target.error(e))?;
    let Some(info) = info else {
        if args.json {
            println!(
                "{}",
                serde_json::json!({ "key": key.as_str(), "held": false })
            );
        } else {
            println!("{key} is free");
        }
        return Ok(exit::FREE);
    };
    let view = LockView::new(&info);
    if args.json {
        let mut value =
            serde_json::to_value(&view).map_err(|e| CliError::new(exit::FAILURE, e.to_string()))?;
        value["held"] = serde_json::Value::Bool(true);
        println!("{value}");
    } else {
        println!("{key} is held");
        println!("  holder         {}", opt(view.holder.as_ref()));
        println!("  host           {}", opt(view.host.as_ref()));
        println!("  pid            {}", opt(view.pid));
        println!(
            "  acquired       {}",
            info.acquired_at
                .map(|t| format!(
                    "{} ({} ago)",
                    humantime::format_rfc3339_millis(t),
                    human(t.elapsed().unwrap_or_default())
                ))
                .unwrap_or_else(|| "-".to_owned())
        );
        println!(
            "  ttl left       {}",
            info.ttl_remaining
                .map(human)
                .unwrap_or_else(|| "never expires".to_owned())
        );
        println!("  fencing token  {}", opt(view.fencing_token));
    }
    Ok(exit::OK)
}

pub(crate) async fn list(global: &Global, args: ListArgs) -> Result<u8, CliError> {
    let target = Target::connect(global).await?;
    let locks = target
        .store
        .list(&args.prefix)
        .await
        .map_err(|e| target.error(e))?;
    let views: Vec<LockView> = locks.iter().map(LockView::new).collect();
    if args.json {
        let json = serde_json::to_string_pretty(&views)
            .map_err(|e| CliError::new(exit::FAILURE, e.to_string()))?;
        println!("{json}");
        return Ok(exit::OK);
    }
    if views.is_empty() {
        println!(
            "no locks held{}",
            if args.prefix.is_empty() {
                String::new()
            } else {
                format!(" under {:?}", args.prefix)
            }
        );
        return Ok(exit::OK);
    }
    let key_width = views.iter().map(|v| v.key.len()).max().unwrap_or(3).max(3);
    let holder_width = views
        .iter()
        .map(|v| v.holder.as_deref().unwrap_or("-").len())
        .max()
        .unwrap_or(6)
        .max(6);
    println!(
        "{:<key_width$}  {:<holder_width$}  {:>8}  {:>8}",
        "KEY", "HOLDER", "AGE", "TTL LEFT"
    );
    for v in &views {
        println!(
            "{:<key_width$}  {:<holder_width$}  {:>8}  {:>8}",
            v.key,
            v.holder.as_deref().unwrap_or("-"),
            v.age_ms
                .map(|ms| human(Duration::from_millis(ms as u64)))
                .unwrap_or_else(|| "-".into()),
            v.ttl_left_ms
                .map(|ms| human(Duration::from_millis(ms as u64)))
                .unwrap_or_else(|| "never".into()),
        );
    }
    Ok(exit::OK)
}

pub(crate) async fn release(global: &Global, args: ReleaseArgs) -> Result<u8, CliError> {
    if !args.force {
        return Err(CliError::usage(format!(
            "release breaks a lock whoever holds it; add --force to do it (e.g. leasehold release {} --force)",
            args.key
        )));
    }
    let target = Target::connect(global).await?;
    let key = target.key(&args.key)?;
    let Some(info) = target
        .store
        .inspect(&key)
        .await
        .map_err(|e| target.error(e))?
    else {
        println!("{key} is free: nothing to release");
        return Ok(exit::FREE);
    };
    let view = LockView::new(&info);
    let Some(token) = info.token.clone() else {
        return Err(CliError::new(
            exit::FAILURE,
            format!("{key}: the record has no owner token (written by another lock client?); refusing to delete it blindly — let it expire or delete it with the store's own tools"),
        ));
    };
    // Owner-checked with the token we just read: if the lock changed hands in between, the new
    // holder's lock is not touched.
    let lease = Lease::new(
        key.clone(),
        token,
        info.ttl_remaining
            .unwrap_or(Duration::from_secs(1))
            .max(Duration::from_millis(1)),
        tokio::time::Instant::now(),
    );
    if target
        .store
        .release(&lease)
        .await
        .map_err(|e| target.error(e))?
    {
        println!("released: {}", view.sentence());
        Ok(exit::OK)
    } else {
        Err(CliError::new(
            exit::DEFAULT_CONFLICT,
            format!("{key} changed hands while releasing; nothing was removed (run inspect again)"),
        ))
    }
}
