//! Security identifiers (MS-DTYP 2.4.2): the text form `S-1-5-21-…` and the binary form found
//! in security descriptors and in Active Directory's `objectSid`/`tokenGroups`.

use std::fmt;
use std::str::FromStr;

/// At most this many sub-authorities (MS-DTYP 2.4.2.2: SID_MAX_SUB_AUTHORITIES).
pub const MAX_SUB_AUTHORITIES: usize = 15;

/// A security identifier.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sid {
    /// The 48-bit identifier authority (5 = NT AUTHORITY, 1 = World, 3 = Creator).
    authority: u64,
    /// The sub-authorities, at most [`MAX_SUB_AUTHORITIES`].
    subs: Vec<u32>,
}

/// Why bytes or a string are not a SID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SidError {
    /// Fewer bytes than the SID says it has.
    #[error("SID truncated")]
    Truncated,
    /// Revision other than 1.
    #[error("SID revision {0} (only 1 exists)")]
    Revision(u8),
    /// More than 15 sub-authorities.
    #[error("SID with {0} sub-authorities (at most 15)")]
    TooManySubAuthorities(usize),
    /// Not `S-1-<authority>(-<sub>)*`.
    #[error("not a SID string: {0:?}")]
    Syntax(String),
}

impl Sid {
    /// A SID from its authority (< 2^48) and sub-authorities (at most 15).
    pub fn new(authority: u64, subs: &[u32]) -> Result<Sid, SidError> {
        if subs.len() > MAX_SUB_AUTHORITIES {
            return Err(SidError::TooManySubAuthorities(subs.len()));
        }
        if authority >= 1 << 48 {
            return Err(SidError::Syntax(format!("authority {authority}")));
        }
        Ok(Sid {
            authority,
            subs: subs.to_vec(),
        })
    }

    /// The identifier authority.
    pub fn authority(&self) -> u64 {
        self.authority
    }

    /// The sub-authorities.
    pub fn sub_authorities(&self) -> &[u32] {
        &self.subs
    }

    /// The last sub-authority (a domain account's RID).
    pub fn rid(&self) -> Option<u32> {
        self.subs.last().copied()
    }

    /// This SID with `rid` appended (a domain SID + 513 is the domain's Domain Users).
    pub fn with_rid(&self, rid: u32) -> Result<Sid, SidError> {
        let mut subs = self.subs.clone();
        subs.push(rid);
        Sid::new(self.authority, &subs)
    }

    /// The SID without its last sub-authority (a domain account's domain).
    pub fn domain(&self) -> Option<Sid> {
        if self.subs.is_empty() {
            return None;
        }
        Some(Sid {
            authority: self.authority,
            subs: self.subs[..self.subs.len() - 1].to_vec(),
        })
    }

    /// Parses the binary form at the start of `data`; returns the SID and its length in bytes.
    pub fn from_bytes(data: &[u8]) -> Result<(Sid, usize), SidError> {
        if data.len() < 8 {
            return Err(SidError::Truncated);
        }
        if data[0] != 1 {
            return Err(SidError::Revision(data[0]));
        }
        let count = usize::from(data[1]);
        if count > MAX_SUB_AUTHORITIES {
            return Err(SidError::TooManySubAuthorities(count));
        }
        let len = 8 + 4 * count;
        if data.len() < len {
            return Err(SidError::Truncated);
        }
        let authority = data[2..8]
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        let subs = data[8..len]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok((Sid { authority, subs }, len))
    }

    /// The binary form.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 4 * self.subs.len());
        out.push(1);
        // At most 15 sub-authorities (checked at construction).
        out.push(u8::try_from(self.subs.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(&self.authority.to_be_bytes()[2..8]);
        for s in &self.subs {
            out.extend_from_slice(&s.to_le_bytes());
        }
        out
    }
}

impl fmt::Debug for Sid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Sid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.authority < 1 << 32 {
            write!(f, "S-1-{}", self.authority)?;
        } else {
            write!(f, "S-1-0x{:012X}", self.authority)?;
        }
        for s in &self.subs {
            write!(f, "-{s}")?;
        }
        Ok(())
    }
}

impl FromStr for Sid {
    type Err = SidError;
    fn from_str(s: &str) -> Result<Sid, SidError> {
        let bad = || SidError::Syntax(s.chars().take(80).collect());
        let mut parts = s.split('-');
        if !parts.next().is_some_and(|p| p.eq_ignore_ascii_case("S")) || parts.next() != Some("1") {
            return Err(bad());
        }
        let auth = parts.next().ok_or_else(bad)?;
        let authority =
            if let Some(hex) = auth.strip_prefix("0x").or_else(|| auth.strip_prefix("0X")) {
                u64::from_str_radix(hex, 16).map_err(|_| bad())?
            } else {
                auth.parse::<u64>().map_err(|_| bad())?
            };
        let subs = parts
            .map(|p| p.parse::<u32>().map_err(|_| bad()))
            .collect::<Result<Vec<_>, _>>()?;
        Sid::new(authority, &subs).map_err(|e| match e {
            SidError::TooManySubAuthorities(n) => SidError::TooManySubAuthorities(n),
            _ => bad(),
        })
    }
}

impl serde::Serialize for Sid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Sid {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Sid, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Well-known SIDs the access check and the identity mapping name explicitly.
pub mod well_known {
    use super::Sid;

    fn sid(authority: u64, subs: &[u32]) -> Sid {
        Sid {
            authority,
            subs: subs.to_vec(),
        }
    }

    /// Everyone, S-1-1-0: every user in the directory (and anonymous, which Airlock has not).
    pub fn everyone() -> Sid {
        sid(1, &[0])
    }
    /// CREATOR OWNER, S-1-3-0: a placeholder in inheritable ACEs; matches nobody on the object.
    pub fn creator_owner() -> Sid {
        sid(3, &[0])
    }
    /// CREATOR GROUP, S-1-3-1: as CREATOR OWNER, for the primary group.
    pub fn creator_group() -> Sid {
        sid(3, &[1])
    }
    /// OWNER RIGHTS, S-1-3-4: stands for the object's current owner.
    pub fn owner_rights() -> Sid {
        sid(3, &[4])
    }
    /// Authenticated Users, S-1-5-11: every signed-in domain user.
    pub fn authenticated_users() -> Sid {
        sid(5, &[11])
    }
    /// Local System, S-1-5-18 (never an Airlock user).
    pub fn local_system() -> Sid {
        sid(5, &[18])
    }
    /// BUILTIN\Administrators, S-1-5-32-544.
    pub fn builtin_administrators() -> Sid {
        sid(5, &[32, 544])
    }
    /// BUILTIN\Users, S-1-5-32-545: in a domain, holds Domain Users (and Authenticated Users).
    pub fn builtin_users() -> Sid {
        sid(5, &[32, 545])
    }
    /// The RID of a domain's Domain Users group (every account's default primary group).
    pub const DOMAIN_USERS_RID: u32 = 513;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_binary_round_trip() {
        let s: Sid = "S-1-5-21-551613501-3383636027-79599359-1104"
            .parse()
            .unwrap();
        assert_eq!(s.to_string(), "S-1-5-21-551613501-3383636027-79599359-1104");
        assert_eq!(s.rid(), Some(1104));
        let b = s.to_bytes();
        assert_eq!(b.len(), 8 + 4 * 5);
        assert_eq!(Sid::from_bytes(&b).unwrap(), (s.clone(), b.len()));
        assert_eq!(
            s.domain().unwrap().with_rid(513).unwrap().to_string(),
            "S-1-5-21-551613501-3383636027-79599359-513"
        );
        assert_eq!(well_known::everyone().to_string(), "S-1-1-0");
        assert_eq!(well_known::builtin_users().to_bytes(), {
            let mut v = vec![1, 2, 0, 0, 0, 0, 0, 5];
            v.extend_from_slice(&32u32.to_le_bytes());
            v.extend_from_slice(&545u32.to_le_bytes());
            v
        });
    }

    #[test]
    fn bad_sids_are_refused() {
        for s in [
            "",
            "S-1",
            "S-2-5",
            "X-1-5",
            "S-1-5-x",
            "S-1-5--1",
            "S-1-5-4294967296",
        ] {
            assert!(s.parse::<Sid>().is_err(), "{s}");
        }
        let sixteen = format!("S-1-5{}", "-1".repeat(16));
        assert_eq!(
            sixteen.parse::<Sid>(),
            Err(SidError::TooManySubAuthorities(16))
        );
        assert_eq!(Sid::from_bytes(&[1, 1, 0, 0]), Err(SidError::Truncated));
        assert_eq!(
            Sid::from_bytes(&[2, 0, 0, 0, 0, 0, 0, 5]),
            Err(SidError::Revision(2))
        );
        assert_eq!(
            Sid::from_bytes(&[1, 16, 0, 0, 0, 0, 0, 5]),
            Err(SidError::TooManySubAuthorities(16))
        );
        assert_eq!(
            Sid::from_bytes(&[1, 2, 0, 0, 0, 0, 0, 5, 1, 0, 0, 0]),
            Err(SidError::Truncated)
        );
    }
}
