//! A real Samba AD domain controller for the tests, on loopback, started and stopped by the
//! test that owns it (tests/samba/start-dc.sh / stop-dc.sh): provisioned into a fresh temp
//! dir, users and nested groups made with samba-tool, files and NTFS ACLs set through the
//! server with smbclient and smbcacls (SDDL with hex masks and full SIDs).
//!
//! When Samba cannot run here (not installed, not root), [`Dc::start`] says so LOUDLY on stderr
//! and returns `None`, unless `AIRLOCK_REQUIRE_SAMBA=1`, where it panics (CI sets it).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

/// The repository's tests/samba directory.
fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/samba")
}

/// A running DC; dropping it stops samba (and removes its state dir).
pub struct Dc {
    state: tempfile::TempDir,
    info: BTreeMap<String, String>,
    /// Passwords of the users the test created, by name.
    pub passwords: BTreeMap<String, String>,
    /// How long provisioning + start took.
    pub started_in: std::time::Duration,
}

fn skip_or_fail(why: &str) -> Option<Dc> {
    if std::env::var("AIRLOCK_REQUIRE_SAMBA").as_deref() == Ok("1") {
        panic!("AIRLOCK_REQUIRE_SAMBA=1 but the Samba DC cannot run: {why}");
    }
    eprintln!("\n*** SKIPPED: Samba AD DC tests: {why}");
    eprintln!(
        "*** (apt-get install samba smbclient winbind krb5-user; run as root; set AIRLOCK_REQUIRE_SAMBA=1 to make this a failure)\n"
    );
    None
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn check(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Dc {
    /// Provisions and starts a DC, or `None` (said loudly) when this machine cannot.
    pub fn start() -> Option<Dc> {
        for tool in ["samba", "samba-tool", "smbclient", "smbcacls", "openssl"] {
            let found = Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .is_ok_and(|o| o.status.success());
            if !found {
                return skip_or_fail(&format!("{tool} is not installed"));
            }
        }
        if !run(Command::new("id").arg("-u")).stdout.starts_with(b"0") {
            return skip_or_fail("samba as an AD DC needs root");
        }
        if std::net::TcpListener::bind("127.0.0.1:445").is_err()
            || std::net::TcpListener::bind("127.0.0.1:389").is_err()
        {
            return skip_or_fail("127.0.0.1:445 or :389 is taken (another DC running?)");
        }
        let state = tempfile::Builder::new()
            .prefix("airlock-samba-")
            .tempdir()
            .expect("temp dir");
        let t0 = Instant::now();
        let out = run(Command::new("bash")
            .arg(scripts().join("start-dc.sh"))
            .arg(state.path()));
        if !out.status.success() {
            let why = format!(
                "start-dc.sh failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let _ = Command::new("bash")
                .arg(scripts().join("stop-dc.sh"))
                .arg(state.path())
                .status();
            return skip_or_fail(&why);
        }
        let info = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let dc = Dc {
            state,
            info,
            passwords: BTreeMap::new(),
            started_in: t0.elapsed(),
        };
        eprintln!("samba DC up in {:.1} s", dc.started_in.as_secs_f64());
        Some(dc)
    }

    /// A value start-dc.sh printed (REALM, DOMAIN, DOMAIN_SID, CA_FILE, SHARE_PATH…).
    pub fn get(&self, key: &str) -> &str {
        self.info
            .get(key)
            .unwrap_or_else(|| panic!("start-dc.sh printed no {key}"))
    }

    /// The state directory.
    pub fn path(&self) -> &Path {
        self.state.path()
    }

    fn admin(&self) -> String {
        format!(
            "{}\\Administrator%{}",
            self.get("DOMAIN"),
            self.get("ADMIN_PASSWORD")
        )
    }

    /// samba-tool against the DC's own database.
    pub fn samba_tool(&self, args: &[&str]) -> String {
        check(
            Command::new("samba-tool")
                .args(args)
                .args(["-s", self.get("SMB_CONF")]),
        )
    }

    /// Creates a user.
    pub fn add_user(&mut self, name: &str, password: &str) {
        self.samba_tool(&["user", "create", name, password]);
        self.passwords.insert(name.to_owned(), password.to_owned());
    }

    /// Creates a group.
    pub fn add_group(&self, name: &str) {
        self.samba_tool(&["group", "add", name]);
    }

    /// Adds members (users or groups) to a group.
    pub fn add_members(&self, group: &str, members: &[&str]) {
        self.samba_tool(&["group", "addmembers", group, &members.join(",")]);
    }

    /// Removes members from a group.
    pub fn remove_members(&self, group: &str, members: &[&str]) {
        self.samba_tool(&["group", "removemembers", group, &members.join(",")]);
    }

    /// The objectSid of a user or group.
    pub fn sid(&self, name: &str) -> String {
        let out = run(Command::new("samba-tool")
            .args(["user", "show", name, "--attributes=objectSid"])
            .args(["-s", self.get("SMB_CONF")]));
        let text = if out.status.success() {
            String::from_utf8_lossy(&out.stdout).into_owned()
        } else {
            self.samba_tool(&["group", "show", name, "--attributes=objectSid"])
        };
        text.lines()
            .find_map(|l| l.strip_prefix("objectSid: "))
            .unwrap_or_else(|| panic!("no objectSid for {name}: {text}"))
            .trim()
            .to_owned()
    }

    /// Runs smbclient commands on the share as Administrator.
    pub fn smb(&self, commands: &str) -> String {
        check(Command::new("smbclient").arg(self.get("SHARE")).args([
            "-U",
            &self.admin(),
            "-c",
            commands,
        ]))
    }

    /// Writes a file on the share (through the server, so it inherits its folder's ACL).
    pub fn put(&self, path: &str, content: &[u8]) {
        let local = self.state.path().join("upload.tmp");
        std::fs::write(&local, content).unwrap();
        self.smb(&format!("put \"{}\" \"{}\"", local.display(), path));
    }

    /// Sets a file's or folder's whole security descriptor from SDDL.
    pub fn set_sddl(&self, path: &str, sddl: &str) {
        check(
            Command::new("smbcacls")
                .arg(self.get("SHARE"))
                .arg(path)
                .args(["-U", &self.admin(), "--sddl", "--set", sddl]),
        );
    }

    /// Adds ACEs (`ACL:SID:DENIED/0x0/0x00000001` form) to a file.
    pub fn add_ace(&self, path: &str, ace: &str) {
        check(
            Command::new("smbcacls")
                .arg(self.get("SHARE"))
                .arg(path)
                .args(["-U", &self.admin(), "--add", ace]),
        );
    }

    /// Sets the share's own permissions (share_info.tdb, through sharesec on the DC).
    pub fn set_share_sddl(&self, sddl: &str) {
        check(Command::new("sharesec").args([
            "docs",
            "-s",
            self.get("SMB_CONF"),
            "--setsddl",
            sddl,
        ]));
    }

    /// The SDDL of a file (for failure messages).
    pub fn sddl(&self, path: &str) -> String {
        check(
            Command::new("smbcacls")
                .arg(self.get("SHARE"))
                .arg(path)
                .args(["-U", &self.admin(), "--sddl", "--numeric"]),
        )
    }

    /// The server's own verdict: can `user` open and read `path`?
    pub fn can_read(&self, user: &str, path: &str) -> Option<bool> {
        let pw = self.passwords.get(user)?;
        let out = run(Command::new("smbclient").arg(self.get("SHARE")).args([
            "-U",
            &format!("{}\\{user}%{pw}", self.get("DOMAIN")),
            "-c",
            &format!("get \"{path}\" /dev/null"),
        ]));
        Some(out.status.success())
    }

    /// Every file on the share, listed as Administrator ("/"-separated paths).
    pub fn files(&self) -> std::collections::BTreeSet<String> {
        // The share's directory on disk is the truth smbd serves.
        let root = PathBuf::from(self.get("SHARE_PATH"));
        let mut out = std::collections::BTreeSet::new();
        let mut stack = vec![root.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                let p = e.path();
                if e.file_type().unwrap().is_dir() {
                    stack.push(p);
                } else {
                    let rel = p
                        .strip_prefix(&root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned();
                    out.insert(rel);
                }
            }
        }
        out
    }
}

impl Drop for Dc {
    fn drop(&mut self) {
        let status = Command::new("bash")
            .arg(scripts().join("stop-dc.sh"))
            .arg(self.state.path())
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!("stop-dc.sh failed: {status:?}");
        }
    }
}
