//! Routing-group ids: tenants that must not share placement.

/// Why a group id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// Empty, or longer than 64 bytes.
    #[error("routing group id must be 1 to 64 characters long, got {0}")]
    Length(usize),
    /// A byte outside printable ASCII (0x20..=0x7E).
    #[error("routing group id must be printable ASCII; byte {byte:#04x} at position {position} is not")]
    NotPrintableAscii { position: usize, byte: u8 },
}

/// A validated routing-group id: 1 to 64 printable ASCII characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupId<'a>(&'a str);

impl<'a> GroupId<'a> {
    /// Validates raw header or field bytes.
    pub fn parse(raw: &'a [u8]) -> Result<Self, GroupError> {
        todo!("validate {raw:?}")
    }

    /// The id as text.
    pub fn as_str(&self) -> &'a str {
        self.0
    }
}
