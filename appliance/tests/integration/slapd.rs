//! A real OpenLDAP `slapd` for the directory sign-in tests, started on loopback in a temporary
//! directory with a generated `cn=config` (loaded with `slapadd -n0`, no system service) and a
//! generated directory (`slapadd -n1`). It serves `ldap://` (StartTLS) and `ldaps://` with a
//! server certificate from a test CA made with `openssl` at start. Stopped on drop.
//!
//! The directory (`dc=bank,dc=test`):
//! - `cn=airlock,ou=services`: the service account (password in `bind.secret`, mode 0600);
//! - people `alice` (group `analysts`), `carol` (group `emea-analysts`, itself a member of
//!   `analysts`: nested), `bob` (`risk`), `dave` (`analysts`, disabled: `employeeType:
//!   disabled`, matched by the tests' `disabled_filter`); each user's password is `<uid>-pw`;
//! - groups are `groupOfNames` under `ou=groups`.
//!
//! Without `slapd` (Debian packages `slapd ldap-utils`), [`Slapd::start`] panics when
//! `AIRLOCK_REQUIRE_SLAPD=1` (CI) and otherwise prints a loud skip message and returns `None`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The directory's suffix.
pub const BASE: &str = "dc=bank,dc=test";
/// The root DN (writes from the tests: `ldapmodify`).
const ROOT_DN: &str = "cn=admin,dc=bank,dc=test";
const ROOT_PW: &str = "root-secret-pw";
/// The service account.
pub const SERVICE_DN: &str = "cn=airlock,ou=services,dc=bank,dc=test";
const SERVICE_PW: &str = "service-secret-pw";

/// A running slapd.
pub struct Slapd {
    /// Holds the config, database, certificates and secrets.
    pub dir: tempfile::TempDir,
    child: Child,
    /// `ldap://127.0.0.1:PORT` (StartTLS available).
    pub ldap_url: String,
    /// `ldaps://127.0.0.1:PORT`.
    pub ldaps_url: String,
}

fn find(cmd: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/bin".into(), "/sbin".into()])
        .map(|d| d.join(cmd))
        .find(|p| p.is_file())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A user entry with groups named in [`data_ldif`].
fn person(uid: &str, extra: &str) -> String {
    format!(
        "dn: uid={uid},ou=people,{BASE}\nobjectClass: inetOrgPerson\nuid: {uid}\ncn: {uid}\n\
         sn: {uid}\nuserPassword: {uid}-pw\n{extra}\n"
    )
}

fn group(cn: &str, members: &[&str]) -> String {
    let mut s = format!("dn: cn={cn},ou=groups,{BASE}\nobjectClass: groupOfNames\ncn: {cn}\n");
    for m in members {
        s.push_str(&format!("member: {m}\n"));
    }
    s.push('\n');
    s
}

/// The DN of a person.
pub fn user_dn(uid: &str) -> String {
    format!("uid={uid},ou=people,{BASE}")
}

/// The DN of a group.
pub fn group_dn(cn: &str) -> String {
    format!("cn={cn},ou=groups,{BASE}")
}

fn data_ldif() -> String {
    let mut s = format!(
        "dn: {BASE}\nobjectClass: dcObject\nobjectClass: organization\ndc: bank\no: Bank\n\n"
    );
    for ou in ["people", "groups", "services"] {
        s.push_str(&format!(
            "dn: ou={ou},{BASE}\nobjectClass: organizationalUnit\nou: {ou}\n\n"
        ));
    }
    s.push_str(&format!(
        "dn: {SERVICE_DN}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\n\
         cn: airlock\nuserPassword: {SERVICE_PW}\n\n"
    ));
    for uid in ["alice", "bob", "carol"] {
        s.push_str(&person(uid, ""));
    }
    s.push_str(&person("dave", "employeeType: disabled\n"));
    s.push_str(&group(
        "analysts",
        &[
            &user_dn("alice"),
            &user_dn("dave"),
            &group_dn("emea-analysts"),
        ],
    ));
    s.push_str(&group("emea-analysts", &[&user_dn("carol")]));
    s.push_str(&group("risk", &[&user_dn("bob")]));
    s
}

fn config_ldif(d: &Path, db_extra: &str) -> String {
    let d = d.display();
    format!(
        "dn: cn=config\nobjectClass: olcGlobal\ncn: config\nolcPidFile: {d}/slapd.pid\n\
olcTLSCACertificateFile: {d}/ca.pem\nolcTLSCertificateFile: {d}/server.pem\n\
olcTLSCertificateKeyFile: {d}/server.key\n\n\
dn: cn=module{{0}},cn=config\nobjectClass: olcModuleList\ncn: module{{0}}\n\
olcModulePath: /usr/lib/ldap\nolcModuleLoad: back_mdb\n\n\
dn: cn=schema,cn=config\nobjectClass: olcSchemaConfig\ncn: schema\n\n\
include: file:///etc/ldap/schema/core.ldif\n\n\
include: file:///etc/ldap/schema/cosine.ldif\n\n\
include: file:///etc/ldap/schema/inetorgperson.ldif\n\n\
dn: olcDatabase={{-1}}frontend,cn=config\nobjectClass: olcDatabaseConfig\n\
objectClass: olcFrontendConfig\nolcDatabase: {{-1}}frontend\n\n\
dn: olcDatabase={{0}}config,cn=config\nobjectClass: olcDatabaseConfig\nolcDatabase: {{0}}config\n\
olcAccess: {{0}}to * by * none\n\n\
dn: olcDatabase={{1}}mdb,cn=config\nobjectClass: olcDatabaseConfig\nobjectClass: olcMdbConfig\n\
olcDatabase: {{1}}mdb\nolcSuffix: {BASE}\nolcRootDN: {ROOT_DN}\nolcRootPW: {ROOT_PW}\n\
olcDbDirectory: {d}/db\n\
olcAccess: {{0}}to attrs=userPassword by self write by anonymous auth by * none\n\
olcAccess: {{1}}to * by dn.exact=\"{SERVICE_DN}\" read by self read by * none\n{db_extra}"
    )
}

/// A test CA and a server certificate for `127.0.0.1`/`localhost` signed by it.
fn make_certs(d: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    run(Command::new("openssl")
        .current_dir(d)
        .args(["req", "-x509"])
        .args(ec)
        .args(["-keyout", "ca.key", "-out", "ca.pem", "-days", "2"])
        .args(["-subj", "/CN=Airlock Test CA"])
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]));
    run(Command::new("openssl")
        .current_dir(d)
        .arg("req")
        .args(ec)
        .args(["-keyout", "server.key", "-out", "server.csr"])
        .args(["-subj", "/CN=localhost"]));
    std::fs::write(
        d.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n",
    )
    .unwrap();
    run(Command::new("openssl").current_dir(d).args([
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]));
    // A second, unrelated CA: a client trusting only it must refuse the server.
    run(Command::new("openssl")
        .current_dir(d)
        .args(["req", "-x509"])
        .args(ec)
        .args([
            "-keyout",
            "other-ca.key",
            "-out",
            "other-ca.pem",
            "-days",
            "2",
        ])
        .args(["-subj", "/CN=Unrelated CA"]));
}

impl Slapd {
    /// Starts slapd, or returns `None` after a loud skip message when it is not installed and
    /// `AIRLOCK_REQUIRE_SLAPD` is not `1`.
    pub fn start() -> Option<Slapd> {
        Self::start_with("")
    }

    /// [`Slapd::start`] with a search size limit for everyone but the root DN (AD's
    /// `MaxPageSize` in small): a search matching more than `limit` entries fails with
    /// `sizeLimitExceeded` unless it is paged (RFC 2696) in pages of at most `limit`.
    pub fn start_with_size_limit(limit: u32) -> Option<Slapd> {
        Self::start_with(&format!(
            "olcLimits: * size.soft={limit} size.hard={limit} size.pr={limit} \
             size.prtotal=unlimited\n"
        ))
    }

    fn start_with(db_extra: &str) -> Option<Slapd> {
        let (Some(slapd), Some(slapadd)) = (find("slapd"), find("slapadd")) else {
            if std::env::var("AIRLOCK_REQUIRE_SLAPD").as_deref() == Ok("1") {
                panic!("AIRLOCK_REQUIRE_SLAPD=1 but slapd/slapadd are not installed (slapd)");
            }
            eprintln!(
                "\n!!!!!!!! SKIPPED: slapd not found (apt-get install slapd ldap-utils); \
                 the LDAP sign-in test did not run !!!!!!!!\n"
            );
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("slapd.d")).unwrap();
        std::fs::create_dir_all(d.join("db")).unwrap();
        make_certs(d);
        std::fs::write(d.join("config.ldif"), config_ldif(d, db_extra)).unwrap();
        std::fs::write(d.join("data.ldif"), data_ldif()).unwrap();
        let secret = d.join("bind.secret");
        std::fs::write(&secret, format!("{SERVICE_PW}\n")).unwrap();
        set_mode(&secret, 0o600);
        run(Command::new(&slapadd)
            .args(["-n0", "-F"])
            .arg(d.join("slapd.d"))
            .arg("-l")
            .arg(d.join("config.ldif")));
        run(Command::new(&slapadd)
            .args(["-n1", "-F"])
            .arg(d.join("slapd.d"))
            .arg("-l")
            .arg(d.join("data.ldif")));
        let (p1, p2) = (free_port(), free_port());
        let ldap_url = format!("ldap://127.0.0.1:{p1}");
        let ldaps_url = format!("ldaps://127.0.0.1:{p2}");
        let log = std::fs::File::create(d.join("slapd.log")).unwrap();
        let child = Command::new(&slapd)
            .args(["-d", "0", "-F"])
            .arg(d.join("slapd.d"))
            .arg("-h")
            .arg(format!("{ldap_url}/ {ldaps_url}/"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn slapd");
        let s = Slapd {
            dir,
            child,
            ldap_url,
            ldaps_url,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", p1)).is_err()
            || std::net::TcpStream::connect(("127.0.0.1", p2)).is_err()
        {
            assert!(
                Instant::now() < deadline,
                "slapd did not listen: {}",
                std::fs::read_to_string(s.dir.path().join("slapd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(s)
    }

    /// The test CA's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A CA that did not sign the server's certificate.
    pub fn other_ca_file(&self) -> PathBuf {
        self.dir.path().join("other-ca.pem")
    }

    /// The service account's password file (mode 0600).
    pub fn bind_password_file(&self) -> PathBuf {
        self.dir.path().join("bind.secret")
    }

    /// Applies an LDIF change as the root DN with `ldapmodify` over StartTLS.
    pub fn modify(&self, ldif: &str) {
        let path = self.dir.path().join("change.ldif");
        std::fs::write(&path, ldif).unwrap();
        let ldapmodify = find("ldapmodify").expect("ldapmodify (ldap-utils) is installed");
        run(Command::new(ldapmodify)
            .env("LDAPTLS_CACERT", self.ca_file())
            .args([
                "-x",
                "-ZZ",
                "-H",
                &self.ldap_url,
                "-D",
                ROOT_DN,
                "-w",
                ROOT_PW,
                "-f",
            ])
            .arg(&path));
    }
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

impl Drop for Slapd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn slapd_fixture_serves_starttls_and_ldaps() {
    let Some(s) = Slapd::start() else { return };
    let search = |url: &str, starttls: bool, ca: &Path| {
        let mut c = Command::new(find("ldapsearch").expect("ldapsearch (ldap-utils)"));
        c.env("LDAPTLS_CACERT", ca).args(["-x", "-H", url]);
        if starttls {
            c.arg("-ZZ");
        }
        c.args([
            "-D",
            SERVICE_DN,
            "-w",
            SERVICE_PW,
            "-b",
            BASE,
            "(uid=alice)",
            "dn",
        ]);
        c.output().unwrap()
    };
    for (url, starttls) in [(&s.ldap_url, true), (&s.ldaps_url, false)] {
        let out = search(url, starttls, &s.ca_file());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{url}: {text}");
        assert!(
            text.contains(&format!("dn: {}", user_dn("alice"))),
            "{text}"
        );
        // The server's certificate is not trusted under an unrelated CA.
        assert!(!search(url, starttls, &s.other_ca_file()).status.success());
    }
    let pid = s.child.id();
    drop(s);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/status"))
                .is_ok_and(|st| st.contains("State:\tZ")),
        "slapd is stopped on drop"
    );
}
