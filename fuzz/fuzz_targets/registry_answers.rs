//! H4, S5: whatever a registry or token server answers (WWW-Authenticate, token body,
//! OCI error body, DELETE status and body, tags/list Link) is read without a panic.
#![no_main]

use cocoon_oci::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    match selector % 6 {
        0 => {
            if let Some((realm, _)) = fuzzing::bearer_challenge(&text) {
                assert!(text.to_ascii_lowercase().contains("bearer"), "{realm}");
            }
        }
        1 => {
            if let Ok(token) = fuzzing::token_from_body(&text) {
                assert!(!token.is_empty());
            }
        }
        2 => {
            let _ = fuzzing::error_codes(&text);
        }
        3 => {
            let status = u16::from_le_bytes([
                rest.first().copied().unwrap_or(0),
                rest.get(1).copied().unwrap_or(0),
            ]);
            let body = String::from_utf8_lossy(rest.get(2..).unwrap_or_default());
            let _ = fuzzing::interpret_delete(status, &body, "vm@sha256:0", "delete");
        }
        4 => {
            let _ = fuzzing::next_link(&text);
        }
        _ => {
            let short = fuzzing::excerpt(&text);
            assert!(short.len() <= text.trim().len() + '…'.len_utf8());
        }
    }
});
