//! A private single-member `etcd` for tests: started on free loopback ports (client and peer),
//! with its data directory in a temporary directory, killed by pid on drop.
//!
//! Every test that needs etcd starts its own, so tests never share state with each other or with
//! a developer's cluster, and can kill and restart it to test failures. A restart keeps the data
//! directory (etcd's write-ahead log and snapshot), as a real member coming back after a crash
//! does. If the server does not come up, the error carries its log.
//!
//! ```no_run
//! # fn demo() -> std::io::Result<()> {
//! let mut server = leasehold_testkit::etcd::EtcdServer::start()?;
//! println!("connect to {}", server.url()); // etcd://127.0.0.1:<port>
//! server.restart()?;                       // same ports, same data
//! # Ok(()) }
//! ```

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::redis::free_port;

/// How long a server may take to report healthy after it was started.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// An `etcd` process owned by a test.
#[derive(Debug)]
pub struct EtcdServer {
    child: Option<Child>,
    client_port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
    tls: Option<TlsFiles>,
}

/// The files a TLS server is started with.
#[derive(Debug, Clone)]
struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    require_client_cert: bool,
}

impl EtcdServer {
    /// Starts a one-member cluster on free ports of 127.0.0.1 and waits until it is healthy.
    ///
    /// Fails with [`io::ErrorKind::NotFound`] and a message naming Debian's `etcd-server` package
    /// when the `etcd` binary is missing.
    pub fn start() -> io::Result<Self> {
        Self::start_with(None)
    }

    /// Starts a member whose client port speaks TLS only, with the server certificate of `pki`
    /// (made for `localhost`); with `require_client_cert` a client without a certificate signed by
    /// `pki`'s CA is refused (`--client-cert-auth`, `--trusted-ca-file`), otherwise no client
    /// certificate is asked for. Ready once its own log says it serves.
    pub fn start_tls(pki: &crate::tls::TestPki, require_client_cert: bool) -> io::Result<Self> {
        Self::start_with(Some(TlsFiles {
            cert: pki.server_cert_file(),
            key: pki.server_key_file(),
            ca: pki.ca_file(),
            require_client_cert,
        }))
    }

    fn start_with(tls: Option<TlsFiles>) -> io::Result<Self> {
        // A port free a moment ago can be taken by a server another test starts at the same
        // time; then ours cannot bind, and new ports are tried.
        let mut attempts = 0;
        loop {
            match Self::start_on(free_port()?, free_port()?, tls.clone()) {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && attempts < 5 => attempts += 1,
                result => return result,
            }
        }
    }

    fn start_on(client_port: u16, peer_port: u16, tls: Option<TlsFiles>) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-etcd-")
            .tempdir()?;
        let mut server = EtcdServer {
            child: None,
            client_port,
            peer_port,
            dir,
            tls,
        };
        server.spawn()?;
        Ok(server)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.client_port))
    }

    /// `etcd://127.0.0.1:<client port>`, the store URL; for a TLS member
    /// `etcds://localhost:<client port>` (the name its certificate is made for).
    pub fn url(&self) -> String {
        match self.tls {
            Some(_) => format!("etcds://localhost:{}", self.client_port),
            None => format!("etcd://127.0.0.1:{}", self.client_port),
        }
    }

    /// `127.0.0.1:<client port>`, for `etcd-client` and `EtcdConfig::new` (plain members).
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Pauses the server (SIGSTOP, waiting until it is stopped): its port still accepts
    /// connections, but it answers nothing until [`resume`](Self::resume).
    pub fn pause(&self) -> std::io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| std::io::Error::other("the server is not running"))?;
        crate::process::pause(pid)
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&self) -> std::io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| std::io::Error::other("the server is not running"))?;
        crate::process::resume(pid)
    }

    /// Kills the server (SIGKILL, by pid) and waits for it to exit. Its data directory stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts it again on the same ports with the same data directory (a
    /// member that crashed and came back).
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop();
        self.spawn()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    fn spawn(&mut self) -> io::Result<()> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        // After a restart the log holds the last run too: only what this run writes counts.
        let since = usize::try_from(log.metadata()?.len()).unwrap_or(0);
        let mut command = Command::new("etcd");
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key);
            // etcd turns client certificate authentication on whenever a trusted CA is given.
            if tls.require_client_cert {
                command
                    .arg("--trusted-ca-file")
                    .arg(&tls.ca)
                    .arg("--client-cert-auth=true");
            }
        }
        let child = command
            .args(["--name", "leasehold-test"])
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("leasehold-test={peer}")])
            .args(["--initial-cluster-state", "new"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        "etcd not found: install Debian's `etcd-server` package \
                         (apt-get install -y etcd-server) to run the etcd tests",
                    )
                } else {
                    e
                }
            })?;
        self.child = Some(child);
        let started = Instant::now();
        loop {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
            // Ready once *our* server says so in its own log and answers on the port (a port
            // answering alone could be another test's server that took it first). A TLS member
            // cannot be probed with plain HTTP: its own log must do.
            if exited.is_none()
                && log
                    .get(since..)
                    .unwrap_or_default()
                    .contains("client requests on")
                && (self.tls.is_some() || self.healthy())
            {
                return Ok(());
            }
            if exited.is_some() || started.elapsed() > STARTUP_TIMEOUT {
                self.stop();
                if log.contains("address already in use") {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!(
                            "port {} or {} is taken: {log}",
                            self.client_port, self.peer_port
                        ),
                    ));
                }
                return Err(io::Error::other(format!(
                    "etcd on port {} did not come up ({}); its log:\n{log}",
                    self.client_port,
                    if exited.is_some() {
                        "it exited"
                    } else {
                        "timeout"
                    }
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `GET /health` answers `"health":"true"`.
    fn healthy(&self) -> bool {
        let probe = || -> io::Result<bool> {
            let mut stream = TcpStream::connect_timeout(&self.addr(), Duration::from_millis(250))?;
            stream.set_read_timeout(Some(Duration::from_secs(2)))?;
            stream.write_all(
                b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            )?;
            let mut body = String::new();
            for line in BufReader::new(stream).lines() {
                body.push_str(&line?);
            }
            Ok(body.contains("\"health\":\"true\""))
        };
        probe().unwrap_or(false)
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_healthy_and_comes_back_after_a_restart() {
        let mut server = EtcdServer::start().unwrap();
        assert!(server.healthy());
        let first = server.pid();
        server.restart().unwrap();
        assert!(server.healthy());
        assert_ne!(server.pid(), first);
        assert!(server.url().starts_with("etcd://127.0.0.1:"));
    }
}
