//! errno names, for what operators read (`rsock stat`, the log).
//!
//! A table, not glibc's `strerrorname_np`: that exists only since glibc 2.32, and the shim
//! must load on older ones.

/// The symbolic name of `errno` ("ECONNREFUSED"), or "errno N" for one not listed.
pub fn errno_name(errno: i32) -> std::borrow::Cow<'static, str> {
    use libc::*;
    let name = match errno {
        EPERM => "EPERM",
        ENOENT => "ENOENT",
        EINTR => "EINTR",
        EIO => "EIO",
        ENXIO => "ENXIO",
        EBADF => "EBADF",
        EAGAIN => "EAGAIN",
        ENOMEM => "ENOMEM",
        EACCES => "EACCES",
        EFAULT => "EFAULT",
        EBUSY => "EBUSY",
        EEXIST => "EEXIST",
        ENODEV => "ENODEV",
        EINVAL => "EINVAL",
        ENFILE => "ENFILE",
        EMFILE => "EMFILE",
        ENOSPC => "ENOSPC",
        EPIPE => "EPIPE",
        ENOSYS => "ENOSYS",
        ENODATA => "ENODATA",
        EPROTO => "EPROTO",
        EOVERFLOW => "EOVERFLOW",
        ENOTSOCK => "ENOTSOCK",
        EPROTONOSUPPORT => "EPROTONOSUPPORT",
        EOPNOTSUPP => "EOPNOTSUPP",
        EAFNOSUPPORT => "EAFNOSUPPORT",
        EADDRINUSE => "EADDRINUSE",
        EADDRNOTAVAIL => "EADDRNOTAVAIL",
        ENETDOWN => "ENETDOWN",
        ENETUNREACH => "ENETUNREACH",
        ECONNABORTED => "ECONNABORTED",
        ECONNRESET => "ECONNRESET",
        ENOBUFS => "ENOBUFS",
        EISCONN => "EISCONN",
        ENOTCONN => "ENOTCONN",
        ETIMEDOUT => "ETIMEDOUT",
        ECONNREFUSED => "ECONNREFUSED",
        EHOSTDOWN => "EHOSTDOWN",
        EHOSTUNREACH => "EHOSTUNREACH",
        EALREADY => "EALREADY",
        EINPROGRESS => "EINPROGRESS",
        _ => return format!("errno {errno}").into(),
    };
    name.into()
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_and_numbers() {
        assert_eq!(super::errno_name(libc::ECONNREFUSED), "ECONNREFUSED");
        assert_eq!(super::errno_name(4095), "errno 4095");
    }
}
