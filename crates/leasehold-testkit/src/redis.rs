//! A private `redis-server` for tests: started on a free loopback port, killed on drop.
//!
//! Every test that needs Redis starts its own server, so tests never share state with each other
//! or with a developer's Redis, and can kill and restart it to test failures. The server keeps
//! nothing on disk (`--save "" --appendonly no`) and logs into a temporary directory; if it does
//! not come up, the error carries its log.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! let mut server = leasehold_testkit::redis::RedisServer::start()?;
//! println!("connect to {}", server.url());
//! server.restart()?;            // same port, empty data set
//! # Ok(()) }
//! ```

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to answer `PING` after it was started.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A `redis-server` process owned by a test.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    tls: Option<TlsFiles>,
    /// What else the server is started with: a config file (first, as `redis-server` wants it)
    /// and further arguments (a cluster node's, a replica's, a sentinel's).
    setup: Setup,
}

/// A config file and arguments a server is started with besides the defaults.
#[derive(Debug, Clone, Default)]
struct Setup {
    config: Option<String>,
    args: Vec<String>,
}

/// The files a TLS server is started with.
#[derive(Debug, Clone)]
struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    require_client_cert: bool,
}

impl RedisServer {
    /// Starts a server on a free port of 127.0.0.1 and waits until it answers `PING`.
    ///
    /// Fails with [`io::ErrorKind::NotFound`] and a message naming the `redis-server` package to
    /// install when the binary is missing.
    pub fn start() -> io::Result<Self> {
        Self::start_with(None)
    }

    /// Starts a server like [`start`](Self::start), with `args` added to its command line (for
    /// example `["--replicaof", "127.0.0.1", "7001"]`).
    pub fn start_with_args(args: &[&str]) -> io::Result<Self> {
        Self::start_setup(
            None,
            Setup {
                config: None,
                args: args.iter().map(|a| a.to_string()).collect(),
            },
        )
    }

    /// Starts a server from the config file text `config` (written into the server's own
    /// directory; `{dir}` in it is replaced by that directory), with `args` after it, such as
    /// `["--sentinel"]`.
    pub fn start_with_config(config: &str, args: &[&str]) -> io::Result<Self> {
        Self::start_setup(
            None,
            Setup {
                config: Some(config.to_owned()),
                args: args.iter().map(|a| a.to_string()).collect(),
            },
        )
    }

    /// The server's own directory (its log, a cluster node's `nodes.conf`).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Starts a server that speaks TLS only (`--port 0 --tls-port <free port>`), with the server
    /// certificate of `pki`, trusting its CA for client certificates; with
    /// `require_client_cert` a client without a certificate signed by that CA is refused
    /// (`--tls-auth-clients yes`), otherwise a client certificate is optional. Ready once the
    /// server logged that it accepts connections.
    ///
    /// Fails with a message saying so when this `redis-server` was built without TLS. The plain
    /// RESP helpers ([`command`](Self::command), [`info_field`](Self::info_field)) do not speak
    /// TLS and fail on such a server.
    pub fn start_tls(pki: &crate::tls::TestPki, require_client_cert: bool) -> io::Result<Self> {
        Self::start_with(Some(TlsFiles {
            cert: pki.server_cert_file(),
            key: pki.server_key_file(),
            ca: pki.ca_file(),
            require_client_cert,
        }))
    }

    fn start_with(tls: Option<TlsFiles>) -> io::Result<Self> {
        Self::start_setup(tls, Setup::default())
    }

    fn start_setup(tls: Option<TlsFiles>, setup: Setup) -> io::Result<Self> {
        // A port free a moment ago can be taken by a server another test starts at the same
        // time; then ours cannot bind, and a new port is tried.
        let mut attempts = 0;
        loop {
            match Self::start_on_with(free_port()?, tls.clone(), setup.clone()) {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && attempts < 5 => attempts += 1,
                result => return result,
            }
        }
    }

    /// Starts a server on `port`; [`io::ErrorKind::AddrInUse`] if something else listens there.
    #[cfg(test)]
    fn start_on(port: u16, tls: Option<TlsFiles>) -> io::Result<Self> {
        Self::start_on_with(port, tls, Setup::default())
    }

    fn start_on_with(port: u16, tls: Option<TlsFiles>, setup: Setup) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-redis-")
            .tempdir()?;
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            tls,
            setup,
        };
        server.spawn()?;
        Ok(server)
    }

    /// Whether the server speaks TLS only ([`start_tls`](Self::start_tls)).
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:<port>`, or for a TLS server `rediss://localhost:<port>` (the name a
    /// test certificate is made for).
    pub fn url(&self) -> String {
        match self.tls {
            Some(_) => format!("rediss://localhost:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Pauses the server (SIGSTOP): it keeps its connections but answers nothing until
    /// [`resume`](Self::resume).
    pub fn pause(&self) -> io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| io::Error::other("the server is not running"))?;
        crate::process::pause(pid)
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&self) -> io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| io::Error::other("the server is not running"))?;
        crate::process::resume(pid)
    }

    /// Kills the server (SIGKILL) and waits for it to exit. Its data is gone.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server and starts a new one on the same port (an empty data set, as after a crash
    /// of a server that keeps nothing on disk).
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop();
        self.spawn()
    }

    /// Sends one command with `redis-cli`-free plain RESP and returns the raw reply line(s), for
    /// test assertions that must not go through the code under test (for example `INFO stats`).
    pub fn command(&self, args: &[&str]) -> io::Result<String> {
        self.command_within(args, Duration::from_secs(5))
    }

    fn command_within(&self, args: &[&str], timeout: Duration) -> io::Result<String> {
        let mut stream = TcpStream::connect(self.addr())?;
        stream.set_read_timeout(Some(timeout))?;
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        stream.write_all(request.as_bytes())?;
        let mut reader = BufReader::new(stream);
        let mut first = String::new();
        reader.read_line(&mut first)?;
        match first.as_bytes().first() {
            Some(b'$') => {
                let len: i64 = first[1..].trim().parse().map_err(io::Error::other)?;
                if len < 0 {
                    return Ok(String::new());
                }
                let mut body = vec![0; len as usize + 2];
                reader.read_exact(&mut body)?;
                body.truncate(len as usize);
                String::from_utf8(body).map_err(io::Error::other)
            }
            _ => Ok(first.trim_end().to_owned()),
        }
    }

    /// A field of `INFO <section>`, e.g. `info_field("stats", "total_commands_processed")`.
    pub fn info_field(&self, section: &str, field: &str) -> io::Result<String> {
        self.info_field_within(section, field, Duration::from_secs(5))
    }

    fn info_field_within(
        &self,
        section: &str,
        field: &str,
        timeout: Duration,
    ) -> io::Result<String> {
        let info = self.command_within(&["INFO", section], timeout)?;
        info.lines()
            .find_map(|line| line.strip_prefix(&format!("{field}:")))
            .map(|v| v.trim().to_owned())
            .ok_or_else(|| io::Error::other(format!("INFO {section} has no field {field}")))
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn spawn(&mut self) -> io::Result<()> {
        let mut command = Command::new("redis-server");
        if let Some(config) = &self.setup.config {
            let file = self.dir.path().join("redis.conf");
            let dir = self.dir.path().display().to_string();
            std::fs::write(&file, config.replace("{dir}", &dir))?;
            command.arg(file);
        }
        match &self.tls {
            None => {
                command.args(["--port", &self.port.to_string()]);
            }
            Some(tls) => {
                command
                    .args(["--port", "0"])
                    .args(["--tls-port", &self.port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(&tls.cert)
                    .arg("--tls-key-file")
                    .arg(&tls.key)
                    .arg("--tls-ca-cert-file")
                    .arg(&tls.ca)
                    .args([
                        "--tls-auth-clients",
                        if tls.require_client_cert {
                            "yes"
                        } else {
                            "optional"
                        },
                    ]);
            }
        }
        let child = command
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--protected-mode", "yes"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.setup.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        "redis-server not found: install the `redis-server` package \
                         (apt-get install -y redis-server) to run the Redis tests",
                    )
                } else {
                    e
                }
            })?;
        self.child = Some(child);
        let started = Instant::now();
        let pid = self.pid().map(|pid| pid.to_string());
        if self.tls.is_some() {
            return self.wait_tls_ready(started);
        }
        loop {
            // Ready once *our* server answers: a PONG from the port alone could come from
            // another test's server that took the port first.
            let answering =
                self.info_field_within("server", "process_id", Duration::from_millis(250));
            if let Ok(answering) = answering {
                if Some(&answering) == pid.as_ref() {
                    return Ok(());
                }
                self.stop();
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "port {} is taken by another redis-server (pid {answering})",
                        self.port
                    ),
                ));
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || started.elapsed() > STARTUP_TIMEOUT {
                self.stop();
                let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
                if exited.is_some() && log.contains("already in use") {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("port {} is taken: {log}", self.port),
                    ));
                }
                return Err(io::Error::other(format!(
                    "redis-server on port {} did not come up ({}); its log:\n{log}",
                    self.port,
                    if exited.is_some() {
                        "it exited"
                    } else {
                        "timeout"
                    }
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl RedisServer {
    /// A TLS server is ready once its own log (ours alone) says it accepts connections; the
    /// plain `INFO` probe cannot speak TLS.
    fn wait_tls_ready(&mut self, started: Instant) -> io::Result<()> {
        loop {
            let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_none() && log.contains("Ready to accept connections") {
                return Ok(());
            }
            if exited.is_some() || started.elapsed() > STARTUP_TIMEOUT {
                self.stop();
                if log.contains("already in use") {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("port {} is taken: {log}", self.port),
                    ));
                }
                if log.contains("TLS")
                    && (log.contains("not supported") || log.contains("Bad directive"))
                    || log.contains("Bad directive or wrong number of arguments")
                {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!(
                            "this redis-server was built without TLS support, so the TLS tests \
                             cannot run: install a build with TLS (Debian's `redis-server` \
                             package has it); its log:\n{log}"
                        ),
                    ));
                }
                return Err(io::Error::other(format!(
                    "TLS redis-server on port {} did not come up ({}); its log:\n{log}",
                    self.port,
                    if exited.is_some() {
                        "it exited"
                    } else {
                        "timeout"
                    }
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_held_by_another_redis_server_is_not_mistaken_for_ours() {
        let first = RedisServer::start().unwrap();
        let err = RedisServer::start_on(first.port(), None).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");
        assert!(err.to_string().contains("another redis-server"), "{err}");
        assert_eq!(
            first.command(&["PING"]).unwrap(),
            "+PONG",
            "the first one runs on"
        );
    }

    #[test]
    fn a_port_held_by_anything_else_is_reported_as_in_use() {
        let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let err = RedisServer::start_on(port, None).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");
    }

    #[test]
    fn a_tls_server_listens_on_its_tls_port_only() {
        let pki = crate::tls::TestPki::generate(&["localhost"]).unwrap();
        let server = RedisServer::start_tls(&pki, false).unwrap();
        assert!(server.is_tls());
        assert_eq!(
            server.url(),
            format!("rediss://localhost:{}", server.port())
        );
        let log = std::fs::read_to_string(server.log_path()).unwrap();
        assert!(log.contains("Ready to accept connections"), "{log}");
        assert!(log.contains(&format!("port={}", server.port())), "{log}");
        // The plain probe cannot speak TLS: a TLS-only server never answers it.
        assert!(server
            .info_field_within("server", "process_id", Duration::from_millis(300))
            .is_err());
    }

    #[test]
    fn start_answers_from_its_own_process() {
        let server = RedisServer::start().unwrap();
        let pid = server.info_field("server", "process_id").unwrap();
        assert_eq!(Some(pid), server.pid().map(|p| p.to_string()));
    }
}
