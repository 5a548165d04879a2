//! P3: any docker config.json gives credentials or a clear error; never a panic.
#![no_main]

use cocoon_oci::{RegistryAuth, auth_from_docker_config};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first line is the registry host asked for, the rest the file.
    let split = data.iter().position(|b| *b == b'\n').unwrap_or(data.len());
    let host = String::from_utf8_lossy(&data[..split]);
    let json = data.get(split + 1..).unwrap_or_default();
    if let Ok(RegistryAuth::Basic(username, _)) = auth_from_docker_config(json, &host) {
        assert!(!username.is_empty());
    }
});
