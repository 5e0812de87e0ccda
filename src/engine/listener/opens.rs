//! The streams a link's peer opens, as a listener takes them: at once for a listener of this
//! process's own, when the program accepts for a branch (`branch.rs`), refused for one that
//! other processes accept through (a link's stream never moves).

use super::Listener;
use crate::engine::link::{self, Link, OpenTarget};
use crate::engine::{lock, Engine, Stream};
use crate::proto::link::record::{Open, RefuseReason};
use std::sync::Arc;

impl OpenTarget for Listener {
    fn has_room_for_link_stream(&self) -> bool {
        Listener::has_room_for_link_stream(self)
    }

    fn grants(&self) -> bool {
        !self.shared() && !self.is_branch()
    }

    fn push_stream(&self, s: Arc<Stream>) {
        Listener::push_stream(self, s)
    }
}

impl Engine {
    /// A link's peer asks for a stream of the listener the link came in on (on the poller):
    /// a branch's OPEN waits for its program's accept, as its connect requests do; a
    /// listener of this process's own answers at once; one other processes accept through
    /// refuses (a link's stream never moves: its clients come through rdma_cm, or a
    /// branch).
    pub(in crate::engine) fn link_open(&self, link: &Arc<Link>, open: Open) {
        let l = lock(&self.listeners).get(&link.listener_token()).cloned();
        match l {
            Some(l) if l.is_branch() && open.dest.port() == l.shown_port => {
                l.defer_open(self, link.clone(), open)
            }
            Some(l) if !l.is_branch() && open.dest.port() == link.dest.port() && !l.shared() => {
                link::accept_open(link, self, &*l, open)
            }
            _ => link::refuse_open(link, &open, RefuseReason::NotMine),
        }
    }
}
