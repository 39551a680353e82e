//! `GroupId::parse` on arbitrary bytes: `Ok` exactly when the input is 1..=64 bytes, all
//! printable ASCII (0x20..=0x7E); the error names the length or the first bad byte.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router_core::{GroupError, GroupId};

fuzz_target!(|data: &[u8]| {
    let valid_len = (1..=GroupId::MAX_LEN).contains(&data.len());
    let first_bad = data.iter().position(|b| !(0x20..=0x7E).contains(b));
    match GroupId::parse(data) {
        Ok(id) => {
            assert!(valid_len && first_bad.is_none(), "accepted {data:?}");
            assert_eq!(id.as_str().as_bytes(), data);
        }
        Err(GroupError::Length(n)) => {
            assert!(!valid_len, "length error for {data:?}");
            assert_eq!(n, data.len());
        }
        Err(GroupError::NotPrintableAscii { position, byte }) => {
            assert!(valid_len, "byte error for a bad length: {data:?}");
            assert_eq!(Some(position), first_bad);
            assert_eq!(byte, data[position]);
        }
    }
});
