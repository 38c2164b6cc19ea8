//! The scripts' arguments (lock modes, TTLs) as the scripts spell them, and their replies read
//! back into lock info.

use std::time::Duration;

use leasehold_core::{ttl_millis, Acquire, HolderInfo, LockInfo, LockKey, LockMode, OwnerToken};

use tokio::time::Instant;

/// The `mode` field of a shared record: `shared`, or `semaphore:N`.
pub(crate) fn mode_field(mode: LockMode) -> String {
    match mode {
        LockMode::Semaphore { permits } => format!("semaphore:{permits}"),
        other => other.as_str().to_owned(),
    }
}

/// The mode a record's `mode` field names (`None`: not one leasehold writes).
pub(crate) fn parse_mode(field: &str) -> Option<LockMode> {
    match field.split_once(':') {
        Some(("semaphore", permits)) => permits
            .parse()
            .ok()
            .and_then(|n| LockMode::semaphore(n).ok()),
        None if field == "shared" => Some(LockMode::Shared),
        None if field == "exclusive" => Some(LockMode::Exclusive),
        _ => None,
    }
}

/// How a conflict names the hold found: `semaphore(3)`, `a read-write lock`, `an exclusive lock`.
pub(crate) fn describe_mode(field: &str) -> String {
    match parse_mode(field) {
        Some(LockMode::Shared) => "a read-write lock (read-held)".to_owned(),
        Some(LockMode::Exclusive) => "an exclusive lock".to_owned(),
        Some(mode) => mode.to_string(),
        None => format!("a record of unknown mode {field:?}"),
    }
}

/// How long a refused blocking writer keeps new readers out: until its deadline, at most its TTL
/// (0 for a try).
pub(crate) fn writer_wait_millis(req: &Acquire, now: Instant) -> u64 {
    req.deadline().map_or(0, |deadline| {
        ttl_millis(deadline.saturating_duration_since(now).min(req.ttl))
    })
}

/// Reads `INSPECT`'s reply (see the script).
pub(crate) fn parse_inspect(
    key: &LockKey,
    reply: Vec<redis::Value>,
) -> redis::RedisResult<Option<LockInfo>> {
    use redis::FromRedisValue;
    let mut items = reply.into_iter();
    let Some(kind) = items.next() else {
        return Ok(None);
    };
    let kind = String::from_redis_value(kind)?;
    let rest: Vec<redis::Value> = items.collect();
    if kind == "x" {
        let token = rest
            .first()
            .cloned()
            .map(String::from_redis_value)
            .transpose()?;
        let Some(token) = token else { return Ok(None) };
        let pttl = rest
            .get(1)
            .cloned()
            .map(i64::from_redis_value)
            .transpose()?
            .unwrap_or(-2);
        if pttl == -2 {
            return Ok(None);
        }
        let fence = match rest.get(2).cloned() {
            Some(value) => Option::<u64>::from_redis_value(value)?,
            None => None,
        };
        return Ok(Some(info(key, token, pttl, fence)));
    }
    let mut rest = rest.into_iter();
    let field = rest
        .next()
        .map(String::from_redis_value)
        .transpose()?
        .unwrap_or_default();
    let marker = rest
        .next()
        .map(u64::from_redis_value)
        .transpose()?
        .unwrap_or(0);
    let mut holders = Vec::new();
    while let (Some(token), Some(left)) = (rest.next(), rest.next()) {
        let token = String::from_redis_value(token)?;
        let left = Duration::from_millis(u64::from_redis_value(left)?);
        holders.push(HolderInfo::new(OwnerToken::from_string(token), Some(left)));
    }
    if holders.is_empty() {
        return Ok(None);
    }
    let mode = parse_mode(&field).unwrap_or(LockMode::Shared);
    Ok(Some(
        LockInfo::shared(key.clone(), mode, holders).with_writer_waiting(marker > 0),
    ))
}

pub(crate) fn info(key: &LockKey, token: String, pttl: i64, fence: Option<u64>) -> LockInfo {
    // PTTL: -1 no expiry (never written so by leasehold), -2 gone since.
    let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
    LockInfo::new(key.clone(), Some(OwnerToken::from_string(token)))
        .with_ttl_remaining(ttl)
        .with_fencing_token(fence)
}

/// Escapes Redis glob metacharacters so a prefix matches literally in `SCAN MATCH`.
pub(crate) fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
