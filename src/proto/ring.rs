//! Ring geometry: maps absolute stream positions onto offsets in a ring of any size, and copies
//! between a ring and caller slices, splitting at the wrap point.
//!
//! Positions are `u64` byte counts since connection start; they do not wrap in practice
//! (2^64 bytes), so ordering them needs no wrapping comparison. Only offsets wrap.

use std::io::{IoSlice, IoSliceMut};
use std::ops::Range;

/// A ring of `size` bytes (`size >= 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Ring {
    size: u32,
}

impl Ring {
    pub(crate) fn new(size: u32) -> Ring {
        assert!(size > 0, "ring size must be positive");
        Ring { size }
    }

    pub(crate) fn size(self) -> u32 {
        self.size
    }

    /// Offset of stream position `pos`.
    pub(crate) fn offset(self, pos: u64) -> u32 {
        // The remainder is < size, which is a u32.
        (pos % u64::from(self.size)) as u32
    }

    /// The offset `n <= size - offset` bytes after `offset`, wrapping to 0 at the end.
    pub(crate) fn advance(self, offset: u32, n: u32) -> u32 {
        debug_assert!(offset < self.size && n <= self.size - offset);
        let next = offset + n;
        if next == self.size {
            0
        } else {
            next
        }
    }

    /// Bytes from `pos` to the end of the ring, before the wrap.
    pub(crate) fn contiguous(self, pos: u64) -> u32 {
        self.size - self.offset(pos)
    }

    /// The one or two offset ranges holding `len` bytes from `pos`, in stream order (the
    /// second is empty unless the span wraps). `len` must not exceed the ring size.
    pub(crate) fn ranges(self, pos: u64, len: u64) -> [Range<usize>; 2] {
        debug_assert!(len <= u64::from(self.size));
        let start = self.offset(pos) as usize;
        let first = (len as usize).min(self.contiguous(pos) as usize);
        [start..start + first, 0..len as usize - first]
    }

    /// The one or two pieces of `buf` holding `len` bytes from `pos`, in stream order.
    ///
    /// `len` must not exceed the ring size; `buf` must be exactly the ring.
    pub(crate) fn slices(self, buf: &[u8], pos: u64, len: u64) -> (&[u8], &[u8]) {
        let [a, b] = self.ranges(pos, len);
        (&buf[a], &buf[b])
    }

    /// Copies `data` into `buf` starting at `pos`, wrapping once if needed.
    pub(crate) fn copy_in(self, buf: &mut [u8], pos: u64, data: &[u8]) {
        debug_assert!(data.len() <= self.size as usize);
        let start = self.offset(pos) as usize;
        let first = data.len().min(self.contiguous(pos) as usize);
        buf[start..start + first].copy_from_slice(&data[..first]);
        buf[..data.len() - first].copy_from_slice(&data[first..]);
    }
}

/// Copies from the concatenation of `src` pieces into the `dst` slices; returns bytes copied.
pub fn scatter(src: [&[u8]; 2], dst: &mut [IoSliceMut<'_>]) -> usize {
    let mut copied = 0;
    let mut pieces = src.into_iter().filter(|s| !s.is_empty());
    let mut cur: &[u8] = pieces.next().unwrap_or(&[]);
    for d in dst.iter_mut() {
        let mut d: &mut [u8] = d;
        while !d.is_empty() {
            if cur.is_empty() {
                match pieces.next() {
                    Some(next) => cur = next,
                    None => return copied,
                }
            }
            let n = d.len().min(cur.len());
            d[..n].copy_from_slice(&cur[..n]);
            d = &mut d[n..];
            cur = &cur[n..];
            copied += n;
        }
    }
    copied
}

/// Copies up to `limit` bytes from the `src` slices into `dst`'s pieces in order; returns
/// bytes copied (a driver's copy into [`Conn::write_with`](super::Conn::write_with)'s ranges).
pub fn gather(src: &[IoSlice<'_>], dst: [&mut [u8]; 2], limit: usize) -> usize {
    let mut copied = 0;
    let mut pieces = dst.into_iter().filter(|d| !d.is_empty());
    let mut cur: &mut [u8] = pieces.next().unwrap_or_default();
    for s in src {
        let mut s: &[u8] = s;
        while !s.is_empty() && copied < limit {
            if cur.is_empty() {
                match pieces.next() {
                    Some(next) => cur = next,
                    None => return copied,
                }
            }
            let n = s.len().min(cur.len()).min(limit - copied);
            let (head, tail) = std::mem::take(&mut cur).split_at_mut(n);
            head.copy_from_slice(&s[..n]);
            cur = tail;
            s = &s[n..];
            copied += n;
        }
    }
    copied
}

/// Copies up to `limit` bytes from the `src` slices into `ring` at `pos`; returns bytes copied.
pub(crate) fn gather_into(
    ring: Ring,
    buf: &mut [u8],
    mut pos: u64,
    src: &[IoSlice<'_>],
    limit: usize,
) -> usize {
    let mut copied = 0;
    for s in src {
        let n = s.len().min(limit - copied);
        ring.copy_in(buf, pos, &s[..n]);
        pos += n as u64;
        copied += n;
        if copied == limit {
            break;
        }
    }
    copied
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_wrap_at_odd_sizes() {
        let r = Ring::new(7);
        assert_eq!(r.offset(0), 0);
        assert_eq!(r.offset(6), 6);
        assert_eq!(r.offset(7), 0);
        assert_eq!(r.offset(u64::MAX), (u64::MAX % 7) as u32);
        assert_eq!(r.contiguous(5), 2);
    }

    #[test]
    fn copy_in_and_slices_wrap() {
        let r = Ring::new(5);
        let mut buf = [0u8; 5];
        r.copy_in(&mut buf, 13, b"abcd"); // offset 3
        assert_eq!(
            &buf,
            b"cdxab".map(|c| if c == b'x' { 0 } else { c }).as_slice()
        );
        let (a, b) = r.slices(&buf, 13, 4);
        assert_eq!((a, b), (&b"ab"[..], &b"cd"[..]));
    }

    #[test]
    fn scatter_across_pieces_and_slices() {
        let mut x = [0u8; 3];
        let mut y = [0u8; 4];
        let mut dst = [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)];
        assert_eq!(scatter([b"ab", b"cde"], &mut dst), 5);
        assert_eq!((&x, &y), (b"abc", b"de\0\0"));
    }

    #[test]
    fn gather_fills_both_pieces_in_order_up_to_the_limit() {
        let (mut x, mut y) = ([0u8; 3], [0u8; 4]);
        let src = [IoSlice::new(b"ab"), IoSlice::new(b"cdefg")];
        assert_eq!(gather(&src, [&mut x, &mut y], 6), 6);
        assert_eq!((&x, &y), (b"abc", b"def\0"));
        let (mut x, mut y) = ([0u8; 2], [0u8; 0]);
        assert_eq!(
            gather(&src, [&mut x, &mut y], 9),
            2,
            "no room past the pieces"
        );
    }

    #[test]
    fn gather_respects_limit() {
        let r = Ring::new(4);
        let mut buf = [0u8; 4];
        let src = [IoSlice::new(b"ab"), IoSlice::new(b"cdef")];
        assert_eq!(gather_into(r, &mut buf, 2, &src, 3), 3);
        assert_eq!(&buf, b"c\0ab");
    }
}
