//! One call of a script: the `EVALSHA` command written as its arguments are given, sent, and on
//! `NOSCRIPT` the script loaded and the command sent again (what `redis::ScriptInvocation` does).
//!
//! `ScriptInvocation` keeps every key and argument in a buffer of its own and copies them into
//! the command when it sends it; a fair acquire passes up to fourteen, and those buffers were a
//! tenth of the client's instructions in an uncontended acquire + release. Here each argument is
//! written once, into the command itself. `EVALSHA` puts the number of keys before the keys, so
//! the keys come first, at once: [`ScriptCall::new`].

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

/// The most arguments (`ARGV`) a script takes: the fair acquire's nine, and four more traced.
const MOST_ARGS: usize = 13;

/// Room for the arguments' bytes: a generated owner token (about 60 bytes), numbers and flags (a
/// longer argument, such as a labelled token or a history entry, grows the buffer once).
const ARGS_BYTES: usize = 160;

/// A script call being written: its keys, then [`arg`](Self::arg)s, then
/// [`invoke`](Self::invoke).
pub(crate) struct ScriptCall<'a> {
    script: &'a Script,
    cmd: Cmd,
}

impl<'a> ScriptCall<'a> {
    /// A call of `script` on `keys`, and last the lock trace's key if the call is traced (a
    /// traced script reads it as its last key: see `traced`).
    pub(crate) fn new(script: &'a Script, keys: &[&str], trace_key: Option<&str>) -> Self {
        Self::announcing(script, keys, None, trace_key)
    }

    /// A call of `script` on `keys`, then the lock's change channel if the call names it (see
    /// `RedisStore::change_channel_if`), then the lock trace's key if the call is traced.
    pub(crate) fn announcing(
        script: &'a Script,
        keys: &[&str],
        change_channel: Option<&str>,
        trace_key: Option<&str>,
    ) -> Self {
        let last = [change_channel, trace_key];
        let last = last.iter().flatten();
        let key_bytes: usize = keys.iter().chain(last.clone()).map(|k| k.len()).sum();
        // Room for every argument at once (growing the command's buffers one argument at a time
        // cost as much as the copies saved): the keys, and the most arguments a script takes
        // with an owner token among them.
        let mut cmd = Cmd::with_capacity(
            3 + keys.len() + 2 + MOST_ARGS,
            "EVALSHA".len() + 40 + 4 + key_bytes + ARGS_BYTES,
        );
        cmd.arg("EVALSHA")
            .arg(script.get_hash())
            .arg(keys.len() + last.clone().count());
        for key in keys.iter().chain(last) {
            cmd.arg(*key);
        }
        ScriptCall { script, cmd }
    }

    /// Appends an argument (`ARGV`).
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Appends a script's last arguments, numbers that default to 0, up to the last one that is
    /// not 0: a script reads an `ARGV` past the end as `nil`, and takes it as 0. Each argument is
    /// a string the server makes for the script on every call, so an uncontended acquire and
    /// release leave out the options they do not use. With `all` (a traced call, whose trace
    /// arguments follow and are counted from the end) every one is sent.
    pub(crate) fn optional_args(&mut self, args: &[u64], all: bool) -> &mut Self {
        let sent = if all {
            args.len()
        } else {
            args.iter()
                .rposition(|&arg| arg != 0)
                .map_or(0, |last| last + 1)
        };
        for arg in &args[..sent] {
            self.cmd.arg(*arg);
        }
        self
    }

    /// Sends the call; if the server does not have the script (`NOSCRIPT`: after a restart, a
    /// failover to a master that never ran it, or `SCRIPT FLUSH`), loads it and sends it again.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            answer => answer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command's words after `EVALSHA <sha>`: the key count, the keys, the arguments.
    fn words(call: &ScriptCall<'_>) -> Vec<String> {
        call.cmd
            .args_iter()
            .skip(2)
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<not a plain argument>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn optional_args_stop_at_the_last_one_set() {
        let script = Script::new("return 1");
        let mut call = ScriptCall::announcing(&script, &["lock", "fence"], None, None);
        call.arg("token").optional_args(&[0, 250, 0, 0], false);
        assert_eq!(words(&call), ["2", "lock", "fence", "token", "0", "250"]);

        let mut call = ScriptCall::new(&script, &["lock"], None);
        call.arg("token").optional_args(&[0, 0], false);
        assert_eq!(words(&call), ["1", "lock", "token"]);
    }

    #[test]
    fn an_announced_call_names_its_channel_and_sends_the_flag() {
        let script = Script::new("return 1");
        let mut call = ScriptCall::announcing(&script, &["lock"], Some("changed:lock"), None);
        call.arg("token").optional_args(&[0, 1], false);
        assert_eq!(
            words(&call),
            ["2", "lock", "changed:lock", "token", "0", "1"]
        );
    }

    #[test]
    fn a_traced_call_sends_every_option_and_its_trace_key_last() {
        // A traced script counts its trace's arguments and key from the end.
        let script = Script::new("return 1");
        let mut call =
            ScriptCall::announcing(&script, &["lock"], Some("changed:lock"), Some("trace:lock"));
        call.arg("token").optional_args(&[0, 0], true);
        assert_eq!(
            words(&call),
            ["3", "lock", "changed:lock", "trace:lock", "token", "0", "0"]
        );
    }
}
