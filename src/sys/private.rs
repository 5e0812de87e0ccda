//! Files only this process's user controls: the stats region and the log `rsock log` turns
//! on. Both live in a directory (`/dev/shm/rsock-<uid>` by default) that another local user
//! could make first; a symlink or hard link planted where the shim creates its file would
//! make a root process truncate, map or append to any file, and a file of theirs would let
//! them write into our region. So the directory must be ours (or root's) and closed to
//! others (or sticky), and the file is opened without following links and checked to be a
//! regular file of ours with one link.

use std::ffi::CStr;
use std::io;

/// An fd of the shim's, closed straight to the kernel when dropped (never through the
/// program's hooked `close`).
#[derive(Debug)]
pub struct Fd(libc::c_int);

impl Fd {
    /// The fd number, still owned by this value.
    pub fn as_raw_fd(&self) -> libc::c_int {
        self.0
    }

    /// Makes the file `len` bytes long (`ftruncate(2)`): cut, or extended with zeros.
    pub fn set_len(&self, len: libc::off_t) -> io::Result<()> {
        // SAFETY: no pointers; the fd is ours.
        if unsafe { libc::ftruncate(self.0, len) } != 0 {
            return Err(last());
        }
        Ok(())
    }
}

impl Drop for Fd {
    fn drop(&mut self) {
        super::raw::close(self.0);
    }
}

fn last() -> io::Error {
    io::Error::last_os_error()
}

fn fstat(fd: libc::c_int) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(last());
    }
    Ok(st)
}

fn refused(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why.to_string())
}

/// Makes `dir` (mode 0700) if it is missing and opens it, refusing one that another user
/// could plant entries in: not owned by our effective uid or root, or writable by group or
/// others without the sticky bit.
pub fn private_dir(dir: &CStr) -> io::Result<Fd> {
    // SAFETY: NUL-terminated path. EEXIST is fine: checked below.
    unsafe { libc::mkdir(dir.as_ptr(), 0o700) };
    // SAFETY: NUL-terminated path; the fd is ours.
    let fd = unsafe {
        libc::open(
            dir.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(last());
    }
    let fd = Fd(fd);
    let st = fstat(fd.as_raw_fd())?;
    // SAFETY: cannot fail.
    let me = unsafe { libc::geteuid() };
    if st.st_uid != me && st.st_uid != 0 {
        return Err(refused("the directory belongs to another user"));
    }
    if st.st_mode & 0o022 != 0 && st.st_mode & libc::S_ISVTX == 0 {
        return Err(refused(
            "others may write in the directory and it is not sticky",
        ));
    }
    Ok(fd)
}

/// `fd` is a regular file of our effective uid with one link (no other name reaches it).
pub fn is_own_file(fd: libc::c_int) -> bool {
    // SAFETY: cannot fail.
    let me = unsafe { libc::geteuid() };
    fstat(fd).is_ok_and(|st| {
        st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == me && st.st_nlink == 1
    })
}

/// Opens `name` in `dir` read-write or append (`flags`), created with `mode` if missing,
/// never through a symlink, and only as a regular file of ours with one link; one that is
/// not ours is removed and made anew (which fails where we may not remove it).
pub fn open_private(
    dir: &Fd,
    name: &CStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<Fd> {
    for _ in 0..2 {
        // SAFETY: valid dir fd, NUL-terminated name; the fd is ours.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                flags | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            let e = last();
            if e.raw_os_error() != Some(libc::ELOOP) {
                return Err(e);
            }
        } else {
            let fd = Fd(fd);
            if is_own_file(fd.as_raw_fd()) {
                return Ok(fd);
            }
        }
        // A symlink, a link to another file, or another user's file: not ours to use.
        // SAFETY: valid dir fd, NUL-terminated name.
        if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } != 0 {
            return Err(refused("a file of another user, or a link, is in the way"));
        }
    }
    Err(refused("a file of another user, or a link, is in the way"))
}

/// Removes the name `path` (`unlink(2)`), if it can.
pub fn remove(path: &CStr) {
    // SAFETY: a NUL-terminated path.
    unsafe { libc::unlink(path.as_ptr()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::unix::fs::PermissionsExt;

    fn temp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("rsock-private-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn c(p: &std::path::Path) -> CString {
        CString::new(p.to_str().unwrap()).unwrap()
    }

    #[test]
    fn makes_a_closed_directory_and_refuses_an_open_one() {
        let d = temp("dir");
        private_dir(&c(&d)).unwrap();
        let mode = std::fs::metadata(&d).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_dir(&c(&d)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        private_dir(&c(&d)).expect("sticky: others cannot replace our files");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn never_writes_through_a_planted_link() {
        let d = temp("file");
        let dir = private_dir(&c(&d)).unwrap();
        let victim = d.with_extension("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, d.join("1.stats")).unwrap();
        std::fs::hard_link(&victim, d.join("2.stats")).unwrap();
        for name in ["1.stats", "2.stats"] {
            let name = CString::new(name).unwrap();
            let f = open_private(&dir, &name, libc::O_RDWR, 0o600).unwrap();
            // SAFETY: our fd.
            assert_eq!(unsafe { libc::ftruncate(f.as_raw_fd(), 0) }, 0);
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let meta = std::fs::symlink_metadata(d.join("1.stats")).unwrap();
        assert!(
            meta.file_type().is_file(),
            "the link was replaced by our own file"
        );
        std::fs::remove_file(victim).unwrap();
        std::fs::remove_dir_all(d).unwrap();
    }
}
