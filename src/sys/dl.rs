//! The dynamic loader: what it knows about this image (where it was loaded from, which
//! loaded object defines a symbol first: the one the program's calls are bound to), and the
//! libraries the shim loads itself (librdmacm and libibverbs, `rdma/ffi.rs`).

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

/// The path of the loaded object that contains `addr`, as the loader has it.
pub fn path_of(addr: *const c_void) -> Option<String> {
    object_at(addr)?.path
}

/// The object this code was loaded in (librsock.so, when preloaded). A function's address
/// is taken here, never an exported symbol's: that could be another copy's.
pub fn this_object() -> Option<Object> {
    object_at(this_object as *const c_void)
}

/// The object that defines `name` first in the process's global lookup order — the one whose
/// definition the program's references are bound to — or `None` if none does.
pub fn first_definer(name: &CStr) -> Option<Object> {
    // SAFETY: RTLD_DEFAULT searches the global scope.
    let p = unsafe { symbol(libc::RTLD_DEFAULT, name) };
    if p.is_null() {
        return None;
    }
    object_at(p)
}

/// Loads the shared object `name` with `RTLD_NOW | RTLD_LOCAL` — its symbols stay out of the
/// global scope, so they never interpose on the program's — into the program's namespace
/// (`dlopen`), or into the link-map namespace `ns` (`dlmopen`; `LM_ID_NEWLM` makes a new
/// one). Its handle, or null if it could not be loaded.
pub fn open_local(name: &CStr, ns: Option<libc::Lmid_t>) -> *mut c_void {
    // SAFETY: `name` is NUL-terminated.
    unsafe {
        match ns {
            None => libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL),
            Some(ns) => libc::dlmopen(ns, name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL),
        }
    }
}

/// The link-map namespace a loaded object is in (`dlinfo(RTLD_DI_LMID)`), or `None`.
///
/// # Safety
/// `handle` is a live handle from [`open_local`].
pub unsafe fn namespace_of(handle: *mut c_void) -> Option<libc::Lmid_t> {
    let mut ns: libc::Lmid_t = 0;
    // SAFETY: a live handle (the contract) and an out-pointer of the type RTLD_DI_LMID writes.
    let r = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LMID,
            (&mut ns as *mut libc::Lmid_t).cast(),
        )
    };
    (r == 0).then_some(ns)
}

/// The address of the symbol `name` in the loaded object `handle` and the objects it loaded
/// (`dlsym`; `RTLD_DEFAULT` and `RTLD_NEXT` as there), or null if none defines it.
///
/// # Safety
/// `handle` is a live handle from [`open_local`], `RTLD_DEFAULT` or `RTLD_NEXT`.
pub unsafe fn symbol(handle: *mut c_void, name: &CStr) -> *mut c_void {
    libc::dlsym(handle, name.as_ptr())
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
