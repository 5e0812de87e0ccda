//! What the dynamic loader knows about this image: where it was loaded from, and which
//! loaded object defines a symbol first (the one the program's calls are bound to).

use libc::c_void;
use std::ffi::CStr;

/// The symbol every copy of librsock.so exports (`preload/src/lib.rs`) so that copies can
/// tell which of them the loader put first.
pub const INSTANCE_SYMBOL: &CStr = c"rsock_shim_instance";

/// A loaded object (the main program or a shared library).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// Its load address: two copies of one library never share it.
    pub base: usize,
    /// The path it was loaded from, as the loader has it.
    pub path: Option<String>,
}

/// The object that contains `addr`.
fn object_at(addr: *const c_void) -> Option<Object> {
    // SAFETY: dladdr only reads `addr` as a number and fills `info` (or returns 0).
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(addr, &mut info) } == 0 {
        return None;
    }
    let path = (!info.dli_fname.is_null()).then(|| {
        // SAFETY: dli_fname is a NUL-terminated string that lives as long as the object.
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned()
    });
    Some(Object {
        base: info.dli_fbase as usize,
        path,
    })
}

/// The object this code was loaded in (librsock.so, when preloaded). A function's address
/// is taken here, never an exported symbol's: that could be another copy's.
pub fn this_object() -> Option<Object> {
    object_at(this_object as *const c_void)
}

/// The object that defines `name` first in the process's global lookup order — the one whose
/// definition the program's references are bound to — or `None` if none does.
pub fn first_definer(name: &CStr) -> Option<Object> {
    // SAFETY: `name` is NUL-terminated; RTLD_DEFAULT searches the global scope.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    object_at(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_found() {
        let me = this_object().expect("dladdr knows this test binary");
        assert_ne!(me.base, 0);
        // No librsock.so in a test binary: nothing defines the instance symbol.
        assert_eq!(first_definer(INSTANCE_SYMBOL), None);
        // libc defines `socket`: a loaded object other than this binary.
        let libc = first_definer(c"socket").expect("libc defines socket");
        assert_ne!(libc.base, me.base);
        assert!(libc.path.is_some_and(|p| p.contains("libc")));
    }
}
