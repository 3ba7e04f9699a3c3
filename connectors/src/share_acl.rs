//! The share's own permissions ("share ACL"), read from the server over DCE/RPC: srvsvc
//! NetrShareGetInfo (opnum 16) at level 502, whose answer carries the share's security
//! descriptor (MS-SRVS 3.1.4.10, 2.2.4.26). Windows answers level 502 only to administrators
//! and operators; a refusal is an error, never "no share ACL".
//!
//! The answer is outside bytes: every length is checked against the buffer and against
//! [`crate::sd::MAX_SD_LEN`], strings are skipped, not trusted.

use smb2::client::connection::Connection;
use smb2::msg::close::CloseRequest;
use smb2::msg::create::{
    CreateDisposition, CreateRequest, CreateResponse, ImpersonationLevel, ShareAccess,
};
use smb2::msg::ioctl::{FSCTL_PIPE_TRANSCEIVE, IoctlRequest, IoctlResponse, SMB2_0_IOCTL_IS_FSCTL};
use smb2::msg::read::{ReadRequest, ReadResponse};
use smb2::msg::tree_connect::{TreeConnectRequest, TreeConnectRequestFlags};
use smb2::msg::tree_disconnect::TreeDisconnectRequest;
use smb2::pack::{ReadCursor, Unpack};
use smb2::types::flags::FileAccessMask;
use smb2::types::status::NtStatus;
use smb2::types::{Command, FileId, OplockLevel, TreeId};

use crate::sd::{self, MAX_SD_LEN, SecurityDescriptor};

/// NetrShareGetInfo.
const OPNUM_NET_SHARE_GET_INFO: u16 = 16;
/// At most this many bytes in one RPC answer (all fragments).
const MAX_ANSWER: usize = 4 * MAX_SD_LEN;

fn ndr_string(out: &mut Vec<u8>, s: &str) {
    let units: Vec<u16> = s.encode_utf16().chain([0]).collect();
    let n = u32::try_from(units.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
    for u in units {
        out.extend_from_slice(&u.to_le_bytes());
    }
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// The request stub: ServerName (unique pointer), NetName, Level 502.
pub fn request_stub(server: &str, share: &str) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0x0002_0000u32.to_le_bytes());
    ndr_string(&mut out, &format!("\\\\{server}"));
    ndr_string(&mut out, share);
    out.extend_from_slice(&502u32.to_le_bytes());
    out
}

struct Ndr<'a> {
    data: &'a [u8],
    at: usize,
}

impl Ndr<'_> {
    fn u32(&mut self) -> Result<u32, String> {
        self.align4();
        let b = self
            .data
            .get(self.at..self.at + 4)
            .ok_or("share info truncated")?;
        self.at += 4;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn align4(&mut self) {
        self.at = self.at.div_ceil(4) * 4;
    }
    fn skip_string(&mut self) -> Result<(), String> {
        let _max = self.u32()?;
        let _offset = self.u32()?;
        let actual = usize::try_from(self.u32()?).map_err(|e| e.to_string())?;
        let len = actual.checked_mul(2).ok_or("string length")?;
        if self.at + len > self.data.len() {
            return Err("share info string truncated".into());
        }
        self.at += len;
        Ok(())
    }
}

/// Parses the response stub: `Ok(None)` when the share has no security descriptor (the caller
/// decides what that means; [`share_security`] refuses it).
pub fn parse_response_stub(stub: &[u8]) -> Result<Option<SecurityDescriptor>, String> {
    let mut r = Ndr { data: stub, at: 0 };
    let level = r.u32()?;
    if level != 502 {
        // A failed call answers with a null union arm and the error code.
        let werror = stub
            .get(stub.len().saturating_sub(4)..)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .unwrap_or(0);
        return Err(format!(
            "NetrShareGetInfo: level {level}, WERROR 0x{werror:08x}"
        ));
    }
    if r.u32()? == 0 {
        let werror = r.u32()?;
        return Err(format!("NetrShareGetInfo refused: WERROR 0x{werror:08x}"));
    }
    let netname = r.u32()?;
    let _type = r.u32()?;
    let remark = r.u32()?;
    let _permissions = r.u32()?;
    let _max_uses = r.u32()?;
    let _current_uses = r.u32()?;
    let path = r.u32()?;
    let passwd = r.u32()?;
    let _reserved = r.u32()?;
    let sd_ptr = r.u32()?;
    for p in [netname, remark, path, passwd] {
        if p != 0 {
            r.skip_string()?;
        }
    }
    let sd = if sd_ptr != 0 {
        let n = usize::try_from(r.u32()?).map_err(|e| e.to_string())?;
        if n > MAX_SD_LEN {
            return Err(format!("share security descriptor of {n} bytes"));
        }
        let bytes = stub
            .get(r.at..r.at + n)
            .ok_or("share security descriptor truncated")?;
        r.at += n;
        if n == 0 {
            None
        } else {
            Some(sd::parse(bytes).map_err(|e| format!("share security descriptor: {e}"))?)
        }
    } else {
        None
    };
    let werror = r.u32()?;
    if werror != 0 {
        return Err(format!("NetrShareGetInfo: WERROR 0x{werror:08x}"));
    }
    Ok(sd)
}

fn status(frame: &smb2::client::connection::Frame, what: &str) -> Result<(), String> {
    if frame.header.status == NtStatus::SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {:?}", frame.header.status))
    }
}

/// Reads the share's security descriptor over `conn` (IPC$, \pipe\srvsvc).
pub async fn share_security(
    conn: &mut Connection,
    share: &str,
) -> Result<Option<SecurityDescriptor>, String> {
    let server = conn
        .server_name()
        .split(':')
        .next()
        .unwrap_or("")
        .to_owned();
    let req = TreeConnectRequest {
        flags: TreeConnectRequestFlags::default(),
        path: format!(r"\\{server}\IPC$"),
    };
    let frame = conn
        .execute(Command::TreeConnect, &req, None)
        .await
        .map_err(|e| format!("IPC$: {e}"))?;
    status(&frame, "IPC$")?;
    let tree = frame.header.tree_id.ok_or("IPC$: no tree id")?;
    // A share always has a descriptor (Windows and Samba answer a default one when none was
    // set); an answer without one is not "everyone may": it fails the sync.
    let result = pipe_call(conn, tree, &server, share).await.and_then(|sd| {
        sd.map(Some)
            .ok_or_else(|| "the server answered without the share's security descriptor".into())
    });
    let _ = conn
        .execute(Command::TreeDisconnect, &TreeDisconnectRequest, Some(tree))
        .await;
    result
}

async fn pipe_call(
    conn: &mut Connection,
    tree: TreeId,
    server: &str,
    share: &str,
) -> Result<Option<SecurityDescriptor>, String> {
    let create = CreateRequest {
        requested_oplock_level: OplockLevel::None,
        impersonation_level: ImpersonationLevel::Impersonation,
        desired_access: FileAccessMask::new(
            FileAccessMask::FILE_READ_DATA | FileAccessMask::FILE_WRITE_DATA,
        ),
        file_attributes: 0,
        share_access: ShareAccess(ShareAccess::FILE_SHARE_READ | ShareAccess::FILE_SHARE_WRITE),
        create_disposition: CreateDisposition::FileOpen,
        create_options: 0,
        name: "srvsvc".into(),
        create_contexts: vec![],
    };
    let frame = conn
        .execute(Command::Create, &create, Some(tree))
        .await
        .map_err(|e| format!("srvsvc pipe: {e}"))?;
    status(&frame, "srvsvc pipe")?;
    let pipe = CreateResponse::unpack(&mut ReadCursor::new(&frame.body))
        .map_err(|e| format!("srvsvc pipe: {e}"))?
        .file_id;
    let result = async {
        let ack = transceive(conn, tree, pipe, smb2::rpc::build_srvsvc_bind(1)).await?;
        smb2::rpc::parse_bind_ack(&ack).map_err(|e| format!("RPC bind: {e}"))?;
        let pdu =
            smb2::rpc::build_request(2, OPNUM_NET_SHARE_GET_INFO, &request_stub(server, share));
        let mut pdu = transceive(conn, tree, pipe, pdu).await?;
        let mut stub = Vec::new();
        loop {
            let (part, last) = smb2::rpc::parse_response_fragment(&pdu)
                .map_err(|e| format!("RPC response: {e}"))?;
            stub.extend_from_slice(part);
            if stub.len() > MAX_ANSWER {
                return Err("RPC answer too large".to_owned());
            }
            if last {
                break;
            }
            pdu = read(conn, tree, pipe).await?;
        }
        parse_response_stub(&stub)
    }
    .await;
    let _ = conn
        .execute(
            Command::Close,
            &CloseRequest {
                flags: 0,
                file_id: pipe,
            },
            Some(tree),
        )
        .await;
    result
}

/// Writes one RPC PDU to the pipe and reads the answer in the same request
/// (FSCTL_PIPE_TRANSCEIVE, as Windows' RPC runtime does; a plain READ after a WRITE waits
/// forever on Samba's srvsvc pipe). An answer longer than one buffer continues with reads.
async fn transceive(
    conn: &mut Connection,
    tree: TreeId,
    pipe: FileId,
    data: Vec<u8>,
) -> Result<Vec<u8>, String> {
    let req = IoctlRequest {
        ctl_code: FSCTL_PIPE_TRANSCEIVE,
        file_id: pipe,
        max_input_response: 0,
        max_output_response: 65536,
        flags: SMB2_0_IOCTL_IS_FSCTL,
        input_data: data,
    };
    let frame = conn
        .execute(Command::Ioctl, &req, Some(tree))
        .await
        .map_err(|e| format!("pipe transceive: {e}"))?;
    let st = frame.header.status;
    if !st.is_success_or_partial() {
        return Err(format!("pipe transceive: {st:?}"));
    }
    let mut out = IoctlResponse::unpack(&mut ReadCursor::new(&frame.body))
        .map_err(|e| format!("pipe transceive: {e}"))?
        .output_data;
    if st == NtStatus::BUFFER_OVERFLOW {
        out.extend(read(conn, tree, pipe).await?);
    }
    Ok(out)
}

async fn read(conn: &mut Connection, tree: TreeId, pipe: FileId) -> Result<Vec<u8>, String> {
    let mut message = Vec::new();
    loop {
        let req = ReadRequest {
            padding: 0x50,
            flags: 0,
            length: 65536,
            offset: 0,
            file_id: pipe,
            minimum_count: 0,
            channel: 0,
            remaining_bytes: 0,
            read_channel_info: vec![],
        };
        let frame = conn
            .execute(Command::Read, &req, Some(tree))
            .await
            .map_err(|e| format!("pipe read: {e}"))?;
        let st = frame.header.status;
        if !st.is_success_or_partial() {
            return Err(format!("pipe read: {st:?}"));
        }
        let resp = ReadResponse::unpack(&mut ReadCursor::new(&frame.body))
            .map_err(|e| format!("pipe read: {e}"))?;
        let n = resp.data.len();
        message.extend_from_slice(&resp.data);
        if message.len() > MAX_ANSWER {
            return Err("pipe message too large".into());
        }
        if st != NtStatus::BUFFER_OVERFLOW {
            return Ok(message);
        }
        if n == 0 {
            return Err("pipe read: overflow without data".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sd::{Ace, to_bytes};
    use crate::sid::well_known;

    fn answer(sd: Option<&[u8]>) -> Vec<u8> {
        let mut out = Vec::new();
        let mut u = |v: u32| out.extend_from_slice(&v.to_le_bytes());
        u(502);
        u(0x20000);
        for v in [0x20004, 0, 0, 0, u32::MAX, 1, 0x2000c, 0] {
            u(v);
        }
        u(sd.map_or(0, |s| s.len() as u32));
        u(if sd.is_some() { 0x20010 } else { 0 });
        ndr_string(&mut out, "docs");
        ndr_string(&mut out, "C:\\docs");
        if let Some(sd) = sd {
            out.extend_from_slice(&(sd.len() as u32).to_le_bytes());
            out.extend_from_slice(sd);
            while !out.len().is_multiple_of(4) {
                out.push(0);
            }
        }
        out.extend_from_slice(&0u32.to_le_bytes());
        out
    }

    #[test]
    fn a_level_502_answer_yields_the_share_descriptor() {
        let sd = SecurityDescriptor::with_dacl(Some(vec![Ace::allow(
            well_known::everyone(),
            0,
            0x1200a9,
        )]));
        let bytes = to_bytes(&sd);
        assert_eq!(
            parse_response_stub(&answer(Some(&bytes))).unwrap(),
            Some(sd)
        );
        assert_eq!(parse_response_stub(&answer(None)).unwrap(), None);
        let full = answer(Some(&bytes));
        for cut in 0..full.len() {
            assert!(parse_response_stub(&full[..cut]).is_err(), "cut {cut}");
        }
    }
}
