//! A real llama.cpp server for the rack tests: `python3 -m llama_cpp.server` (PyPI
//! `llama-cpp-python[server]`) serving the demo's SmolLM2 GGUF on a free loopback port, killed
//! on drop. Tests that need it call [`LlamaServer::available`]: without the package they fail
//! when `AIRLOCK_REQUIRE_LLAMA_SERVER=1` (CI installs it) and are skipped loudly otherwise.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::models_dir;

/// The model id the server lists (`--model_alias`).
pub const UPSTREAM_MODEL: &str = "smollm2-upstream";

/// A running `llama_cpp.server`.
pub struct LlamaServer {
    child: Option<Child>,
    /// Its TCP port on 127.0.0.1.
    pub port: u16,
    /// Its log (stdout and stderr).
    pub log: PathBuf,
    /// Serving https (uvicorn's own TLS).
    pub tls: bool,
    _dir: tempfile::TempDir,
}

impl LlamaServer {
    /// Whether `python3` can import the server; when not, panics under
    /// `AIRLOCK_REQUIRE_LLAMA_SERVER=1` and prints a loud skip for `test` otherwise.
    pub fn available(test: &str) -> bool {
        let ok = Command::new("python3")
            .args(["-c", "import llama_cpp, llama_cpp.server.app"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            assert!(
                std::env::var("AIRLOCK_REQUIRE_LLAMA_SERVER").as_deref() != Ok("1"),
                "{test}: python3 cannot import llama_cpp.server \
                 (pip install 'llama-cpp-python[server]'), and AIRLOCK_REQUIRE_LLAMA_SERVER=1"
            );
            eprintln!(
                "\n!!! SKIPPED {test}: python3 cannot import llama_cpp.server \
                 (pip install 'llama-cpp-python[server]' to run the rack tests) !!!\n"
            );
        }
        ok
    }

    /// Starts the server and waits until `/v1/models` answers (the model is loaded).
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// Starts the server serving https with `cert` (uvicorn's `--ssl_certfile`/`--ssl_keyfile`)
    /// and waits until its port accepts connections (uvicorn binds after the model is loaded).
    pub fn start_tls(cert: &crate::tls::Pair) -> Self {
        Self::start_with(Some(cert))
    }

    fn start_with(tls: Option<&crate::tls::Pair>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("llama-server.log");
        let port = free_port();
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let gguf = models_dir().join("smollm2/model.gguf");
        assert!(gguf.exists(), "{} is missing", gguf.display());
        let mut cmd = Command::new("python3");
        if let Some(p) = tls {
            cmd.arg("-m")
                .arg("llama_cpp.server")
                .arg("--ssl_certfile")
                .arg(&p.cert)
                .arg("--ssl_keyfile")
                .arg(&p.key);
        } else {
            cmd.args(["-m", "llama_cpp.server"]);
        }
        let child = cmd
            .arg("--model")
            .arg(&gguf)
            .args(["--model_alias", UPSTREAM_MODEL])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--n_ctx", "2048", "--n_threads", "1"])
            // logits_all adds ~0.45 s per 450-token prefill; interrupt_requests would end a
            // running stream with [DONE] as soon as another request arrives.
            .args(["--logits_all", "false", "--interrupt_requests", "false"])
            .args(["--verbose", "false"])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn python3 -m llama_cpp.server");
        let mut s = LlamaServer {
            child: Some(child),
            port,
            log,
            tls: tls.is_some(),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Some(st) = s.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("llama_cpp.server exited ({st}) at start:\n{}", s.log_text());
            }
            let up = if s.tls {
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            } else {
                s.get("/v1/models")
                    .is_some_and(|b| b.contains(UPSTREAM_MODEL))
            };
            if up {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "llama_cpp.server did not start:\n{}",
                s.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `http://127.0.0.1:PORT/v1` (https when serving TLS).
    pub fn base_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}/v1", self.port)
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Kills the server (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A blocking GET, body on 200.
    pub fn get(&self, path: &str) -> Option<String> {
        let mut sock = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        sock.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        write!(
            sock,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut buf = String::new();
        sock.read_to_string(&mut buf).ok()?;
        buf.starts_with("HTTP/1.1 200").then_some(buf)
    }

    /// Seconds of CPU time the server process has used (user + system, from /proc).
    pub fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        // Fields after the command's closing parenthesis: state is field 3; utime 14, stime 15.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
        ticks / 100.0
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A TCP port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
