//! The doorbell mirror: what the program's fd (A) shows follows the protocol's readiness —
//! at once for hang-up and end of stream, for readable and writable while someone looks.

use super::{Inner, Port, Stream, WATCHED};
use std::sync::atomic::Ordering::*;

impl<P: Port> Stream<P> {
    /// The program polls A from now on (sticky): bring A up to date and keep it so. The
    /// program's hooked waits handle completions themselves (engine/program_waits.rs).
    pub fn watch(&self) {
        if !self.watched.swap(true, AcqRel) {
            WATCHED.fetch_add(1, AcqRel);
            self.with(|inner| self.show(inner));
        }
    }

    /// Another process may poll A from now on (a fork): as [`watch`](Self::watch), and the
    /// helper handles completions, since that process's waits are not this one's.
    pub fn share(&self) {
        if !self.shared.swap(true, AcqRel) {
            self.watch();
            self.with(|inner| self.update_demand(inner));
        }
    }

    /// Moves the doorbell to match the protocol state (edges only).
    pub(super) fn show(&self, inner: &mut Inner<P>) {
        if self.life().moved() {
            return; // the doorbell is the taker's
        }
        let p = &inner.proto;
        let now = p.readiness();
        // The strongest change goes first: a waiter woken by it must see the whole picture
        // at once (HUP implies RDHUP and IN), as the kernel sets these flags together.
        if now.hangup && !inner.shown.hangup {
            inner.shown.hangup = true;
            inner.shown.read_ended = true;
            log::trace!(
                "rdma stream {}: hang-up shown (state {:?})",
                self.peer,
                p.state()
            );
            self.bell.set_hangup();
        } else if now.read_ended && !inner.shown.read_ended {
            inner.shown.read_ended = true;
            log::trace!(
                "rdma stream {}: end of stream shown (state {:?})",
                self.peer,
                p.state()
            );
            self.bell.set_eof();
        }
        // Readable and writable change with every message: A follows them only while
        // someone can look (each change is a syscall). Hang-up and end of stream above are
        // shown at once — they happen once, and they must also wake a sleeping waiter.
        if inner.sleepers == 0 && !self.watched.load(Relaxed) {
            return;
        }
        if now.readable != inner.shown.readable {
            inner.shown.readable = now.readable;
            self.bell.set_readable(now.readable);
        }
        if now.writable != inner.shown.writable {
            inner.shown.writable = now.writable;
            self.bell.set_writable(now.writable);
        }
    }
}
