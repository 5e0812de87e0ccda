//! The lazily loaded librdmacm / libibverbs function table.
//!
//! librsock.so is preloaded into every process, including on hosts without rdma-core, so
//! it must not have librdmacm or libibverbs as load-time dependencies (no `DT_NEEDED`).
//! rdma-sys supplies only types, constants and struct layouts; every exported function is
//! reached through a pointer that [`lib`] resolves with `dlopen` + `dlsym` on first use
//! (never from a constructor). The data-path verbs (`ibv_post_send`, `ibv_post_recv`,
//! `ibv_poll_cq`, `ibv_req_notify_cq`) are `static inline` in C: rdma-sys re-implements
//! them through the context ops table (`(*(*qp).context).ops.post_send`), so they need
//! no symbol at all and are called straight from rdma-sys.
//!
//! Loading takes no lock: racing first users may each `dlopen` (reference counted, so
//! harmless) and the first to publish wins; a failure is remembered so later calls cost
//! one atomic load.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

use libc::sockaddr;
use rdma_sys::{
    ibv_comp_channel, ibv_context, ibv_cq, ibv_device_attr, ibv_mr, ibv_pd, ibv_qp, ibv_qp_attr,
    ibv_qp_init_attr, ibv_wc_status, rdma_cm_event, rdma_cm_event_type, rdma_cm_id,
    rdma_conn_param, rdma_event_channel, rdma_port_space,
};

use super::error::{Error, Reason};
use crate::sys::dl;

/// Shared object names tried, in order (the versioned SONAME first: the unversioned
/// name exists only where the -dev package is installed).
const RDMACM_NAMES: [&CStr; 2] = [c"librdmacm.so.1", c"librdmacm.so"];
const IBVERBS_NAMES: [&CStr; 2] = [c"libibverbs.so.1", c"libibverbs.so"];

macro_rules! fn_table {
    ($( $lib:ident $name:ident ( $($arg:ident : $ty:ty),* ) $(-> $ret:ty)? ; )*) => {
        /// Entry points of librdmacm and libibverbs, resolved by [`lib`].
        ///
        /// Each field is the C function of the same name; calling one is `unsafe` with the
        /// C function's own contract (see rdma_cm(7), ibv_*(3)).
        #[allow(missing_docs)]
        pub struct Lib {
            $( pub $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?, )*
        }

        impl Lib {
            /// Resolves every symbol; `rdmacm` and `ibverbs` are `dlopen` handles.
            fn resolve(rdmacm: *mut c_void, ibverbs: *mut c_void) -> Result<Lib, Error> {
                Ok(Lib {
                    $( $name: {
                        let handle = fn_table!(@handle $lib, rdmacm, ibverbs);
                        let name = concat!(stringify!($name), "\0");
                        // SAFETY: `handle` is a live dlopen handle; `name` is an identifier
                        // and one NUL.
                        let p = unsafe {
                            dl::symbol(handle, CStr::from_bytes_with_nul_unchecked(name.as_bytes()))
                        };
                        if p.is_null() {
                            return Err(Error::new("dlsym", libc::ENOSYS, Reason::NoRdma));
                        }
                        // SAFETY: the symbol is the C function of that name, whose
                        // prototype (from rdma-core's headers, via rdma-sys) is the
                        // field's type; fn pointers and data pointers have the same size.
                        unsafe {
                            std::mem::transmute::<*mut c_void,
                                unsafe extern "C" fn($($ty),*) $(-> $ret)?>(p)
                        }
                    }, )*
                })
            }
        }
    };
    (@handle cm, $cm:ident, $v:ident) => { $cm };
    (@handle verbs, $cm:ident, $v:ident) => { $v };
}

fn_table! {
    cm rdma_create_event_channel() -> *mut rdma_event_channel;
    cm rdma_destroy_event_channel(channel: *mut rdma_event_channel);
    cm rdma_create_id(channel: *mut rdma_event_channel, id: *mut *mut rdma_cm_id,
                      context: *mut c_void, ps: rdma_port_space::Type) -> c_int;
    cm rdma_destroy_id(id: *mut rdma_cm_id) -> c_int;
    cm rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int;
    cm rdma_resolve_addr(id: *mut rdma_cm_id, src: *mut sockaddr, dst: *mut sockaddr,
                         timeout_ms: c_int) -> c_int;
    cm rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int;
    cm rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int;
    cm rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int;
    cm rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int;
    cm rdma_reject(id: *mut rdma_cm_id, private_data: *const c_void, len: u8) -> c_int;
    cm rdma_disconnect(id: *mut rdma_cm_id) -> c_int;
    cm rdma_get_cm_event(channel: *mut rdma_event_channel,
                         event: *mut *mut rdma_cm_event) -> c_int;
    cm rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int;
    cm rdma_create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd,
                      attr: *mut ibv_qp_init_attr) -> c_int;
    cm rdma_destroy_qp(id: *mut rdma_cm_id);
    cm rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int;
    cm rdma_set_option(id: *mut rdma_cm_id, level: c_int, optname: c_int, optval: *mut c_void,
                       optlen: usize) -> c_int;
    cm rdma_event_str(event: rdma_cm_event_type::Type) -> *const c_char;
    verbs ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
    verbs ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;
    verbs ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int;
    verbs ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel;
    verbs ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int;
    verbs ibv_create_cq(context: *mut ibv_context, cqe: c_int, cq_context: *mut c_void,
                        channel: *mut ibv_comp_channel, comp_vector: c_int) -> *mut ibv_cq;
    verbs ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    verbs ibv_get_cq_event(channel: *mut ibv_comp_channel, cq: *mut *mut ibv_cq,
                           cq_context: *mut *mut c_void) -> c_int;
    verbs ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint);
    verbs ibv_reg_mr_iova(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64,
                          access: c_int) -> *mut ibv_mr;
    verbs ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
    verbs ibv_get_async_event(context: *mut ibv_context, event: *mut c_void) -> c_int;
    verbs ibv_ack_async_event(event: *mut c_void);
    verbs ibv_query_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int,
                       init_attr: *mut ibv_qp_init_attr) -> c_int;
    verbs ibv_wc_status_str(status: ibv_wc_status::Type) -> *const c_char;
    verbs ibv_fork_init() -> c_int;
}

/// `rdma_set_option` level of the id's own options (rdma_cma.h, an unnamed enum bindgen
/// does not export).
pub const RDMA_OPTION_ID: c_int = 0;
/// `RDMA_OPTION_ID` option: an int, like `IPV6_V6ONLY` for an IPv6 wildcard listener.
pub const RDMA_OPTION_ID_AFONLY: c_int = 2;

/// Published table (a leaked `Box<Lib>`), or null while not loaded.
static LIB: AtomicPtr<Lib> = AtomicPtr::new(std::ptr::null_mut());
/// 0 = not tried (or not yet failed); else the errno of the remembered failure.
static LOAD_ERRNO: AtomicI32 = AtomicI32::new(0);
/// The process that loaded the published table. A fork child must not use its parent's
/// instance of the libraries (their globals hold device contexts the kernel refuses to a
/// child): it loads its own, in a new link-map namespace.
static LIB_PID: AtomicI32 = AtomicI32::new(0);
/// `__errno_location` of the namespace's own libc when the libraries were loaded fresh (they
/// set that errno, not the program's); null otherwise.
static NS_ERRNO: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// errno as the RDMA libraries left it after a failed call: read it right after the call.
pub fn errno() -> c_int {
    let f = NS_ERRNO.load(Ordering::Acquire);
    if f.is_null() {
        return crate::sys::raw::errno();
    }
    // SAFETY: `f` is the namespace libc's `__errno_location`, which returns the calling
    // thread's errno slot in that libc.
    unsafe { *std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> *mut c_int>(f)() }
}

/// The function table, loading librdmacm and libibverbs on first use.
///
/// Fails with [`Reason::NoRdma`] (errno `ENOENT` for a missing library, `ENOSYS` for a
/// missing symbol) without crashing; the failure is cached for the life of the process.
/// Safe to call with the shim's reentrancy guard held: it takes no lock and starts no
/// thread (the libraries' own constructors run inside `dlopen`).
pub fn lib() -> Result<&'static Lib, Error> {
    let me = crate::sys::raw::pid();
    let p = LIB.load(Ordering::Acquire);
    let inherited = !p.is_null() && LIB_PID.load(Ordering::Acquire) != me;
    if !p.is_null() && !inherited {
        // SAFETY: a published pointer comes from `Box::leak` below and is never freed.
        return Ok(unsafe { &*p });
    }
    let e = LOAD_ERRNO.load(Ordering::Relaxed);
    if e != 0 && !inherited {
        return Err(Error::new("dlopen", e, Reason::NoRdma));
    }
    if inherited {
        if let Some(lib) = take_spare(p, me) {
            return Ok(lib);
        }
    }
    match load(inherited) {
        Ok((lib, ns_errno)) => {
            let new = Box::into_raw(Box::new(lib));
            match LIB.compare_exchange(p, new, Ordering::AcqRel, Ordering::Acquire) {
                // SAFETY: we just published `new`; it lives for the process.
                Ok(_) => {
                    if inherited {
                        NS_ERRNO.store(ns_errno, Ordering::Release);
                    }
                    LIB_PID.store(me, Ordering::Release);
                    Ok(unsafe { &*new })
                }
                Err(winner) => {
                    // SAFETY: `new` was never published; `winner` was, and is never freed.
                    unsafe {
                        drop(Box::from_raw(new));
                        Ok(&*winner)
                    }
                }
            }
        }
        Err(err) => {
            LOAD_ERRNO.store(err.errno(), Ordering::Relaxed);
            Err(err)
        }
    }
}

/// A started instance of the libraries nobody uses, for fork children (see [`prepare_spare`]).
static SPARE: AtomicPtr<Lib> = AtomicPtr::new(std::ptr::null_mut());
/// Its namespace's `__errno_location`.
static SPARE_ERRNO: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
/// The process that made it: its children may take it, it may not.
static SPARE_PID: AtomicI32 = AtomicI32::new(0);
/// The process that tried to make one (a fork child inherits its parent's pid here).
static SPARE_TRIED: AtomicI32 = AtomicI32::new(0);

/// In a process about to fork with RDMA sockets its children may take over: loads and
/// starts (an event channel made and destroyed) an instance of the libraries in a new
/// namespace, and leaves it unused. Each child inherits it ready, with nothing of it open,
/// and takes it as its own ([`lib`]) instead of loading one: in the test bed that is 2 ms
/// instead of about 55 (docs/DESIGN.md, "Fork hand-over"). Once per process; call in the
/// fork's prepare handler, so no load is half done at the fork.
pub fn prepare_spare() {
    let me = crate::sys::raw::pid();
    if SPARE_TRIED.swap(me, Ordering::AcqRel) == me {
        return; // made, or could not be: once per process (each try costs a namespace)
    }
    // What the libraries open and keep open would be shared by every child (a device
    // context of this process's in theirs): such an instance is no spare (rdma-core older
    // than its lazy device opening does so at its start).
    let before = crate::sys::process::fds_open_under("/dev/infiniband/");
    let Ok((lib, ns_errno)) = load(true) else {
        return; // the child loads its own, as without a spare
    };
    // SAFETY: functions of the instance just loaded; the channel is destroyed at once.
    let started = unsafe {
        let ch = (lib.rdma_create_event_channel)();
        if !ch.is_null() {
            (lib.rdma_destroy_event_channel)(ch);
        }
        !ch.is_null()
    };
    let kept = crate::sys::process::fds_open_under("/dev/infiniband/")
        .into_iter()
        .any(|f| !before.contains(&f));
    if !started || kept {
        log::debug!("RDMA libraries: no instance made ready for fork children (started {started}, files kept open {kept})");
        return; // its namespace stays loaded, unused
    }
    SPARE_ERRNO.store(ns_errno, Ordering::Release);
    SPARE.store(Box::into_raw(Box::new(lib)), Ordering::Release);
    SPARE_PID.store(me, Ordering::Release);
}

/// In a fork child: the spare an ancestor left ready becomes this process's instance.
fn take_spare(inherited: *mut Lib, me: i32) -> Option<&'static Lib> {
    let s = SPARE.load(Ordering::Acquire);
    if s.is_null() || SPARE_PID.load(Ordering::Acquire) == me {
        return None;
    }
    // Taken once: this process's own children need a spare of their own.
    if SPARE
        .compare_exchange(s, std::ptr::null_mut(), Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return None;
    }
    if LIB
        .compare_exchange(inherited, s, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return None; // another thread of ours loaded one first (the spare stays unused)
    }
    NS_ERRNO.store(SPARE_ERRNO.load(Ordering::Acquire), Ordering::Release);
    LIB_PID.store(me, Ordering::Release);
    log::debug!("RDMA libraries: the instance made ready before the fork");
    // SAFETY: a published pointer comes from `Box::into_raw` and is never freed.
    Some(unsafe { &*s })
}

/// The next [`lib`] loads a new instance of the libraries, in a new link-map namespace, as a
/// fork child does: this process abandoned its engine after a credential change, and the
/// instance it used holds device contexts the kernel refuses to the new credentials. Call
/// only once nothing uses the old instance any more (its helper thread stopped).
pub fn renew() {
    LOAD_ERRNO.store(0, Ordering::Relaxed);
    LIB_PID.store(0, Ordering::Release);
}

/// Whether the table is already loaded (never triggers loading).
pub fn is_loaded() -> bool {
    !LIB.load(Ordering::Acquire).is_null()
}

fn dlopen_any(names: &[&CStr], ns: Option<libc::Lmid_t>) -> *mut c_void {
    for name in names {
        // RTLD_LOCAL: the libraries' symbols never interpose on the host program's.
        let h = dl::open_local(name, ns);
        if !h.is_null() {
            return h;
        }
    }
    std::ptr::null_mut()
}

/// Loads the libraries: into the program's namespace, or (`fresh`, in a fork child of a
/// process that had loaded them) into a new namespace with their own globals.
fn load(fresh: bool) -> Result<(Lib, *mut c_void), Error> {
    // libibverbs first: librdmacm depends on it and would pull it in anyway.
    let ibverbs = dlopen_any(&IBVERBS_NAMES, fresh.then_some(libc::LM_ID_NEWLM));
    let mut ns: libc::Lmid_t = 0;
    if fresh && !ibverbs.is_null() {
        // SAFETY: a live handle.
        match unsafe { dl::namespace_of(ibverbs) } {
            Some(n) => ns = n,
            None => return Err(Error::new("dlinfo", libc::ENOENT, Reason::NoRdma)),
        }
    }
    if ibverbs.is_null() {
        return Err(Error::new(
            "dlopen(libibverbs)",
            libc::ENOENT,
            Reason::NoRdma,
        ));
    }
    super::providers::load_present(ibverbs, fresh.then_some(ns));
    let rdmacm = dlopen_any(&RDMACM_NAMES, fresh.then_some(ns));
    let mut ns_errno = std::ptr::null_mut();
    if fresh {
        // libc is already loaded in that namespace.
        let c = dl::open_local(c"libc.so.6", Some(ns));
        let f = if c.is_null() {
            std::ptr::null_mut()
        } else {
            // SAFETY: a live handle.
            unsafe { dl::symbol(c, c"__errno_location") }
        };
        if f.is_null() {
            return Err(Error::new(
                "dlsym(__errno_location)",
                libc::ENOSYS,
                Reason::NoRdma,
            ));
        }
        ns_errno = f;
    }
    if rdmacm.is_null() {
        return Err(Error::new(
            "dlopen(librdmacm)",
            libc::ENOENT,
            Reason::NoRdma,
        ));
    }
    // The handles stay open for the life of the process: function pointers, contexts and
    // provider libraries all live inside them.
    Ok((Lib::resolve(rdmacm, ibverbs)?, ns_errno))
}

/// `rdma_event_str` as a Rust string ("RDMA_CM_EVENT_…"); "?" when not loaded.
pub fn event_str(event: rdma_cm_event_type::Type) -> &'static str {
    let Ok(lib) = lib() else { return "?" };
    // SAFETY: rdma_event_str returns a pointer to a static string for any value.
    let p = unsafe { (lib.rdma_event_str)(event) };
    if p.is_null() {
        return "?";
    }
    // SAFETY: non-null, NUL-terminated, static storage in librdmacm.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("?")
}

/// `ibv_wc_status_str` as a Rust string; "?" when not loaded.
pub fn wc_status_str(status: ibv_wc_status::Type) -> &'static str {
    let Ok(lib) = lib() else { return "?" };
    // SAFETY: ibv_wc_status_str returns a static string for any value.
    let p = unsafe { (lib.ibv_wc_status_str)(status) };
    if p.is_null() {
        return "?";
    }
    // SAFETY: non-null, NUL-terminated, static storage in libibverbs.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("?")
}

// Here rather than in error.rs: the errno is the loaded libraries' own (see `errno`).
impl super::error::Error {
    /// The error of a failed librdmacm/libibverbs call, from the errno those libraries set
    /// (in a fork child they run in a namespace of their own, with their own errno).
    pub fn last_lib(op: &'static str) -> Error {
        let errno = errno();
        Error::from_errno(op, if errno == 0 { libc::EIO } else { errno })
    }
}
