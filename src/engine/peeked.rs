//! Bytes the program has seen with `MSG_PEEK`, kept so that the read that follows returns
//! the same bytes. A ring stays writable by its peer: without this copy a hostile peer
//! could rewrite announced bytes between the peek and the read.

use std::io::IoSliceMut;

/// The head of the unread stream, as first shown to the program (never longer than what
/// the protocol says is readable: it only grows by peeks of readable bytes).
#[derive(Default, Debug)]
pub(super) struct Peeked(Vec<u8>);

impl Peeked {
    /// A peek put the stream's next `n` bytes into `out`: bytes shown before are put back
    /// as they were shown, the rest are remembered.
    pub fn after_peek(&mut self, out: &mut [IoSliceMut<'_>], n: usize) {
        let old = self.0.len().min(n);
        copy_into(out, &self.0[..old]);
        let mut at = 0;
        for b in out.iter() {
            let (from, to) = (old.max(at), n.min(at + b.len()));
            if from < to {
                self.0.extend_from_slice(&b[from - at..to - at]);
            }
            at += b.len();
        }
    }

    /// A read consumed the stream's next `n` bytes into `out`: the ones shown by a peek
    /// are replaced by what the peek showed, and forgotten.
    pub fn after_read(&mut self, out: &mut [IoSliceMut<'_>], n: usize) {
        let k = self.0.len().min(n);
        if k > 0 {
            copy_into(out, &self.0[..k]);
            self.0.drain(..k);
        }
    }
}

impl Peeked {
    /// `n` bytes left the stream by another way (a relay): they are no longer the head.
    pub fn forget(&mut self, n: usize) {
        let k = self.0.len().min(n);
        self.0.drain(..k);
    }
}

/// Writes `src` at the start of `out` (which holds at least as many bytes).
fn copy_into(out: &mut [IoSliceMut<'_>], mut src: &[u8]) {
    for b in out.iter_mut() {
        if src.is_empty() {
            return;
        }
        let k = b.len().min(src.len());
        b[..k].copy_from_slice(&src[..k]);
        src = &src[k..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peek(p: &mut Peeked, stream: &[u8], lens: &[usize]) -> Vec<u8> {
        let mut bufs: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0; l]).collect();
        let n = stream.len().min(lens.iter().sum());
        let mut flat = stream[..n].iter();
        for b in bufs.iter_mut() {
            for x in b.iter_mut() {
                if let Some(&v) = flat.next() {
                    *x = v;
                }
            }
        }
        let mut io: Vec<IoSliceMut<'_>> = bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        p.after_peek(&mut io, n);
        bufs.concat()[..n].to_vec()
    }

    #[test]
    fn a_read_after_a_peek_returns_the_peeked_bytes_even_if_the_ring_changed() {
        let mut p = Peeked::default();
        assert_eq!(peek(&mut p, b"hello world", &[3, 4]), b"hello w");
        // The peer rewrote the ring: a longer peek shows the old head and the new tail.
        assert_eq!(peek(&mut p, b"HELLO WORLD", &[20]), b"hello wORLD");
        let mut a = [0u8; 4];
        let mut b = [0u8; 2];
        a.copy_from_slice(b"XXXX");
        b.copy_from_slice(b"XX");
        let mut io = [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)];
        p.after_read(&mut io, 6);
        assert_eq!((&a, &b), (b"hell", b"o "));
        let mut c = *b"ZZZZZZZ";
        p.after_read(&mut [IoSliceMut::new(&mut c)], 7);
        assert_eq!(
            &c, b"wORLDZZ",
            "the rest of what was shown, then fresh bytes"
        );
        assert!(p.0.is_empty());
    }

    #[test]
    fn nothing_peeked_changes_nothing() {
        let mut p = Peeked::default();
        let mut c = *b"abc";
        p.after_read(&mut [IoSliceMut::new(&mut c)], 3);
        assert_eq!(&c, b"abc");
    }
}
