//! The fds a message carries (`SCM_RIGHTS`): the walk over the control messages in a
//! `msghdr`'s control buffer, for messages the kernel filled and messages about to be sent.

use libc::{c_int, cmsghdr, msghdr};

/// The fd slots of the `SCM_RIGHTS` control messages of a message, in order: each a pointer
/// into its control buffer, not aligned (read and write it with `read_unaligned` and
/// `write_unaligned`). Made by [`rights_slots`].
pub struct RightsSlots {
    msg: *const msghdr,
    h: *mut cmsghdr,
    next: usize,
}

/// The fd slots of the `SCM_RIGHTS` control messages in `msg`'s control buffer.
///
/// # Safety
/// `msg` points at a valid `msghdr` whose control buffer (`msg_control`, `msg_controllen`)
/// stays valid, its headers unchanged, while the slots are walked and used.
pub unsafe fn rights_slots(msg: *const msghdr) -> RightsSlots {
    RightsSlots {
        msg,
        h: libc::CMSG_FIRSTHDR(msg),
        next: 0,
    }
}

/// The fds in the `SCM_RIGHTS` control messages of `msg`, in order.
///
/// # Safety
/// As [`rights_slots`].
pub unsafe fn rights(msg: *const msghdr) -> impl Iterator<Item = c_int> {
    // SAFETY: each slot lies inside the control buffer, valid per the contract.
    rights_slots(msg).map(|slot| unsafe { std::ptr::read_unaligned(slot) })
}

impl Iterator for RightsSlots {
    type Item = *mut c_int;

    #[allow(clippy::unnecessary_cast)] // cmsg_len: size_t in glibc, socklen_t in musl
    fn next(&mut self) -> Option<*mut c_int> {
        // SAFETY: walking the control data of a valid message (`rights_slots`' contract); an
        // SCM_RIGHTS message carries (cmsg_len - CMSG_LEN(0)) / 4 ints.
        unsafe {
            while !self.h.is_null() {
                let h = self.h;
                if (*h).cmsg_level == libc::SOL_SOCKET && (*h).cmsg_type == libc::SCM_RIGHTS {
                    let count =
                        ((*h).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize) / 4;
                    if self.next < count {
                        self.next += 1;
                        return Some(libc::CMSG_DATA(h).cast::<c_int>().add(self.next - 1));
                    }
                }
                self.h = libc::CMSG_NXTHDR(self.msg, h);
                self.next = 0;
            }
        }
        None
    }
}
