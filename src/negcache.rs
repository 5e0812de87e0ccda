//! The negative cache: destinations whose RDMA attempt failed recently go straight to TCP.
//!
//! Keyed by destination address and port, an IPv4-mapped one as its IPv4 form (the same
//! rdma_cm destination, whichever socket family the program used); entries expire after `RSOCK_NEG_CACHE_MS`. The
//! clock is passed in, so the logic is testable without sleeping. Bounded: when full, expired
//! entries are dropped first, then the one closest to expiry.

use crate::stats::Detail;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most destinations remembered at once.
pub const CAPACITY: usize = 4096;

/// Destinations that failed RDMA, with the time each stops being skipped and what failed
/// (shown with the connections it sends to TCP).
#[derive(Debug, Default)]
pub struct NegCache {
    until: Mutex<HashMap<SocketAddr, (Instant, Detail)>>,
}

impl NegCache {
    /// An empty cache.
    pub fn new() -> NegCache {
        NegCache::default()
    }

    /// How `dest` failed RDMA, if it did less than its time-to-live ago. `now` is read only
    /// if `dest` is in the cache (the clock can be a syscall).
    pub fn failure(&self, dest: &SocketAddr, now: impl FnOnce() -> Instant) -> Option<Detail> {
        let dest = &crate::addr::v4_of(*dest);
        let mut map = self.until.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(dest) {
            Some(&(t, why)) if t > now() => Some(why),
            Some(_) => {
                map.remove(dest);
                None
            }
            None => None,
        }
    }

    /// Remembers that `dest` failed RDMA at `now` as `why` says, for `ttl` (zero: not
    /// remembered).
    pub fn insert(&self, dest: SocketAddr, now: Instant, ttl: Duration, why: Detail) {
        if ttl.is_zero() {
            return;
        }
        let dest = crate::addr::v4_of(dest);
        let mut map = self.until.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= CAPACITY && !map.contains_key(&dest) {
            map.retain(|_, (t, _)| *t > now);
            if map.len() >= CAPACITY {
                if let Some(oldest) = map.iter().min_by_key(|(_, (t, _))| *t).map(|(k, _)| *k) {
                    map.remove(&oldest);
                }
            }
        }
        map.insert(dest, (now + ttl, why));
    }

    /// Forgets `dest` (after it served RDMA again).
    pub fn remove(&self, dest: &SocketAddr) {
        let dest = &crate::addr::v4_of(*dest);
        self.until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(dest);
    }

    /// Entries currently held (expired ones included until looked up or evicted).
    pub fn len(&self) -> usize {
        self.until.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl NegCache {
        fn contains(&self, dest: &SocketAddr, now: Instant) -> bool {
            self.failure(dest, || now).is_some()
        }
    }

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn remembers_until_expiry_then_forgets() {
        let c = NegCache::new();
        let t0 = Instant::now();
        let ttl = Duration::from_millis(100);
        assert!(!c.contains(&a("10.0.0.1:80"), t0));
        c.insert(a("10.0.0.1:80"), t0, ttl, Detail::None);
        assert!(c.contains(&a("10.0.0.1:80"), t0 + Duration::from_millis(99)));
        assert!(!c.contains(&a("10.0.0.1:81"), t0), "keyed by port too");
        assert!(!c.contains(&a("10.0.0.1:80"), t0 + ttl));
        assert!(c.is_empty(), "expired entry dropped on lookup");
    }

    #[test]
    fn says_how_the_destination_failed() {
        let c = NegCache::new();
        let t0 = Instant::now();
        let why = Detail::Failed {
            errno: libc::ECONNREFUSED,
            event: None,
        };
        c.insert(a("10.0.0.1:80"), t0, Duration::from_secs(1), why);
        assert_eq!(c.failure(&a("10.0.0.1:80"), || t0), Some(why));
        assert_eq!(
            c.failure(&a("10.0.0.1:80"), || t0 + Duration::from_secs(1)),
            None
        );
    }

    #[test]
    fn zero_ttl_disables_and_remove_forgets() {
        let c = NegCache::new();
        let t0 = Instant::now();
        c.insert(a("10.0.0.1:80"), t0, Duration::ZERO, Detail::None);
        assert!(!c.contains(&a("10.0.0.1:80"), t0));
        c.insert(a("10.0.0.1:80"), t0, Duration::from_secs(1), Detail::None);
        c.remove(&a("10.0.0.1:80"));
        assert!(!c.contains(&a("10.0.0.1:80"), t0));
    }

    #[test]
    fn mapped_and_ipv4_are_one_destination() {
        let c = NegCache::new();
        let t0 = Instant::now();
        c.insert(
            a("[::ffff:10.0.0.1]:80"),
            t0,
            Duration::from_secs(1),
            Detail::None,
        );
        assert!(c.contains(&a("10.0.0.1:80"), t0));
        assert!(c.contains(&a("[::ffff:10.0.0.1]:80"), t0));
        assert!(
            !c.contains(&a("[::10.0.0.1]:80"), t0),
            "IPv4-compatible is IPv6"
        );
        c.remove(&a("10.0.0.1:80"));
        assert!(!c.contains(&a("[::ffff:10.0.0.1]:80"), t0));
    }

    #[test]
    fn bounded_evicting_expired_then_soonest() {
        let c = NegCache::new();
        let t0 = Instant::now();
        for i in 0..CAPACITY {
            let ttl = Duration::from_millis(if i == 7 { 1 } else { 1000 + i as u64 });
            c.insert(
                SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 1)),
                t0,
                ttl,
                Detail::None,
            );
        }
        assert_eq!(c.len(), CAPACITY);
        // Entry 7 has expired by now: it makes room.
        c.insert(
            a("10.9.9.9:1"),
            t0 + Duration::from_millis(5),
            Duration::from_secs(1),
            Detail::None,
        );
        assert_eq!(c.len(), CAPACITY);
        assert!(c.contains(&a("10.9.9.9:1"), t0 + Duration::from_millis(5)));
        // Nothing expired: the entry closest to expiry (index 0) goes.
        c.insert(
            a("10.9.9.10:1"),
            t0 + Duration::from_millis(5),
            Duration::from_secs(9),
            Detail::None,
        );
        assert_eq!(c.len(), CAPACITY);
        assert!(!c.contains(
            &SocketAddr::from(([10, 0, 0, 0], 1)),
            t0 + Duration::from_millis(5)
        ));
    }
}
