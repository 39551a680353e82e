//! Routing-group ids: tenants that must not share placement.
//!
//! A group id comes from the `X-Prefix-Aware-Id` header (native API) or the `prompt_cache_key`
//! field (OpenAI APIs). It is hashed in front of the prefix, so two tenants sending the same
//! prompt get different keys. The accepted alphabet is the reference service's: 1 to 64 bytes of
//! printable ASCII (0x20..=0x7E); anything else is refused rather than silently normalised.

/// Why a group id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// Empty, or longer than 64 bytes.
    #[error("routing group id must be 1 to 64 characters long, got {0}")]
    Length(usize),
    /// A byte outside printable ASCII (0x20..=0x7E).
    #[error(
        "routing group id must be printable ASCII; byte {byte:#04x} at position {position} is not"
    )]
    NotPrintableAscii { position: usize, byte: u8 },
}

/// A validated routing-group id: 1 to 64 printable ASCII characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupId<'a>(&'a str);

impl<'a> GroupId<'a> {
    /// Longest accepted id, in bytes.
    pub const MAX_LEN: usize = 64;

    /// Validates raw header or field bytes: 1..=64 bytes, each within 0x20..=0x7E.
    pub fn parse(raw: &'a [u8]) -> Result<Self, GroupError> {
        if raw.is_empty() || raw.len() > Self::MAX_LEN {
            return Err(GroupError::Length(raw.len()));
        }
        if let Some(position) = raw.iter().position(|b| !(0x20..=0x7E).contains(b)) {
            return Err(GroupError::NotPrintableAscii {
                position,
                byte: raw[position],
            });
        }
        // Printable ASCII is valid UTF-8, so this conversion cannot fail; map it anyway rather
        // than unwrap, reporting the first byte as the culprit.
        std::str::from_utf8(raw)
            .map(GroupId)
            .map_err(|e| GroupError::NotPrintableAscii {
                position: e.valid_up_to(),
                byte: raw[e.valid_up_to()],
            })
    }

    /// The id as text.
    pub fn as_str(&self) -> &'a str {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_printable_ascii_within_bounds() {
        assert_eq!(
            GroupId::parse(b"tenant-1").map(|g| g.as_str()),
            Ok("tenant-1")
        );
        assert!(GroupId::parse(b" ~").is_ok());
        assert!(GroupId::parse(&[b'a'; 64]).is_ok());
    }

    #[test]
    fn refuses_bad_lengths() {
        assert_eq!(GroupId::parse(b""), Err(GroupError::Length(0)));
        assert_eq!(GroupId::parse(&[b'a'; 65]), Err(GroupError::Length(65)));
    }

    #[test]
    fn refuses_non_printable_bytes_naming_position() {
        assert_eq!(
            GroupId::parse(b"ab\tc"),
            Err(GroupError::NotPrintableAscii {
                position: 2,
                byte: b'\t'
            })
        );
        assert_eq!(
            GroupId::parse(b"a\x7f"),
            Err(GroupError::NotPrintableAscii {
                position: 1,
                byte: 0x7f
            })
        );
        assert_eq!(
            GroupId::parse("é".as_bytes()),
            Err(GroupError::NotPrintableAscii {
                position: 0,
                byte: 0xc3
            })
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn parse_accepts_exactly_the_documented_alphabet(raw in proptest::collection::vec(any::<u8>(), 0..80)) {
            let expected = !raw.is_empty() && raw.len() <= 64 && raw.iter().all(|b| (0x20..=0x7e).contains(b));
            prop_assert_eq!(GroupId::parse(&raw).is_ok(), expected);
        }
    }
}
