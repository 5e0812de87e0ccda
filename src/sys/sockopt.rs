//! Reading a socket option of a kernel socket, straight to the kernel (getsockopt is
//! hooked).

use libc::c_int;

/// Option `name` at `level` of socket `fd` as a `T` (`init` gives its type and its bytes
/// where the kernel writes fewer); `None` if the kernel refuses.
pub fn get<T: Copy>(fd: c_int, level: c_int, name: c_int, init: T) -> Option<T> {
    let mut v = init;
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `v` is a plain value of `len` bytes; the kernel writes at most `len`.
    let r =
        unsafe { super::real::getsockopt(fd, level, name, (&mut v as *mut T).cast(), &mut len) };
    (r == 0).then_some(v)
}
