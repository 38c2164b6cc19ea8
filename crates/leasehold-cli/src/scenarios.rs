//! `leasehold scenarios --config FILE` and `leasehold history KEY`.

use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use leasehold::scenario::{Scenario, ScenarioRegistry};

use crate::cli::{Global, HistoryArgs, ScenariosArgs};
use crate::exit::{self, CliError};
use crate::store::Names;

/// Loads a scenario file; a bad one is a usage error (exit 2) naming the file, line and field.
pub(crate) fn load(path: &Path) -> Result<ScenarioRegistry, CliError> {
    ScenarioRegistry::from_toml_file(path).map_err(|e| CliError::usage(e.to_string()))
}

fn duration(d: Option<Duration>) -> String {
    d.map_or_else(
        || "-".to_owned(),
        |d| humantime::format_duration(d).to_string(),
    )
}

fn row(s: &Scenario) -> [String; 10] {
    [
        s.name().to_owned(),
        s.key_pattern().map_or("-".to_owned(), |k| k.to_string()),
        s.acquire_mode().to_string(),
        s.lock_kind().to_string(),
        duration(s.lock_ttl()),
        duration(s.wait_for_lock()),
        s.renewal()
            .map_or("-".to_owned(), |r| if r { "yes" } else { "no" }.to_owned()),
        s.store_down_policy().to_string(),
        s.trace_config().map_or("-".to_owned(), |t| {
            format!(
                "{}/{}",
                t.max_entries(),
                humantime::format_duration(t.ttl())
            )
        }),
        // The layers the scenario sets, each `off`, `on` (the manager's configuration) or its
        // own settings, e.g. `local_competition=hand_off(max 4, 200ms)`.
        s.layer_settings().describe(),
    ]
}

pub(crate) fn scenarios(args: ScenariosArgs) -> Result<u8, CliError> {
    let registry = load(&args.config)?;
    let header = [
        "NAME",
        "KEYS",
        "MODE",
        "LOCK",
        "TTL",
        "WAIT",
        "RENEW",
        "STORE DOWN",
        "TRACE",
        "LAYERS",
    ]
    .map(str::to_owned);
    let header_len = header.len();
    let rows: Vec<[String; 10]> = std::iter::once(header)
        .chain(registry.iter().map(row))
        .collect();
    // Every column, the last (layers) included: `zip` would drop a column without a width.
    let widths: Vec<usize> = (0..header_len)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    println!(
        "{} scenario(s) in {}; keys matching none get {}",
        registry.len(),
        args.config.display(),
        if registry.is_strict() {
            "an error (strict)"
        } else {
            "the defaults"
        }
    );
    Ok(exit::OK)
}

pub(crate) async fn history(global: &Global, args: HistoryArgs) -> Result<u8, CliError> {
    let names = Names::parse(global)?.farm_of(&args.key)?;
    let key = names.key(&args.key)?;
    let target = names.connect().await?;
    let manager = target.manager()?;
    let entries = manager.history(&key).await.map_err(|e| target.error(e))?;
    if args.json {
        let list: Vec<serde_json::Value> = entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "at_ms": e.at_millis(),
                    "event": e.event.as_str(),
                    "token": e.token,
                    "host": e.host,
                    "pid": e.pid,
                    "detail": e.detail,
                })
            })
            .collect();
        let json = serde_json::json!({ "key": key.as_str(), "entries": list });
        let text = serde_json::to_string_pretty(&json)
            .map_err(|e| CliError::new(exit::FAILURE, e.to_string()))?;
        println!("{text}");
        return Ok(exit::OK);
    }
    if entries.is_empty() {
        println!("{key}: no history (the key is not traced, or its history expired)");
        return Ok(exit::OK);
    }
    println!("{key}: {} entries, newest first", entries.len());
    for e in &entries {
        let at = crate::admin::wall_time(UNIX_EPOCH + Duration::from_millis(e.at_millis()));
        let detail = if e.detail.is_empty() {
            String::new()
        } else {
            format!("  ({})", e.detail)
        };
        println!(
            "{at}  {:<8}  {}:{}  {}{detail}",
            e.event.as_str(),
            e.host,
            e.pid,
            e.token
        );
    }
    Ok(exit::OK)
}
