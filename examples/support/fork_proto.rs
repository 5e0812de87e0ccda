//! Shared by the fork test programs (examples/prefork_server.rs, examples/fork_echo.rs,
//! examples/fork_client.rs; tests/rdma/fork_matrix.sh): a small SHA-256, a deterministic
//! byte pattern, and the server side of the echo-with-digest protocol.
//!
//! Protocol (one connection, the client speaks first; the first byte is the operation):
//! - `E` echo: every byte after `E` is sent back; once the client half-closes, the server
//!   sends the trailer line and closes.
//! - `S<m>\n` sink/source: the server sends `m` bytes of `pattern(m)` while it reads the
//!   client's bytes until the half-close (two directions at once), then the trailer line.
//! - `P` ping: the server answers one byte `p`, then waits for the client's close.
//!
//! Trailer: `digest up=<sha256 of the bytes received> n=<count> down=<sha256 of the bytes
//! sent> m=<count> pid=<pid of the serving process>\n`.
//! A client that sent `E` + N bytes reads exactly N echoed bytes, then the trailer.

#![allow(dead_code)] // each example uses its own part

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

/// SHA-256 (FIPS 180-4), streaming.
pub struct Sha256 {
    h: [u32; 8],
    buf: [u8; 64],
    nbuf: usize,
    len: u64,
}

const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

impl Default for Sha256 {
    fn default() -> Self {
        Self::new()
    }
}

impl Sha256 {
    pub fn new() -> Self {
        Sha256 {
            h: [
                0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
                0x5be0cd19,
            ],
            buf: [0; 64],
            nbuf: 0,
            len: 0,
        }
    }

    fn block(&mut self, b: &[u8]) {
        let mut w = [0u32; 64];
        for (i, c) in b.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b_, mut c, mut d, mut e, mut f, mut g, mut h] = self.h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = h
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b_) ^ (a & c) ^ (b_ & c);
            let t2 = s0.wrapping_add(maj);
            h = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b_;
            b_ = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in self.h.iter_mut().zip([a, b_, c, d, e, f, g, h]) {
            *x = x.wrapping_add(y);
        }
    }

    pub fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if self.nbuf > 0 {
            let k = (64 - self.nbuf).min(data.len());
            self.buf[self.nbuf..self.nbuf + k].copy_from_slice(&data[..k]);
            self.nbuf += k;
            data = &data[k..];
            if self.nbuf < 64 {
                return;
            }
            let b = self.buf;
            self.block(&b);
            self.nbuf = 0;
        }
        let mut chunks = data.chunks_exact(64);
        for c in &mut chunks {
            self.block(c);
        }
        let rest = chunks.remainder();
        self.buf[..rest.len()].copy_from_slice(rest);
        self.nbuf = rest.len();
    }

    pub fn hex(mut self) -> String {
        let bits = self.len.wrapping_mul(8);
        let mut pad = vec![0x80u8];
        while (self.nbuf + pad.len()) % 64 != 56 {
            pad.push(0);
        }
        pad.extend_from_slice(&bits.to_be_bytes());
        let len = self.len;
        self.update(&pad);
        self.len = len;
        self.h.iter().map(|x| format!("{x:08x}")).collect()
    }
}

/// sha256 of `data` as lowercase hex.
pub fn sha256_hex(data: &[u8]) -> String {
    let mut s = Sha256::new();
    s.update(data);
    s.hex()
}

/// `len` bytes of a pattern chosen by `seed` (xorshift32).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x: u32 = 0x9E37_79B9u32.wrapping_mul((seed as u32).wrapping_add(1)) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Seed of the pattern a sink/source server sends (the client computes the same bytes).
pub const SOURCE_SEED: u64 = 0x5eed;

pub fn pid() -> u32 {
    std::process::id()
}

/// What one served connection did.
#[derive(Debug, Default)]
pub struct Served {
    pub op: char,
    pub up: u64,
    pub down: u64,
}

fn read_retry(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Serves one connection of the protocol above (blocking), then closes it.
pub fn serve(mut conn: TcpStream, timeout: Option<Duration>) -> io::Result<Served> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(timeout)?;
    conn.set_write_timeout(timeout)?;
    let mut op = [0u8; 1];
    if read_retry(&mut conn, &mut op)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "closed before the operation byte",
        ));
    }
    let mut buf = vec![0u8; 64 * 1024];
    let mut served = Served {
        op: op[0] as char,
        ..Served::default()
    };
    match op[0] {
        b'P' => {
            conn.write_all(b"p")?;
            while read_retry(&mut conn, &mut buf)? > 0 {}
            served.down = 1;
            return Ok(served);
        }
        b'E' => {
            let mut h = Sha256::new();
            loop {
                let n = read_retry(&mut conn, &mut buf)?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
                conn.write_all(&buf[..n])?;
                served.up += n as u64;
            }
            served.down = served.up;
            let d = h.hex();
            let t = format!(
                "digest up={d} n={} down={d} m={} pid={}\n",
                served.up,
                served.down,
                pid()
            );
            conn.write_all(t.as_bytes())?;
        }
        b'S' => {
            let mut line = Vec::new();
            loop {
                let mut b = [0u8; 1];
                if read_retry(&mut conn, &mut b)? == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "closed inside the S line",
                    ));
                }
                if b[0] == b'\n' {
                    break;
                }
                line.push(b[0]);
                if line.len() > 20 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "S line too long",
                    ));
                }
            }
            let m: usize = String::from_utf8_lossy(&line)
                .trim()
                .parse()
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad S count"))?;
            let mut w = conn.try_clone()?;
            let writer = std::thread::spawn(move || -> io::Result<String> {
                let data = pattern(SOURCE_SEED, m);
                for c in data.chunks(64 * 1024) {
                    w.write_all(c)?;
                }
                Ok(sha256_hex(&data))
            });
            let mut h = Sha256::new();
            let mut rd = Ok(());
            loop {
                match read_retry(&mut conn, &mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        h.update(&buf[..n]);
                        served.up += n as u64;
                    }
                    Err(e) => {
                        rd = Err(e);
                        break;
                    }
                }
            }
            let down = writer
                .join()
                .map_err(|_| io::Error::other("writer panicked"))??;
            rd?;
            served.down = m as u64;
            let t = format!(
                "digest up={} n={} down={down} m={m} pid={}\n",
                h.hex(),
                served.up,
                pid()
            );
            conn.write_all(t.as_bytes())?;
        }
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unknown operation byte {other:#04x}"),
            ))
        }
    }
    conn.shutdown(Shutdown::Write)?;
    Ok(served)
}

/// Appends one line to the event log (one write(2) with O_APPEND: lines of several
/// processes never interleave). Errors are ignored: the log is evidence, not control.
pub fn log_line(path: Option<&str>, line: &str) {
    let Some(path) = path else { return };
    if let Some(mut f) = KEPT_LOG.get() {
        let _ = f.write_all(format!("{line}\n").as_bytes());
        return;
    }
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

/// The event log, opened once by a process about to lose the right to open files.
static KEPT_LOG: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();

/// Keeps the event log at `path` open for [`log_line`] from now on.
#[allow(dead_code)] // not every example that shares this module needs it
pub fn keep_log_open(path: Option<&str>) {
    let f = path.and_then(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .ok()
    });
    if let Some(f) = f {
        let _ = KEPT_LOG.set(f);
    }
}

/// Writes `pid\n` to `path` (atomically: temp file + rename).
pub fn write_pidfile(path: Option<&str>) -> io::Result<()> {
    let Some(path) = path else { return Ok(()) };
    let tmp = format!("{path}.tmp{}", pid());
    std::fs::write(&tmp, format!("{}\n", pid()))?;
    std::fs::rename(tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_known() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let mut s = Sha256::new();
        for c in pattern(1, 100_000).chunks(77) {
            s.update(c);
        }
        assert_eq!(s.hex(), sha256_hex(&pattern(1, 100_000)));
    }
}
