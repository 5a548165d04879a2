//! Loopback ports for test servers that need to know their port before they start.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

/// Below Linux's default ephemeral range (32768–60999): a port found free here cannot be
/// taken meanwhile as the local end of an outgoing connection, which is what made a
/// released `:0` port fail with "Address already in use" under parallel tests.
const FIRST: u16 = 20000;
const COUNT: u16 = 12000;

static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback port nobody listens on and this process has not handed out before.
pub fn free_port() -> u16 {
    let random = RandomState::new();
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    for attempt in 0u64..1000 {
        let port = FIRST + (random.hash_one(attempt) % u64::from(COUNT)) as u16;
        if handed_out.contains(&port) || TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err() {
            continue;
        }
        handed_out.insert(port);
        return port;
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + COUNT);
}
