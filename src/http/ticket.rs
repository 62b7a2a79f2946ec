//! Event-stream tickets: how a browser's `EventSource`, which cannot send an `Authorization`
//! header, reads an event stream behind a token without putting the token in a URL.
//!
//! `POST /sessions/{id}/events/ticket` (with the bearer token) answers a ticket: the expiry
//! time and an HMAC-SHA256 of the stream it opens and that time, under a key drawn at random
//! once per process. It opens only that stream (`GET /sessions/{id}/events?ticket=…`; the
//! all-sessions feed has `POST /events/ticket`) and only until it expires
//! ([`super::HttpOptions::ticket_ttl`], 60 s by default). Nothing is stored: a ticket is
//! checked by recomputing its MAC, in constant time. A ticket leaked through a log or a
//! browser history is worth one stream for a minute; the token itself never appears in a URL.
//! The key dies with the process: after a restart, clients ask for a new ticket.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The scope of the all-sessions feed's tickets (no session id can be empty).
pub(super) const ALL_SESSIONS: &str = "";

/// This process's ticket key (shared by every worker, so any worker accepts any ticket).
fn key() -> &'static [u8; 32] {
    static KEY: OnceLock<[u8; 32]> = OnceLock::new();
    KEY.get_or_init(|| {
        let mut key = [0u8; 32];
        if let Err(e) = getrandom::fill(&mut key) {
            // No OS randomness: fall back to a key nobody outside this process knows either
            // way (its address, the time and the pid), and say so.
            log::warn!("tickets: no OS randomness ({e}); using a weaker process-local key");
            let seed = format!(
                "{:?}{}{:p}",
                SystemTime::now(),
                std::process::id(),
                &key as *const _
            );
            for (i, byte) in seed.bytes().enumerate() {
                key[i % 32] ^= byte;
            }
        }
        key
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn mac(scope: &str, expires_ms: u64) -> Vec<u8> {
    // `new_from_slice` accepts keys of any length for HMAC.
    let mut mac = match Hmac::<Sha256>::new_from_slice(key()) {
        Ok(mac) => mac,
        Err(_) => return Vec::new(),
    };
    mac.update(b"durable-sessions events ticket v1\0");
    mac.update(scope.as_bytes());
    mac.update(b"\0");
    mac.update(&expires_ms.to_be_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// A ticket for the stream `scope` (a session id, or [`ALL_SESSIONS`]), valid for `ttl`;
/// returns it with its expiry (Unix ms).
pub(super) fn issue(scope: &str, ttl: Duration) -> (String, u64) {
    let expires = now_ms().saturating_add(ttl.as_millis() as u64);
    let ticket = format!("{expires}.{}", URL_SAFE_NO_PAD.encode(mac(scope, expires)));
    (ticket, expires)
}

/// Whether `ticket` opens the stream `scope` now.
pub(super) fn valid(ticket: &str, scope: &str) -> bool {
    let Some((expires, signature)) = ticket.split_once('.') else {
        return false;
    };
    let Ok(expires) = expires.parse::<u64>() else {
        return false;
    };
    let Ok(signature) = URL_SAFE_NO_PAD.decode(signature) else {
        return false;
    };
    let expected = mac(scope, expires);
    let matches: bool = signature.ct_eq(&expected).into();
    matches && !expected.is_empty() && now_ms() < expires
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_opens_its_own_stream_until_it_expires() {
        let (ticket, _) = issue("s1", Duration::from_secs(60));
        assert!(valid(&ticket, "s1"));
        assert!(!valid(&ticket, "s2"));
        assert!(!valid(&ticket, ALL_SESSIONS));
        let (expired, _) = issue("s1", Duration::ZERO);
        assert!(!valid(&expired, "s1"));
        let (expires, signature) = ticket.split_once('.').unwrap_or_default();
        let later = format!("{}.{signature}", expires.parse::<u64>().unwrap_or(0) + 1);
        assert!(!valid(&later, "s1"), "the expiry is signed");
        assert!(!valid("garbage", "s1"));
    }
}
