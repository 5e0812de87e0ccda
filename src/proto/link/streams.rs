//! The stream table of one end of a link: which of this end's stream ids are in use, what
//! the peer calls each stream, and when an id may be used again (PROTOCOL.md §14).
//!
//! Each end names a stream by an id of its own; the immediates it receives carry its id, the
//! ones it sends the peer's. An id goes through
//!
//! ```text
//! Free -> Opening (we sent OPEN) -> Open (ACCEPT came) -> Closing -> Free
//!      \                       \-> Free (REFUSE came)
//!      |-> Open (the peer's OPEN, we ACCEPT; or we OPEN a stream the peer granted)
//!       -> Granted (we sent GRANT) -> Open (the peer's OPEN took it)
//! ```
//!
//! An id is free again only once both ends said CLOSE for it: the peer's CLOSE proves it
//! sends nothing more naming the stream (RC delivers its earlier immediates first), ours that
//! we send nothing more. Reusing it earlier would hand a late credit of the old stream to a
//! new one. Records and immediates of an id in the wrong state are the peer breaking the
//! protocol: the link fails, with every stream on it.
//!
//! Only ids: the connections, rings and records are the driver's (and `Conn`'s, `Slots`',
//! `record`'s). Nothing here allocates per operation beyond the table's growth.

use super::imm::{StreamId, MAX_STREAM};
use core::fmt;

/// Where one of this end's ids stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Entry {
    Free,
    /// We sent OPEN with this id; no answer yet.
    Opening,
    /// We granted the peer a stream with this id (GRANT); its OPEN takes it.
    Granted,
    /// Both ends know the stream: the peer calls it `theirs`.
    Open {
        theirs: StreamId,
    },
    /// The stream is over at one end or both; the id waits for the other CLOSE.
    Closing {
        theirs: StreamId,
        /// We sent our CLOSE.
        sent: bool,
        /// The peer's CLOSE came.
        got: bool,
    },
}

/// The peer broke the link's protocol (the whole link fails).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkError {
    /// An ACCEPT or REFUSE for an id we are not opening.
    NotOpening(u16),
    /// A CLOSE, or an immediate, for an id that is not open (or whose peer already closed).
    NotOpen(u16),
    /// A CLOSE whose ids do not match the stream's.
    WrongPeerId {
        /// Our id it named.
        mine: u16,
        /// The peer's id it named, which is not the stream's.
        theirs: u16,
    },
    /// The peer opened or accepted with the control stream's id 0.
    ControlId,
    /// The peer opened with an id it already uses for another open stream.
    DuplicateOpen(u16),
    /// The peer's OPEN took an id of ours we did not grant (or granted and saw taken).
    NotGranted(u16),
    /// The peer granted an id it already granted, or still uses for a stream with us.
    DuplicateGrant(u16),
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkError::NotOpening(id) => write!(f, "answer for stream {id}, which is not opening"),
            LinkError::NotOpen(id) => write!(f, "message for stream {id}, which is not open"),
            LinkError::WrongPeerId { mine, theirs } => {
                write!(
                    f,
                    "close of stream {mine} names the peer's id {theirs} wrongly"
                )
            }
            LinkError::ControlId => f.write_str("stream id 0 (the control stream) opened"),
            LinkError::DuplicateOpen(id) => write!(f, "the peer opened its stream {id} twice"),
            LinkError::NotGranted(id) => write!(f, "the peer took stream {id}, not granted"),
            LinkError::DuplicateGrant(id) => write!(f, "the peer granted its stream {id} twice"),
        }
    }
}

impl std::error::Error for LinkError {}

/// Why no id could be given out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NoId {
    /// Every id of the link (or of the table's bound) is in use: open another link.
    Exhausted,
    /// The link is closing (GOODBYE sent or received): open another link.
    Closing,
}

/// One end's stream table.
#[derive(Debug, Clone, Hash)]
pub struct Streams {
    /// Entry `i` is id `i + 1`.
    entries: Vec<Entry>,
    /// Highest id this table gives out.
    max: u16,
    /// Ids in use (not free).
    in_use: usize,
    /// Lowest id that may be free (a search hint).
    hint: usize,
    goodbye: bool,
}

impl Streams {
    /// A table giving out ids `1..=max` (at most [`MAX_STREAM`]).
    pub fn new(max: u16) -> Streams {
        Streams {
            entries: Vec::new(),
            max: max.min(MAX_STREAM),
            in_use: 0,
            hint: 0,
            goodbye: false,
        }
    }

    /// An id for a stream we open (we then send OPEN with it).
    pub fn open(&mut self) -> Result<StreamId, NoId> {
        if self.goodbye {
            return Err(NoId::Closing);
        }
        let id = self.take_free().ok_or(NoId::Exhausted)?;
        *self.entry_mut(id) = Entry::Opening;
        Ok(id)
    }

    /// The peer opened its stream `theirs`: our id for it (we then answer ACCEPT), or why
    /// not (we then answer REFUSE and nothing changes). `Err(Err(_))` is the peer breaking
    /// the protocol.
    pub fn on_open(&mut self, theirs: StreamId) -> Result<Result<StreamId, NoId>, LinkError> {
        if theirs.get() == 0 {
            return Err(LinkError::ControlId);
        }
        // The peer may reuse its id only after our CLOSE reached it; an id it still has
        // open or half-closed with us is a broken peer.
        if self.uses_theirs(theirs) {
            return Err(LinkError::DuplicateOpen(theirs.get()));
        }
        if self.goodbye {
            return Ok(Err(NoId::Closing));
        }
        let Some(mine) = self.take_free() else {
            return Ok(Err(NoId::Exhausted));
        };
        *self.entry_mut(mine) = Entry::Open { theirs };
        Ok(Ok(mine))
    }

    /// An id to grant the peer (we then send GRANT with it): its OPEN will take it.
    pub fn grant(&mut self) -> Result<StreamId, NoId> {
        if self.goodbye {
            return Err(NoId::Closing);
        }
        let id = self.take_free().ok_or(NoId::Exhausted)?;
        *self.entry_mut(id) = Entry::Granted;
        Ok(id)
    }

    /// An id for a stream we open on the peer's grant of its stream `theirs` (we then send
    /// OPEN naming both): open at once, no answer comes.
    pub fn open_granted(&mut self, theirs: StreamId) -> Result<StreamId, NoId> {
        if self.goodbye {
            return Err(NoId::Closing);
        }
        let id = self.take_free().ok_or(NoId::Exhausted)?;
        *self.entry_mut(id) = Entry::Open { theirs };
        Ok(id)
    }

    /// The peer's OPEN of its stream `theirs` took our granted `mine`: open at both ends.
    pub fn on_open_granted(&mut self, theirs: StreamId, mine: StreamId) -> Result<(), LinkError> {
        if theirs.get() == 0 {
            return Err(LinkError::ControlId);
        }
        if self.uses_theirs(theirs) {
            return Err(LinkError::DuplicateOpen(theirs.get()));
        }
        match self.get(mine) {
            Some(Entry::Granted) => {
                *self.entry_mut(mine) = Entry::Open { theirs };
                Ok(())
            }
            _ => Err(LinkError::NotGranted(mine.get())),
        }
    }

    /// The peer accepted our stream `mine`, calling it `theirs`.
    pub fn on_accept(&mut self, mine: StreamId, theirs: StreamId) -> Result<(), LinkError> {
        if theirs.get() == 0 {
            return Err(LinkError::ControlId);
        }
        match self.get(mine) {
            Some(Entry::Opening) => {
                *self.entry_mut(mine) = Entry::Open { theirs };
                Ok(())
            }
            _ => Err(LinkError::NotOpening(mine.get())),
        }
    }

    /// The peer refused our stream `mine`: the id is free again at once (the peer never
    /// named it).
    pub fn on_refuse(&mut self, mine: StreamId) -> Result<(), LinkError> {
        match self.get(mine) {
            Some(Entry::Opening) => {
                self.release(mine);
                Ok(())
            }
            _ => Err(LinkError::NotOpening(mine.get())),
        }
    }

    /// We are done with stream `mine` (both FINs passed and our output is acknowledged, or
    /// it was reset): the peer's id, to send CLOSE with. `None` if it is not open here (a
    /// second close, or an id we never opened: nothing to send).
    pub fn close(&mut self, mine: StreamId) -> Option<StreamId> {
        let theirs = self.theirs_before_our_close(mine)?;
        let got = matches!(self.get(mine), Some(Entry::Closing { got: true, .. }));
        if got {
            self.release(mine);
        } else {
            *self.entry_mut(mine) = Entry::Closing {
                theirs,
                sent: true,
                got: false,
            };
        }
        Some(theirs)
    }

    /// The peer's CLOSE: its stream `theirs`, our `mine`. It sends nothing more for it.
    pub fn on_close(&mut self, theirs: StreamId, mine: StreamId) -> Result<(), LinkError> {
        let (t, sent) = match self.get(mine) {
            Some(Entry::Open { theirs: t }) => (t, false),
            Some(Entry::Closing {
                theirs: t,
                sent,
                got: false,
            }) => (t, sent),
            _ => return Err(LinkError::NotOpen(mine.get())),
        };
        if t != theirs {
            return Err(LinkError::WrongPeerId {
                mine: mine.get(),
                theirs: theirs.get(),
            });
        }
        if sent {
            self.release(mine);
        } else {
            *self.entry_mut(mine) = Entry::Closing {
                theirs,
                sent: false,
                got: true,
            };
        }
        Ok(())
    }

    /// Whether an immediate naming our id `mine` may arrive: the stream is open and the
    /// peer has not closed it (the control stream always).
    pub fn accepts_input(&self, mine: StreamId) -> Result<(), LinkError> {
        match self.get(mine) {
            _ if mine.get() == 0 => Ok(()),
            Some(Entry::Open { .. }) | Some(Entry::Closing { got: false, .. }) => Ok(()),
            _ => Err(LinkError::NotOpen(mine.get())),
        }
    }

    /// The peer's id of our stream `mine`, while it may still be sent to.
    pub fn theirs(&self, mine: StreamId) -> Option<StreamId> {
        match self.get(mine)? {
            Entry::Open { theirs } | Entry::Closing { theirs, .. } => Some(theirs),
            _ => None,
        }
    }

    /// The peer's id of our stream `mine` while we have not sent its CLOSE: a record about
    /// the stream (GROW) may still go.
    pub fn theirs_before_our_close(&self, mine: StreamId) -> Option<StreamId> {
        match self.get(mine)? {
            Entry::Open { theirs }
            | Entry::Closing {
                theirs,
                sent: false,
                ..
            } => Some(theirs),
            _ => None,
        }
    }

    /// Whether the peer's id `theirs` names a stream it may still send for (open, or not
    /// yet closed at both ends). A linear scan: opens are rare next to messages.
    pub fn uses_theirs(&self, theirs: StreamId) -> bool {
        self.entries.iter().any(|e| live_theirs(e) == Some(theirs))
    }

    /// Whether GOODBYE was sent or received.
    pub fn saying_goodbye(&self) -> bool {
        self.goodbye
    }

    /// GOODBYE sent or received: no new stream from now on, either way.
    pub fn say_goodbye(&mut self) {
        self.goodbye = true;
    }

    /// The most ids in use at once.
    pub fn max(&self) -> u16 {
        self.max
    }

    /// Ids in use: opening, open or waiting for a CLOSE.
    pub fn in_use(&self) -> usize {
        self.in_use
    }

    /// Nothing in use: the link may go.
    pub fn is_idle(&self) -> bool {
        self.in_use == 0
    }

    fn get(&self, id: StreamId) -> Option<Entry> {
        let i = usize::from(id.get()).checked_sub(1)?;
        Some(self.entries.get(i).copied().unwrap_or(Entry::Free))
    }

    /// The entry of an id `take_free` gave out (so it exists).
    fn entry_mut(&mut self, id: StreamId) -> &mut Entry {
        let i = usize::from(id.get()) - 1;
        &mut self.entries[i]
    }

    /// The lowest free id, marked in use (its entry is set by the caller).
    fn take_free(&mut self) -> Option<StreamId> {
        let i = match self.entries[self.hint..]
            .iter()
            .position(|e| *e == Entry::Free)
        {
            Some(k) => self.hint + k,
            None if self.entries.len() < usize::from(self.max) => {
                self.entries.push(Entry::Free);
                self.entries.len() - 1
            }
            None => return None,
        };
        self.hint = i + 1;
        self.in_use += 1;
        // i < max <= MAX_STREAM, so i + 1 is an id.
        StreamId::new(i as u16 + 1)
    }

    fn release(&mut self, id: StreamId) {
        let i = usize::from(id.get()) - 1;
        self.entries[i] = Entry::Free;
        self.in_use -= 1;
        self.hint = self.hint.min(i);
    }
}

/// The peer's id of an entry the peer may still send for.
fn live_theirs(e: &Entry) -> Option<StreamId> {
    match *e {
        Entry::Open { theirs } | Entry::Closing { theirs, .. } => Some(theirs),
        _ => None,
    }
}
