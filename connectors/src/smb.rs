//! An SMB 2/3 share as a source: a recursive listing with each file's and folder's security
//! descriptor, file contents, and who may read each file.
//!
//! The crawl signs in as a service account (NTLM, through the `smb2` crate). The descriptor is
//! read with one compound request per entry: CREATE (READ_CONTROL | FILE_READ_ATTRIBUTES) +
//! QUERY_INFO(SECURITY, OWNER|GROUP|DACL) + QUERY_INFO(FileInternalInformation: the file id) +
//! CLOSE. A file whose descriptor the service account cannot read is reported as
//! [`Access::Unreadable`] — never given readers by guess.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use smb2::client::connection::CompoundOp;
use smb2::msg::close::CloseRequest;
use smb2::msg::create::{CreateDisposition, CreateRequest, ImpersonationLevel, ShareAccess};
use smb2::msg::query_info::{InfoType, QueryInfoRequest, QueryInfoResponse};
use smb2::pack::{ReadCursor, Unpack};
use smb2::types::flags::FileAccessMask;
use smb2::types::status::NtStatus;
use smb2::types::{Command, CreditCharge, FileId, OplockLevel};
use smb2::{ClientConfig, SmbClient, Tree};

use crate::access::{FILE_TRAVERSE, Readers, effective_readers, users_granted};
use crate::directory::Directory;
use crate::sd::{self, SecurityDescriptor};
use crate::sid::Sid;

/// Where and as whom to crawl.
#[derive(Clone)]
pub struct SmbConfig {
    /// `host:port` of the file server.
    pub addr: String,
    /// The share's name.
    pub share: String,
    /// A folder inside the share to crawl ("" for the whole share), `/`-separated.
    pub root: String,
    /// The service account's domain (NetBIOS name).
    pub domain: String,
    /// The service account.
    pub username: String,
    /// Its password.
    pub password: String,
    /// The share's own permissions (`None`: the share has no ACL, which allows everyone).
    pub share_sd: Option<SecurityDescriptor>,
    /// Read the share's permissions from the server at every sync instead (srvsvc level 502;
    /// needs an account the server answers that to — on Windows an administrator or operator).
    /// A refusal fails the sync.
    pub read_share_acl: bool,
    /// Whether reading a file also needs FILE_TRAVERSE on every folder above it. Windows
    /// grants "bypass traverse checking" to Everyone by default (no); Samba opens files as the
    /// user's Unix uid, so the kernel checks every parent folder (yes). Checking is the safe
    /// choice: it can only hide a file, never show one.
    pub check_traverse: bool,
    /// Deadline for one request.
    pub timeout: Duration,
    /// At most this many entries (files and folders) per crawl; more is an error.
    pub max_entries: usize,
    /// Which files and folders the crawl covers (the operator's include and exclude rules);
    /// `None`: all of them.
    pub scope: Option<std::sync::Arc<dyn Scope>>,
}

/// Which paths under the crawl's root are the source's documents (paths relative to the root,
/// `/`-separated, as the listing names them). A file the scope does not admit, and everything
/// under a folder it prunes, is not listed: not described (no security descriptor read), not
/// counted against `max_entries`, and, once gone from the listing, deleted from Airlock like a
/// file removed from the share.
pub trait Scope: Send + Sync {
    /// Whether the file at `path` is a document of the source.
    fn admits(&self, path: &str) -> bool;
    /// Whether no file under the folder at `path` can be admitted (the crawl skips it).
    fn prunes(&self, folder: &str) -> bool;
}

impl std::fmt::Debug for SmbConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmbConfig")
            .field("addr", &self.addr)
            .field("share", &self.share)
            .field("root", &self.root)
            .field("domain", &self.domain)
            .field("username", &self.username)
            .field("check_traverse", &self.check_traverse)
            .finish_non_exhaustive()
    }
}

/// Why the share could not be crawled (as a whole).
#[derive(Debug, thiserror::Error)]
pub enum SmbError {
    /// Connecting, signing in or opening the share failed.
    #[error("cannot reach the share: {0}")]
    Connect(String),
    /// The share's own permissions could not be read (and were asked for).
    #[error("reading the share's permissions failed: {0}")]
    ShareAcl(String),
    /// Listing a folder failed: the crawl is incomplete and must not be applied.
    #[error("listing {path:?} failed: {reason}")]
    List {
        /// The folder.
        path: String,
        /// Why.
        reason: String,
    },
    /// More entries than [`SmbConfig::max_entries`].
    #[error("more than {0} entries")]
    TooMany(usize),
    /// Reading a file failed.
    #[error("reading {path:?} failed: {reason}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// What the crawl learnt about an entry's permissions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// Its security descriptor.
    Sd(SecurityDescriptor),
    /// The service account could not read it (the reason): reported, nobody gets it.
    Unreadable(String),
}

/// One file or folder of the share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `/`-separated path inside the crawled root ("" is the root itself).
    pub path: String,
    /// Whether it is a folder.
    pub is_dir: bool,
    /// Size in bytes.
    pub size: u64,
    /// Last write time (Windows FILETIME ticks).
    pub mtime: u64,
    /// Change time (FILETIME ticks): moves on content and on metadata changes, the
    /// security descriptor's included (0 for the crawl root).
    pub ctime: u64,
    /// The server's file id (FileInternalInformation), stable across renames; `None` when the
    /// file could not be opened.
    pub file_id: Option<u64>,
    /// Its permissions.
    pub access: Access,
    /// A reparse point (symbolic link, junction, …): listed and reported, never followed,
    /// never a document.
    pub is_link: bool,
}

/// A crawl of the share: every entry by path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Entries by path (folders included; the root is "").
    pub entries: BTreeMap<String, Entry>,
}

/// What a file resolves to: its readers, or why nobody gets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileAccess {
    /// These users may read it (possibly nobody).
    Readers(Readers),
    /// The service account could not read the file's or a parent folder's descriptor.
    Unreadable(String),
}

impl Listing {
    /// The files (not folders).
    pub fn files(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values().filter(|e| !e.is_dir && !e.is_link)
    }

    /// SIDs the descriptors name that the directory does not know: domain-style SIDs
    /// (S-1-5-21-…) that are neither a user nor a group of `directory` (another domain, a
    /// deleted account, a server's local account). They grant nobody anything; reported.
    pub fn unknown_sids(&self, directory: &Directory) -> BTreeSet<Sid> {
        let mut out = BTreeSet::new();
        for e in self.entries.values() {
            let Access::Sd(sd) = &e.access else { continue };
            let aces = sd.dacl.iter().flat_map(|a| a.aces.iter());
            for sid in aces.filter_map(|a| a.sid.as_ref()) {
                let domainish = sid.authority() == 5 && sid.sub_authorities().first() == Some(&21);
                if domainish && !directory.knows(sid) {
                    out.insert(sid.clone());
                }
            }
        }
        out
    }

    /// The reparse points (links) the crawl saw and did not follow.
    pub fn links(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values().filter(|e| e.is_link)
    }

    /// Who may read each file, as Windows would decide (see [`crate::access`]): FILE_READ_DATA
    /// on the file and through the share, and with `check_traverse`, FILE_TRAVERSE on every
    /// folder above it.
    pub fn readers(
        &self,
        directory: &Directory,
        share_sd: Option<&SecurityDescriptor>,
        check_traverse: bool,
    ) -> BTreeMap<String, FileAccess> {
        let mut traversers: BTreeMap<&str, Result<Readers, String>> = BTreeMap::new();
        if check_traverse {
            for e in self.entries.values().filter(|e| e.is_dir) {
                let r = match &e.access {
                    Access::Sd(sd) => Ok(users_granted(sd, share_sd, directory, FILE_TRAVERSE)),
                    Access::Unreadable(why) => Err(format!("folder {:?}: {why}", e.path)),
                };
                traversers.insert(&e.path, r);
            }
        }
        let mut out = BTreeMap::new();
        for f in self.files() {
            let mut access = match &f.access {
                Access::Sd(sd) => FileAccess::Readers(effective_readers(sd, share_sd, directory)),
                Access::Unreadable(why) => FileAccess::Unreadable(why.clone()),
            };
            if check_traverse {
                for parent in ancestors(&f.path) {
                    let FileAccess::Readers(r) = &access else {
                        break;
                    };
                    access = match traversers.get(parent) {
                        Some(Ok(t)) => FileAccess::Readers(r.intersect(t)),
                        Some(Err(why)) => FileAccess::Unreadable(why.clone()),
                        None => FileAccess::Unreadable(format!("folder {parent:?} not listed")),
                    };
                }
            }
            out.insert(f.path.clone(), access);
        }
        out
    }
}

/// The folders above `path`, the root ("") included.
fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    let mut cuts: Vec<&str> = vec![""];
    for (i, c) in path.char_indices() {
        if c == '/' {
            cuts.push(&path[..i]);
        }
    }
    cuts.into_iter()
}

/// A signed-in connection to one share.
pub struct SmbShare {
    client: SmbClient,
    tree: Tree,
    cfg: SmbConfig,
}

fn join(a: &str, b: &str) -> String {
    if a.is_empty() {
        b.to_owned()
    } else {
        format!("{a}/{b}")
    }
}

impl SmbShare {
    /// Connects, signs in and opens the share.
    pub async fn connect(cfg: SmbConfig) -> Result<SmbShare, SmbError> {
        let conf = ClientConfig {
            addr: cfg.addr.clone(),
            timeout: cfg.timeout,
            username: cfg.username.clone(),
            password: cfg.password.clone(),
            domain: cfg.domain.clone(),
            auto_reconnect: false,
            compression: false,
            dfs_enabled: false,
            ..ClientConfig::default()
        };
        let mut client = tokio::time::timeout(cfg.timeout, SmbClient::connect(conf))
            .await
            .map_err(|_| SmbError::Connect("timed out".into()))?
            .map_err(|e| SmbError::Connect(e.to_string()))?;
        let tree = tokio::time::timeout(cfg.timeout, client.connect_share(&cfg.share))
            .await
            .map_err(|_| SmbError::Connect("tree connect timed out".into()))?
            .map_err(|e| SmbError::Connect(e.to_string()))?;
        Ok(SmbShare { client, tree, cfg })
    }

    fn full(&self, path: &str) -> String {
        join(self.cfg.root.trim_matches('/'), path)
    }

    /// Lists the crawled root recursively, with every entry's descriptor. A folder that cannot
    /// be listed fails the whole crawl (a partial listing would read as deletions).
    pub async fn list(&mut self) -> Result<Listing, SmbError> {
        let mut listing = Listing::default();
        let root = self.describe("", true, 0, 0, 0, false).await;
        listing.entries.insert(String::new(), root);
        let mut folders = vec![String::new()];
        while let Some(dir) = folders.pop() {
            let full = self.full(&dir);
            let entries = tokio::time::timeout(
                self.cfg.timeout,
                self.client.list_directory(&mut self.tree, &full),
            )
            .await
            .map_err(|_| SmbError::List {
                path: dir.clone(),
                reason: "timed out".into(),
            })?
            .map_err(|e| SmbError::List {
                path: dir.clone(),
                reason: e.to_string(),
            })?;
            for e in entries {
                if e.name == "." || e.name == ".." {
                    continue;
                }
                let path = join(&dir, &e.name);
                if let Some(scope) = &self.cfg.scope {
                    let out = if e.is_directory {
                        scope.prunes(&path)
                    } else {
                        !scope.admits(&path)
                    };
                    if out {
                        continue;
                    }
                }
                if listing.entries.len() >= self.cfg.max_entries {
                    return Err(SmbError::TooMany(self.cfg.max_entries));
                }
                let is_link = e.reparse_tag.is_some();
                let entry = self
                    .describe(
                        &path,
                        e.is_directory,
                        e.size,
                        e.modified.0,
                        e.changed.0,
                        is_link,
                    )
                    .await;
                if e.is_directory && !is_link {
                    folders.push(path.clone());
                }
                listing.entries.insert(path, entry);
            }
        }
        Ok(listing)
    }

    async fn describe(
        &mut self,
        path: &str,
        is_dir: bool,
        size: u64,
        mtime: u64,
        ctime: u64,
        is_link: bool,
    ) -> Entry {
        let (access, file_id) = match self.security(path).await {
            Ok((sd, id)) => (Access::Sd(sd), Some(id)),
            Err(why) => (Access::Unreadable(why), None),
        };
        Entry {
            path: path.to_owned(),
            is_dir,
            size,
            mtime,
            ctime,
            file_id,
            access,
            is_link,
        }
    }

    /// The security descriptor (owner, group, DACL) and file id of `path`.
    pub async fn security(&mut self, path: &str) -> Result<(SecurityDescriptor, u64), String> {
        let name = smb2::encode_path(&self.full(path));
        let create = CreateRequest {
            requested_oplock_level: OplockLevel::None,
            impersonation_level: ImpersonationLevel::Impersonation,
            desired_access: FileAccessMask::new(
                FileAccessMask::READ_CONTROL
                    | FileAccessMask::FILE_READ_ATTRIBUTES
                    | FileAccessMask::SYNCHRONIZE,
            ),
            file_attributes: 0,
            share_access: ShareAccess(
                ShareAccess::FILE_SHARE_READ
                    | ShareAccess::FILE_SHARE_WRITE
                    | ShareAccess::FILE_SHARE_DELETE,
            ),
            create_disposition: CreateDisposition::FileOpen,
            // FILE_OPEN_REPARSE_POINT: a link is described, never followed.
            create_options: 0x0020_0000,
            name,
            create_contexts: vec![],
        };
        let security = QueryInfoRequest {
            info_type: InfoType::Security,
            file_info_class: 0,
            output_buffer_length: 65536,
            // OWNER | GROUP | DACL.
            additional_information: 0x7,
            flags: 0,
            file_id: FileId::SENTINEL,
            input_buffer: vec![],
        };
        let internal = QueryInfoRequest {
            info_type: InfoType::File,
            // FileInternalInformation.
            file_info_class: 6,
            output_buffer_length: 8,
            additional_information: 0,
            flags: 0,
            file_id: FileId::SENTINEL,
            input_buffer: vec![],
        };
        let close = CloseRequest {
            flags: 0,
            file_id: FileId::SENTINEL,
        };
        let tree_id = Some(self.tree.tree_id);
        let op = |command, body| CompoundOp {
            command,
            body,
            tree_id,
            credit_charge: CreditCharge(1),
        };
        let ops = [
            op(Command::Create, &create as &dyn smb2::pack::Pack),
            op(Command::QueryInfo, &security),
            op(Command::QueryInfo, &internal),
            op(Command::Close, &close),
        ];
        let conn = self.client.connection_mut();
        let frames = tokio::time::timeout(self.cfg.timeout, conn.execute_compound(&ops))
            .await
            .map_err(|_| "timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        let mut frames = frames.into_iter();
        let mut next = |what: &str| -> Result<Vec<u8>, String> {
            let f = frames
                .next()
                .ok_or_else(|| format!("{what}: no response"))?
                .map_err(|e| format!("{what}: {e}"))?;
            if f.header.status != NtStatus::SUCCESS {
                return Err(format!("{what}: {:?}", f.header.status));
            }
            Ok(f.body)
        };
        let created = next("open");
        let sd_body = next("security query");
        let id_body = next("file id query");
        created?;
        let sd_resp = QueryInfoResponse::unpack(&mut ReadCursor::new(&sd_body?))
            .map_err(|e| format!("security query: {e}"))?;
        let sd = sd::parse(&sd_resp.output_buffer).map_err(|e| format!("descriptor: {e}"))?;
        let id_resp = QueryInfoResponse::unpack(&mut ReadCursor::new(&id_body?))
            .map_err(|e| format!("file id query: {e}"))?;
        let id = id_resp
            .output_buffer
            .get(..8)
            .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .ok_or("file id query: short answer")?;
        Ok((sd, id))
    }

    /// The bytes of `path`, with at most `max_bytes` of them, read only while the file stays the
    /// same: its size and change time are taken before and after the read, and a file that
    /// changed meanwhile is read once more, then refused (never half-stored). Links are refused.
    pub async fn read(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>, SmbError> {
        let full = self.full(path);
        let err = |reason: String| SmbError::Read {
            path: path.to_owned(),
            reason,
        };
        for _attempt in 0..2 {
            let before = self.stat(&full).await.map_err(err)?;
            if before.reparse_tag.is_some() || before.is_directory {
                return Err(err("not a regular file (link or folder)".into()));
            }
            if before.size > max_bytes {
                return Err(err(format!("{} bytes (limit {max_bytes})", before.size)));
            }
            let bytes = tokio::time::timeout(
                self.cfg.timeout,
                self.client.read_file(&mut self.tree, &full),
            )
            .await
            .map_err(|_| err("timed out".into()))?
            .map_err(|e| err(e.to_string()))?;
            let after = self.stat(&full).await.map_err(err)?;
            if after.size == before.size
                && after.changed == before.changed
                && after.modified == before.modified
                && bytes.len() as u64 == after.size
            {
                return Ok(bytes);
            }
        }
        Err(err("the file kept changing while it was read".into()))
    }

    async fn stat(&mut self, full: &str) -> Result<smb2::FileInfo, String> {
        tokio::time::timeout(self.cfg.timeout, self.client.stat(&mut self.tree, full))
            .await
            .map_err(|_| "stat timed out".to_owned())?
            .map_err(|e| e.to_string())
    }

    /// The share's own security descriptor, read from the server (srvsvc NetrShareGetInfo
    /// level 502): `Ok(None)` when the share has none (everyone allowed).
    pub async fn share_security(&mut self) -> Result<Option<SecurityDescriptor>, String> {
        let share = self.cfg.share.clone();
        let conn = self.client.connection_mut();
        tokio::time::timeout(
            self.cfg.timeout,
            crate::share_acl::share_security(conn, &share),
        )
        .await
        .map_err(|_| "timed out".to_owned())?
    }

    /// The configuration this share was opened with.
    pub fn config(&self) -> &SmbConfig {
        &self.cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::access::{FILE_GENERIC_READ, FILE_TRAVERSE};
    use crate::directory::DirectoryUser;
    use crate::sd::Ace;
    use crate::sid::well_known;

    fn entry(path: &str, is_dir: bool, access: Access) -> Entry {
        Entry {
            path: path.into(),
            is_dir,
            size: 1,
            mtime: 1,
            ctime: 1,
            file_id: Some(1),
            access,
            is_link: false,
        }
    }

    #[test]
    fn traverse_unreadable_folders_and_unknown_sids() {
        let dom: Sid = "S-1-5-21-7-8-9".parse().unwrap();
        let (alice, bob) = (dom.with_rid(1101).unwrap(), dom.with_rid(1102).unwrap());
        let mut d = Directory::new(dom.clone());
        d.add_user(DirectoryUser::new(alice.clone(), "alice", vec![]));
        d.add_user(DirectoryUser::new(bob.clone(), "bob", vec![]));
        d.expand();
        let everyone = SecurityDescriptor::with_dacl(Some(vec![Ace::allow(
            well_known::everyone(),
            0,
            FILE_GENERIC_READ,
        )]));
        let only_alice = SecurityDescriptor::with_dacl(Some(vec![Ace::allow(
            alice.clone(),
            0,
            FILE_TRAVERSE | FILE_GENERIC_READ,
        )]));
        let foreign = SecurityDescriptor::with_dacl(Some(vec![Ace::allow(
            "S-1-5-21-1-1-1-500".parse().unwrap(),
            0,
            FILE_GENERIC_READ,
        )]));
        let mut l = Listing::default();
        for e in [
            entry("", true, Access::Sd(SecurityDescriptor::with_dacl(None))),
            entry("a", true, Access::Sd(only_alice)),
            entry("a/f.txt", false, Access::Sd(everyone.clone())),
            entry("b", true, Access::Unreadable("ACCESS_DENIED".into())),
            entry("b/g.txt", false, Access::Sd(everyone.clone())),
            entry("x.txt", false, Access::Sd(foreign)),
        ] {
            l.entries.insert(e.path.clone(), e);
        }
        let with = l.readers(&d, None, true);
        assert_eq!(
            with["a/f.txt"],
            FileAccess::Readers(Readers {
                users: [alice.clone()].into()
            })
        );
        assert!(matches!(&with["b/g.txt"], FileAccess::Unreadable(w) if w.contains("\"b\"")));
        assert_eq!(with["x.txt"], FileAccess::Readers(Readers::default()));
        let without = l.readers(&d, None, false);
        assert_eq!(
            without["a/f.txt"],
            FileAccess::Readers(Readers {
                users: [alice, bob].into()
            })
        );
        assert_eq!(
            l.unknown_sids(&d),
            ["S-1-5-21-1-1-1-500".parse().unwrap()].into()
        );
    }

    #[test]
    fn ancestors_run_from_the_root_down() {
        assert_eq!(ancestors("a.txt").collect::<Vec<_>>(), [""]);
        assert_eq!(ancestors("x/y/z.txt").collect::<Vec<_>>(), ["", "x", "x/y"]);
    }
}
