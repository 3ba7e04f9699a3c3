//! Prints what the SMB crawl sees on a share: its own permissions (srvsvc level 502) and every
//! entry's descriptor. A diagnostic for operators and for debugging against a real server.
//!
//!     cargo run -p airlock-connectors --example smb_describe -- HOST:PORT SHARE DOMAIN USER PASSWORD_FILE

use std::time::Duration;

use airlock_connectors::smb::{Access, SmbConfig, SmbShare};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, share, domain, user, password_file] = args.as_slice() else {
        eprintln!("usage: smb_describe HOST:PORT SHARE DOMAIN USER PASSWORD_FILE");
        std::process::exit(2);
    };
    let password = std::fs::read_to_string(password_file)
        .unwrap_or_else(|e| panic!("{password_file}: {e}"))
        .trim_end_matches(['\r', '\n'])
        .to_owned();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut s = SmbShare::connect(SmbConfig {
            addr: addr.clone(),
            share: share.clone(),
            root: String::new(),
            domain: domain.clone(),
            username: user.clone(),
            password,
            share_sd: None,
            read_share_acl: true,
            check_traverse: true,
            timeout: Duration::from_secs(20),
            max_entries: 100_000,
            scope: None,
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        println!("share ACL: {:?}", s.share_security().await);
        let listing = s.list().await.unwrap_or_else(|e| panic!("{e}"));
        for e in listing.entries.values() {
            match &e.access {
                Access::Sd(sd) => println!("{:?} id={:?} {sd:?}", e.path, e.file_id),
                Access::Unreadable(why) => println!("{:?} UNREADABLE {why}", e.path),
            }
        }
    });
}
