//! Security descriptors in the self-relative binary form (MS-DTYP 2.4.6) as an SMB server
//! returns them to QUERY_INFO (owner, group, DACL; the SACL is never asked for).
//!
//! This parses bytes from outside (the file server): every offset and count is checked against
//! the buffer, the descriptor may be at most [`MAX_SD_LEN`] bytes, an ACL at most
//! [`MAX_ACES`] entries; anything that does not add up is an error, never a guess.

use crate::sid::{Sid, SidError};

/// The largest descriptor accepted. An ACL's own size field is 16 bits, so a descriptor with a
/// DACL, owner and group fits well within this; larger input is refused, not truncated.
pub const MAX_SD_LEN: usize = 256 * 1024;
/// At most this many ACEs in one ACL (a 64 KiB ACL of minimal 16-byte ACEs has 4,095).
pub const MAX_ACES: usize = 4096;

/// SE_DACL_PRESENT: the descriptor has a DACL (when unset: a NULL DACL, everyone allowed).
pub const SE_DACL_PRESENT: u16 = 0x0004;
/// SE_DACL_PROTECTED: the DACL does not inherit from the parent (inheritance broken).
pub const SE_DACL_PROTECTED: u16 = 0x1000;
/// SE_DACL_AUTO_INHERITED.
pub const SE_DACL_AUTO_INHERITED: u16 = 0x0400;
/// SE_SELF_RELATIVE.
pub const SE_SELF_RELATIVE: u16 = 0x8000;

/// ACE flag: object inherit (files below inherit this ACE).
pub const OBJECT_INHERIT_ACE: u8 = 0x01;
/// ACE flag: container inherit (folders below inherit this ACE).
pub const CONTAINER_INHERIT_ACE: u8 = 0x02;
/// ACE flag: inherited ACEs do not propagate further.
pub const NO_PROPAGATE_INHERIT_ACE: u8 = 0x04;
/// ACE flag: the ACE is only for inheritance; it does not apply to this object.
pub const INHERIT_ONLY_ACE: u8 = 0x08;
/// ACE flag: the ACE was inherited from the parent.
pub const INHERITED_ACE: u8 = 0x10;

/// What an ACE does, by its type byte (MS-DTYP 2.4.4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AceKind {
    /// ACCESS_ALLOWED_ACE_TYPE (0).
    Allow,
    /// ACCESS_DENIED_ACE_TYPE (1).
    Deny,
    /// A conditional or object allow ACE (5, 9, 11): its condition is not evaluated, so it
    /// grants nothing here (an under-grant, never a leak).
    AllowUnevaluated(u8),
    /// A conditional or object deny ACE (6, 10, 12): denies as if unconditional (an
    /// under-grant, never a leak).
    DenyUnevaluated(u8),
    /// Any other type (audit, alarm, mandatory label, resource attribute…): ignored for access.
    Other(u8),
}

impl AceKind {
    fn from_type(t: u8) -> AceKind {
        match t {
            0x00 => AceKind::Allow,
            0x01 => AceKind::Deny,
            0x05 | 0x09 | 0x0B => AceKind::AllowUnevaluated(t),
            0x06 | 0x0A | 0x0C => AceKind::DenyUnevaluated(t),
            _ => AceKind::Other(t),
        }
    }
}

/// One access control entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ace {
    /// The ACE's type.
    pub kind: AceKind,
    /// Its flags (`*_INHERIT_ACE`, `INHERITED_ACE`).
    pub flags: u8,
    /// The access mask (generic bits included as stored).
    pub mask: u32,
    /// The trustee; `None` for ACE types whose body is not parsed ([`AceKind::Other`] and the
    /// object/conditional kinds when their SID cannot be located).
    pub sid: Option<Sid>,
}

impl Ace {
    /// An ACCESS_ALLOWED ACE.
    pub fn allow(sid: Sid, flags: u8, mask: u32) -> Ace {
        Ace {
            kind: AceKind::Allow,
            flags,
            mask,
            sid: Some(sid),
        }
    }
    /// An ACCESS_DENIED ACE.
    pub fn deny(sid: Sid, flags: u8, mask: u32) -> Ace {
        Ace {
            kind: AceKind::Deny,
            flags,
            mask,
            sid: Some(sid),
        }
    }
    /// Whether the ACE applies to the object itself (not inherit-only).
    pub fn applies_to_object(&self) -> bool {
        self.flags & INHERIT_ONLY_ACE == 0
    }
}

/// An access control list, its entries in order (order matters: the first match decides).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acl {
    /// The entries, in the order the server stored them.
    pub aces: Vec<Ace>,
}

/// A security descriptor (owner, group, DACL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecurityDescriptor {
    /// The control flags (`SE_*`).
    pub control: u16,
    /// The owner, when asked for and present.
    pub owner: Option<Sid>,
    /// The primary group, when present.
    pub group: Option<Sid>,
    /// The DACL; `None` is a NULL DACL (everyone has every right), `Some(empty)` denies all.
    pub dacl: Option<Acl>,
}

impl SecurityDescriptor {
    /// A descriptor with this DACL (`None`: a NULL DACL) and no owner or group.
    pub fn with_dacl(dacl: Option<Vec<Ace>>) -> SecurityDescriptor {
        SecurityDescriptor {
            control: SE_SELF_RELATIVE | if dacl.is_some() { SE_DACL_PRESENT } else { 0 },
            owner: None,
            group: None,
            dacl: dacl.map(|aces| Acl { aces }),
        }
    }

    /// Whether the DACL is protected from inheritance (a folder that breaks inheritance).
    pub fn is_protected(&self) -> bool {
        self.control & SE_DACL_PROTECTED != 0
    }
}

/// Why bytes are not a security descriptor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SdError {
    /// Longer than [`MAX_SD_LEN`].
    #[error("security descriptor of {0} bytes (limit {MAX_SD_LEN})")]
    TooLarge(usize),
    /// A structure runs past the end of the buffer.
    #[error("security descriptor truncated at {0}")]
    Truncated(&'static str),
    /// Revision other than 1.
    #[error("security descriptor revision {0}")]
    Revision(u8),
    /// An ACL revision other than 2 or 4.
    #[error("ACL revision {0}")]
    AclRevision(u8),
    /// More than [`MAX_ACES`] ACEs.
    #[error("ACL with {0} ACEs (limit {MAX_ACES})")]
    TooManyAces(usize),
    /// An ACE whose size is impossible.
    #[error("ACE {0} has size {1}")]
    AceSize(usize, usize),
    /// A bad SID.
    #[error("{0}: {1}")]
    Sid(&'static str, SidError),
    /// Not a self-relative descriptor.
    #[error("not a self-relative security descriptor")]
    NotSelfRelative,
}

fn u16_at(d: &[u8], at: usize, what: &'static str) -> Result<u16, SdError> {
    d.get(at..at + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .ok_or(SdError::Truncated(what))
}

fn u32_at(d: &[u8], at: usize, what: &'static str) -> Result<u32, SdError> {
    d.get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(SdError::Truncated(what))
}

fn offset(d: &[u8], at: usize, what: &'static str) -> Result<Option<usize>, SdError> {
    let o = u32_at(d, at, what)?;
    if o == 0 {
        return Ok(None);
    }
    let o = usize::try_from(o).map_err(|_| SdError::Truncated(what))?;
    if o >= d.len() {
        return Err(SdError::Truncated(what));
    }
    Ok(Some(o))
}

fn sid_at(d: &[u8], at: usize, what: &'static str) -> Result<Sid, SdError> {
    Sid::from_bytes(&d[at..])
        .map(|(s, _)| s)
        .map_err(|e| SdError::Sid(what, e))
}

/// Parses a self-relative security descriptor.
pub fn parse(data: &[u8]) -> Result<SecurityDescriptor, SdError> {
    if data.len() > MAX_SD_LEN {
        return Err(SdError::TooLarge(data.len()));
    }
    if data.len() < 20 {
        return Err(SdError::Truncated("header"));
    }
    if data[0] != 1 {
        return Err(SdError::Revision(data[0]));
    }
    let control = u16_at(data, 2, "control")?;
    if control & SE_SELF_RELATIVE == 0 {
        return Err(SdError::NotSelfRelative);
    }
    let owner = offset(data, 4, "owner offset")?
        .map(|o| sid_at(data, o, "owner"))
        .transpose()?;
    let group = offset(data, 8, "group offset")?
        .map(|o| sid_at(data, o, "group"))
        .transpose()?;
    let dacl = if control & SE_DACL_PRESENT == 0 {
        None
    } else {
        offset(data, 16, "DACL offset")?
            .map(|o| parse_acl(&data[o..]))
            .transpose()?
    };
    Ok(SecurityDescriptor {
        control,
        owner,
        group,
        dacl,
    })
}

/// Parses an ACL (MS-DTYP 2.4.5) at the start of `data`.
pub fn parse_acl(data: &[u8]) -> Result<Acl, SdError> {
    if data.len() < 8 {
        return Err(SdError::Truncated("ACL header"));
    }
    if !matches!(data[0], 2 | 4) {
        return Err(SdError::AclRevision(data[0]));
    }
    let size = usize::from(u16_at(data, 2, "ACL size")?);
    let count = usize::from(u16_at(data, 4, "ACE count")?);
    if size < 8 || size > data.len() {
        return Err(SdError::Truncated("ACL"));
    }
    if count > MAX_ACES {
        return Err(SdError::TooManyAces(count));
    }
    let acl = &data[..size];
    let mut aces = Vec::with_capacity(count.min(256));
    let mut at = 8;
    for i in 0..count {
        let header = acl
            .get(at..at + 4)
            .ok_or(SdError::Truncated("ACE header"))?;
        let ace_size = usize::from(u16::from_le_bytes([header[2], header[3]]));
        if ace_size < 8 || ace_size % 4 != 0 || at + ace_size > acl.len() {
            return Err(SdError::AceSize(i, ace_size));
        }
        let body = &acl[at..at + ace_size];
        let kind = AceKind::from_type(header[0]);
        let flags = header[1];
        let mask = u32_at(body, 4, "ACE mask")?;
        let sid = match kind {
            AceKind::Allow | AceKind::Deny => Some(sid_at(body, 8, "ACE SID")?),
            // Callback ACEs (9, 10) put the SID where plain ones do, then application data.
            AceKind::AllowUnevaluated(0x09) | AceKind::DenyUnevaluated(0x0A) => {
                Some(sid_at(body, 8, "ACE SID")?)
            }
            // Object ACEs (5, 6, 11, 12): flags, then 0-2 GUIDs, then the SID.
            AceKind::AllowUnevaluated(_) | AceKind::DenyUnevaluated(_) => {
                let oflags = u32_at(body, 8, "object ACE flags")?;
                let guids = (oflags & 1) + ((oflags >> 1) & 1);
                let sid_at_off = 12 + 16 * usize::try_from(guids).unwrap_or(0);
                if sid_at_off >= body.len() {
                    return Err(SdError::AceSize(i, ace_size));
                }
                Some(sid_at(body, sid_at_off, "object ACE SID")?)
            }
            AceKind::Other(_) => None,
        };
        aces.push(Ace {
            kind,
            flags,
            mask,
            sid,
        });
        at += ace_size;
    }
    Ok(Acl { aces })
}

/// The self-relative binary form (owner, group, DACL; no SACL) — for tests and fixtures.
pub fn to_bytes(sd: &SecurityDescriptor) -> Vec<u8> {
    let mut out = vec![0u8; 20];
    out[0] = 1;
    let mut control = sd.control | SE_SELF_RELATIVE;
    if sd.dacl.is_some() {
        control |= SE_DACL_PRESENT;
    } else {
        control &= !SE_DACL_PRESENT;
    }
    out[2..4].copy_from_slice(&control.to_le_bytes());
    let put_offset = |out: &mut Vec<u8>, field: usize| {
        let o = u32::try_from(out.len()).unwrap_or(0);
        out[field..field + 4].copy_from_slice(&o.to_le_bytes());
    };
    if let Some(o) = &sd.owner {
        put_offset(&mut out, 4);
        out.extend_from_slice(&o.to_bytes());
    }
    if let Some(g) = &sd.group {
        put_offset(&mut out, 8);
        out.extend_from_slice(&g.to_bytes());
    }
    if let Some(acl) = &sd.dacl {
        put_offset(&mut out, 16);
        let mut body = Vec::new();
        let mut count = 0u16;
        for ace in &acl.aces {
            let (t, sid) = match (&ace.kind, &ace.sid) {
                (AceKind::Allow, Some(s)) => (0u8, s),
                (AceKind::Deny, Some(s)) => (1u8, s),
                _ => continue,
            };
            let sid = sid.to_bytes();
            let size = u16::try_from(8 + sid.len()).unwrap_or(u16::MAX);
            body.push(t);
            body.push(ace.flags);
            body.extend_from_slice(&size.to_le_bytes());
            body.extend_from_slice(&ace.mask.to_le_bytes());
            body.extend_from_slice(&sid);
            count += 1;
        }
        let size = u16::try_from(8 + body.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&[2, 0]);
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&body);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sid::well_known;

    fn sid(s: &str) -> Sid {
        s.parse().unwrap()
    }

    #[test]
    fn round_trips_owner_group_and_an_ordered_dacl() {
        let sd = SecurityDescriptor {
            control: SE_SELF_RELATIVE | SE_DACL_PRESENT | SE_DACL_PROTECTED,
            owner: Some(well_known::builtin_administrators()),
            group: Some(sid("S-1-5-21-1-2-3-513")),
            dacl: Some(Acl {
                aces: vec![
                    Ace::deny(sid("S-1-5-21-1-2-3-1105"), 0, 0x1),
                    Ace::allow(well_known::everyone(), OBJECT_INHERIT_ACE, 0x1200a9),
                ],
            }),
        };
        let b = to_bytes(&sd);
        assert_eq!(parse(&b).unwrap(), sd);
        assert!(parse(&b).unwrap().is_protected());
    }

    #[test]
    fn null_dacl_and_empty_dacl_differ() {
        let null = parse(&to_bytes(&SecurityDescriptor::with_dacl(None))).unwrap();
        assert_eq!(null.dacl, None);
        let empty = parse(&to_bytes(&SecurityDescriptor::with_dacl(Some(vec![])))).unwrap();
        assert_eq!(empty.dacl, Some(Acl::default()));
    }

    #[test]
    fn bad_input_is_an_error() {
        let good = to_bytes(&SecurityDescriptor::with_dacl(Some(vec![Ace::allow(
            well_known::everyone(),
            0,
            1,
        )])));
        for cut in 0..good.len() {
            assert!(parse(&good[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(
            parse(&vec![0u8; MAX_SD_LEN + 1]),
            Err(SdError::TooLarge(MAX_SD_LEN + 1))
        );
        let mut rev = good.clone();
        rev[0] = 2;
        assert_eq!(parse(&rev), Err(SdError::Revision(2)));
        // An ACE claiming to run past its ACL.
        let mut long = good.clone();
        let ace_size_at = 20 + 8 + 2;
        long[ace_size_at] = 200;
        assert!(matches!(parse(&long), Err(SdError::AceSize(0, 200))));
        // An ACL with more ACEs than the limit.
        let mut many = good;
        many[20 + 4..20 + 6].copy_from_slice(&5000u16.to_le_bytes());
        assert_eq!(parse(&many), Err(SdError::TooManyAces(5000)));
    }
}
