//! `inspect`, `list` and `release --force`: what ops people need for a stuck lock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::{HolderInfo, Lease, LockInfo, LockMode, LockStore, OwnerToken};
use serde::Serialize;

use crate::cli::{Global, InspectArgs, ListArgs, ReleaseArgs};
use crate::exit::{self, CliError};
use crate::store::{Names, Target};

/// A lock as printed (`--json` prints exactly these fields).
#[derive(Debug, Serialize)]
pub(crate) struct LockView {
    key: String,
    /// `exclusive`, `shared` or `semaphore`.
    mode: &'static str,
    /// A semaphore's permit count.
    #[serde(skip_serializing_if = "Option::is_none")]
    permits: Option<u32>,
    /// Every holder of a shared lock or semaphore (empty for an exclusive hold).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    holders: Vec<HolderView>,
    /// A blocking writer waits and keeps new readers out.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    writer_waiting: bool,
    holder: Option<String>,
    host: Option<String>,
    pid: Option<u32>,
    /// The holder's own note (`run --label`, an election candidate's address).
    #[serde(skip_serializing_if = "Option::is_none")]
    label: Option<String>,
    acquired_at_ms: Option<u128>,
    age_ms: Option<u128>,
    ttl_left_ms: Option<u128>,
    fencing_token: Option<u64>,
}

/// One holder of a shared lock or semaphore, as printed.
#[derive(Debug, Serialize)]
pub(crate) struct HolderView {
    holder: String,
    host: Option<String>,
    pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    label: Option<String>,
    age_ms: Option<u128>,
    ttl_left_ms: Option<u128>,
}

impl HolderView {
    fn new(info: &HolderInfo) -> Self {
        HolderView {
            holder: info.token.to_string(),
            host: info.token.host().map(str::to_owned),
            pid: info.token.pid(),
            label: info.token.label().map(str::to_owned),
            age_ms: info
                .token
                .acquired_at()
                .and_then(|t| t.elapsed().ok())
                .map(|d| d.as_millis()),
            ttl_left_ms: info.ttl_remaining.map(|d| d.as_millis()),
        }
    }

    fn who(&self) -> String {
        match (&self.host, self.pid) {
            (Some(host), Some(pid)) => format!("{} (host {host}, pid {pid})", self.holder),
            _ => self.holder.clone(),
        }
    }
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
            mode: info.mode.as_str(),
            permits: info.mode.permits(),
            holders: info.holders.iter().map(HolderView::new).collect(),
            writer_waiting: info.writer_waiting,
            holder: info.token.as_ref().map(|t| t.to_string()),
            host: info
                .token
                .as_ref()
                .and_then(|t| t.host())
                .map(str::to_owned),
            pid: info.token.as_ref().and_then(|t| t.pid()),
            label: info
                .token
                .as_ref()
                .and_then(|t| t.label())
                .map(str::to_owned),
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
        if !self.holders.is_empty() {
            let who: Vec<String> = self.holders.iter().map(HolderView::who).collect();
            let what = match self.permits {
                Some(permits) => {
                    format!("has {} of {permits} permits taken, by", self.holders.len())
                }
                None => format!("is read by {} holder(s):", self.holders.len()),
            };
            let waiting = if self.writer_waiting {
                "; a writer is waiting"
            } else {
                ""
            };
            return format!("{} {what} {}{waiting}", self.key, who.join(", "));
        }
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

/// A wall-clock time read from the store, as RFC 3339 with milliseconds, or in milliseconds
/// since 1970 where RFC 3339 has no year for it (past 9999, or before 1970: a time another
/// writer stored in other units, or a corrupt record). humantime's formatter errs (or panics,
/// before 1970) there, and `format!` would turn that into a panic.
pub(crate) fn wall_time(t: SystemTime) -> String {
    /// 9999-12-31T23:59:59Z, the last second RFC 3339 can write.
    const LAST: Duration = Duration::from_secs(253_402_300_799);
    match t.duration_since(UNIX_EPOCH) {
        // humantime looks at whole seconds only: all of the last second is writable.
        Ok(since) if since.as_secs() <= LAST.as_secs() => {
            humantime::format_rfc3339_millis(t).to_string()
        }
        Ok(since) => format!("{} ms after 1970 (past the year 9999)", since.as_millis()),
        Err(before) => format!("{} ms before 1970", before.duration().as_millis()),
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".to_owned())
}

pub(crate) async fn inspect(global: &Global, args: InspectArgs) -> Result<u8, CliError> {
    let names = Names::parse(global)?.farm_of(&args.key)?;
    let key = names.key(&args.key)?;
    let target = names.connect().await?;
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
    } else if !view.holders.is_empty() {
        match info.mode {
            LockMode::Semaphore { permits } => println!(
                "{key} is a semaphore of {permits} permits, {} taken",
                view.holders.len()
            ),
            _ => println!(
                "{key} is read-held by {} reader(s){}",
                view.holders.len(),
                if view.writer_waiting {
                    "; a writer is waiting (new readers are kept out)"
                } else {
                    ""
                }
            ),
        }
        for holder in &view.holders {
            println!(
                "  {}  age {}  ttl left {}",
                holder.who(),
                opt(holder
                    .age_ms
                    .map(|ms| human(Duration::from_millis(ms as u64)))),
                opt(holder
                    .ttl_left_ms
                    .map(|ms| human(Duration::from_millis(ms as u64)))),
            );
        }
    } else {
        println!("{key} is held");
        println!("  holder         {}", opt(view.holder.as_ref()));
        println!("  host           {}", opt(view.host.as_ref()));
        println!("  pid            {}", opt(view.pid));
        if let Some(label) = &view.label {
            println!("  label          {label}");
        }
        println!(
            "  acquired       {}",
            info.acquired_at
                .map(|t| format!(
                    "{} ({} ago)",
                    wall_time(t),
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
    let target = Names::parse(global)?
        .farm_of(&args.prefix)?
        .connect()
        .await?;
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
    // One row per holder: a shared lock or semaphore has several.
    let mut rows: Vec<[String; 5]> = Vec::new();
    let ms = |ms: Option<u128>, none: &str| {
        ms.map(|ms| human(Duration::from_millis(ms as u64)))
            .unwrap_or_else(|| none.to_owned())
    };
    for v in &views {
        let mode = match v.permits {
            Some(permits) => format!("semaphore({permits})"),
            None => v.mode.to_owned(),
        };
        if v.holders.is_empty() {
            rows.push([
                v.key.clone(),
                mode.clone(),
                v.holder.clone().unwrap_or_else(|| "-".into()),
                ms(v.age_ms, "-"),
                ms(v.ttl_left_ms, "never"),
            ]);
        }
        for h in &v.holders {
            rows.push([
                v.key.clone(),
                mode.clone(),
                h.holder.clone(),
                ms(h.age_ms, "-"),
                ms(h.ttl_left_ms, "never"),
            ]);
        }
    }
    let width = |i: usize, min: usize| {
        rows.iter()
            .map(|r| r[i].len())
            .max()
            .unwrap_or(min)
            .max(min)
    };
    let (kw, mw, hw) = (width(0, 3), width(1, 4), width(2, 6));
    println!(
        "{:<kw$}  {:<mw$}  {:<hw$}  {:>8}  {:>8}",
        "KEY", "MODE", "HOLDER", "AGE", "TTL LEFT"
    );
    for [key, mode, holder, age, ttl] in &rows {
        println!("{key:<kw$}  {mode:<mw$}  {holder:<hw$}  {age:>8}  {ttl:>8}");
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
    let names = Names::parse(global)?.farm_of(&args.key)?;
    let key = names.key(&args.key)?;
    let target = names.connect().await?;
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
    if !info.holders.is_empty() {
        return release_holders(&target, &info, &view).await;
    }
    let Some(token) = info.token.clone() else {
        return Err(CliError::new(
            exit::FAILURE,
            format!("{key}: the record has no owner token (written by another lock client?); refusing to delete it blindly — let it expire or delete it with the store's own tools"),
        ));
    };
    // Owner-checked with the token we just read: if the lock changed hands in between, the new
    // holder's lock is not touched.
    let lease = held_lease(&info, token, info.ttl_remaining);
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

/// Breaks a shared lock or semaphore: every holder read by `inspect`, each release
/// owner-checked with its own token (a holder that came in since is not touched). Every holder is
/// tried even after one release fails; the count says how far it got. Exit 0 when at least one
/// holder was removed, 75 when every one had gone by itself, the store's failure otherwise.
async fn release_holders(
    target: &Target,
    info: &LockInfo,
    view: &LockView,
) -> Result<u8, CliError> {
    let mut released = 0;
    let mut failed = None;
    for holder in &info.holders {
        let lease =
            held_lease(info, holder.token.clone(), holder.ttl_remaining).with_mode(info.mode);
        match target.store.release(&lease).await {
            Ok(true) => released += 1,
            Ok(false) => {}
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    let total = info.holders.len();
    let key = &info.key;
    if let Some(e) = failed {
        let mut error = target.error(e);
        error.message = format!(
            "{key}: released {released} of {total} holder(s), then: {}",
            error.message
        );
        return Err(error);
    }
    if released == 0 {
        return Err(CliError::new(
            exit::DEFAULT_CONFLICT,
            format!(
                "{key}: none of its {total} holder(s) still held it; nothing was removed (run \
                 inspect again)"
            ),
        ));
    }
    println!(
        "released {released} of {total} holder(s): {}",
        view.sentence()
    );
    Ok(exit::OK)
}

/// The lease a holder has, rebuilt from what `inspect` read, for an owner-checked release.
fn held_lease(info: &LockInfo, token: OwnerToken, ttl_left: Option<Duration>) -> Lease {
    Lease::new(
        info.key.clone(),
        token,
        ttl_left
            .unwrap_or(Duration::from_secs(1))
            .max(Duration::from_millis(1)),
        tokio::time::Instant::now(),
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use leasehold::core::Acquire;
    use leasehold::LockKey;

    use super::*;

    #[test]
    fn a_stored_time_rfc_3339_cannot_write_is_shown_in_milliseconds() {
        let at = |ms: u64| wall_time(UNIX_EPOCH + Duration::from_millis(ms));
        assert_eq!(at(1_764_460_800_123), "2025-11-30T00:00:00.123Z");
        assert_eq!(at(253_402_300_799_000), "9999-12-31T23:59:59.000Z");
        assert_eq!(at(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
        assert_eq!(
            at(253_402_300_800_000),
            "253402300800000 ms after 1970 (past the year 9999)"
        );
        // Microseconds written where milliseconds belong: past the year 9999.
        assert_eq!(
            at(1_764_460_800_123_456),
            "1764460800123456 ms after 1970 (past the year 9999)"
        );
        assert_eq!(
            wall_time(UNIX_EPOCH - Duration::from_millis(5)),
            "5 ms before 1970"
        );
    }
    use crate::cli::Cli;

    async fn memory_target() -> Target {
        let cli = Cli::try_parse_from(["leasehold", "--store", "memory://", "list"]).unwrap();
        Target::connect(&cli.global).await.unwrap()
    }

    /// Two readers of `key`, and what `inspect` read of them.
    async fn two_readers(target: &Target, key: &LockKey) -> (Vec<Lease>, LockInfo) {
        let mut leases = Vec::new();
        for _ in 0..2 {
            let req = Acquire::new(key.clone(), OwnerToken::generate(), Duration::from_secs(60))
                .with_mode(LockMode::Shared);
            leases.push(target.store.try_acquire(&req).await.unwrap());
        }
        let info = target.store.inspect(key).await.unwrap().unwrap();
        assert_eq!(info.holders.len(), 2);
        (leases, info)
    }

    #[tokio::test]
    async fn breaking_a_shared_lock_whose_holders_all_left_meanwhile_is_not_a_success() {
        let target = memory_target().await;
        let key = LockKey::xdc("ops", "cfg").unwrap();
        let (leases, info) = two_readers(&target, &key).await;
        for lease in &leases {
            assert!(target.store.release(lease).await.unwrap());
        }
        let err = release_holders(&target, &info, &LockView::new(&info))
            .await
            .unwrap_err();
        assert_eq!(err.status, exit::DEFAULT_CONFLICT, "{}", err.message);
        assert!(
            err.message.contains("nothing was removed"),
            "{}",
            err.message
        );
    }

    #[tokio::test]
    async fn breaking_a_shared_lock_counts_the_holders_it_removed() {
        let target = memory_target().await;
        let key = LockKey::xdc("ops", "cfg").unwrap();
        let (leases, info) = two_readers(&target, &key).await;
        assert!(target.store.release(&leases[0]).await.unwrap());
        let status = release_holders(&target, &info, &LockView::new(&info))
            .await
            .map_err(|e| e.message)
            .unwrap();
        assert_eq!(status, exit::OK);
        assert_eq!(target.store.inspect(&key).await.unwrap(), None);
    }
}
