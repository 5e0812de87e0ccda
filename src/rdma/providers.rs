//! Loading only the libibverbs providers of the devices present.
//!
//! libibverbs matches each device to a provider library (`librxe`, `libmlx5`, …) among those
//! registered; only when a device matches none does it load every provider its
//! configuration names — seventeen on Debian 12, whichever devices the host has. In the test
//! bed that costs 41–57 ms of a 55 ms library start and 80 of a process's mappings (every
//! fork copies them; the spare instance made for fork children loads them again). A
//! provider registers itself from its constructor, so loading the present devices' own
//! before the first device list leaves libibverbs nothing to look for. A guess that misses
//! costs what not guessing does: the device stays unmatched and libibverbs loads them all.

use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};

use crate::sys::dl;

/// What sysfs says about one RDMA device.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Device {
    /// Its name (`rxe0`, `mlx5_0`; udev may rename hardware ones, `rocep1s0f0`).
    name: String,
    /// The kernel driver of the device it sits on (`mlx5_core`, `efa`), if any.
    driver: Option<String>,
    /// A software device on a network interface (rxe, siw): no bus device, a `parent`.
    soft: bool,
    /// Its `node_type`: 1 an InfiniBand/RoCE adapter (rxe), 4 an iWARP one (siw).
    node_type: Option<u8>,
}

/// The providers that may serve `devices`, from `available` (provider names as their
/// library files spell them): a provider whose name starts the device's or its driver's
/// name (`mlx5` for `mlx5_0` or `mlx5_core`), or that the driver's name starts (`qedr` for
/// `qed`); for a software device, the software provider of its kind. Order of `available`,
/// no repeats.
fn choose<'a>(devices: &[Device], available: &'a [String]) -> Vec<&'a str> {
    let serves = |p: &str, d: &Device| {
        d.name.starts_with(p)
            || d.driver
                .as_deref()
                .is_some_and(|k| k.starts_with(p) || p.starts_with(k))
            || (d.soft
                && match p {
                    "rxe" => d.node_type != Some(4),
                    "siw" => d.node_type != Some(1),
                    _ => false,
                })
    };
    available
        .iter()
        .map(String::as_str)
        .filter(|p| devices.iter().any(|d| serves(p, d)))
        .collect()
}

/// The provider name in a provider library's file name (`librxe-rdmav34.so` → `rxe`).
fn provider_name(file: &str) -> Option<&str> {
    let rest = file.strip_prefix("lib")?;
    let (name, version) = rest.split_once("-rdmav")?;
    let digits = version.strip_suffix(".so")?;
    (!name.is_empty() && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then_some(name)
}

/// The RDMA devices sysfs lists.
fn devices(class: &Path) -> Vec<Device> {
    let Ok(entries) = std::fs::read_dir(class) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let e = e.ok()?;
            let dir = e.path();
            let driver = std::fs::read_link(dir.join("device/driver"))
                .ok()
                .and_then(|t| Some(t.file_name()?.to_str()?.to_owned()));
            let soft = driver.is_none() && dir.join("parent").exists();
            let node_type = std::fs::read_to_string(dir.join("node_type"))
                .ok()
                .and_then(|t| t.split(':').next()?.trim().parse().ok());
            Some(Device {
                name: e.file_name().to_str()?.to_owned(),
                driver,
                soft,
                node_type,
            })
        })
        .collect()
}

/// The provider libraries in `dir`: (provider name, path), sorted by file name.
fn libraries(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(String, PathBuf)> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            let file = e.file_name();
            let name = provider_name(file.to_str()?)?.to_owned();
            Some((name, e.path()))
        })
        .collect();
    found.sort_by(|a, b| a.1.cmp(&b.1));
    found
}

/// Loads, next to the libibverbs of `ibverbs` (a live handle, in namespace `ns` or the
/// program's), the providers of the devices present, before anything lists devices. Does
/// nothing where the user steers libibverbs's own loading (`RDMAV_DRIVERS`, `IBV_DRIVERS`:
/// it reads them only when it loads providers itself).
pub(super) fn load_present(ibverbs: *mut c_void, ns: Option<libc::Lmid_t>) {
    if ["RDMAV_DRIVERS", "IBV_DRIVERS"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    {
        return;
    }
    // SAFETY: a live handle (the contract).
    let list = unsafe { dl::symbol(ibverbs, c"ibv_get_device_list") };
    let Some(dir) =
        dl::path_of(list).and_then(|p| Some(Path::new(&p).parent()?.join("libibverbs")))
    else {
        return;
    };
    let libs = libraries(&dir);
    let names: Vec<String> = libs.iter().map(|(n, _)| n.clone()).collect();
    let present = devices(Path::new("/sys/class/infiniband"));
    for name in choose(&present, &names) {
        // Every file of that provider: one built for another libibverbs fails to load.
        for (_, path) in libs.iter().filter(|(n, _)| n == name) {
            let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // Never closed: libibverbs keeps the provider's tables from its constructor.
            let loaded = !dl::open_local(&c, ns).is_null();
            log::debug!(
                "RDMA libraries: provider {} loaded {loaded}",
                path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(name: &str, driver: Option<&str>, soft: bool) -> Device {
        Device {
            name: name.into(),
            driver: driver.map(Into::into),
            soft,
            node_type: None,
        }
    }

    fn debian12() -> Vec<String> {
        [
            "bnxt_re",
            "cxgb4",
            "efa",
            "erdma",
            "hfi1verbs",
            "hns",
            "ipathverbs",
            "irdma",
            "mana",
            "mlx4",
            "mlx5",
            "mthca",
            "ocrdma",
            "qedr",
            "rxe",
            "siw",
            "vmw_pvrdma",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn providers_are_chosen_by_device_driver_or_kind() {
        let all = debian12();
        // The bed's device: virtual, on a veth; renamed, its kind tells.
        let soft = |name, node_type| Device {
            node_type,
            ..dev(name, None, true)
        };
        assert_eq!(choose(&[soft("rxe0", Some(1))], &all), ["rxe"]);
        assert_eq!(choose(&[soft("roce_eth0", Some(1))], &all), ["rxe"]);
        assert_eq!(choose(&[soft("iw0", Some(4))], &all), ["siw"]);
        assert_eq!(choose(&[soft("soft0", None)], &all), ["rxe", "siw"]);
        // A renamed ConnectX port: its driver names it.
        let cx = dev("rocep1s0f0", Some("mlx5_core"), false);
        assert_eq!(choose(std::slice::from_ref(&cx), &all), ["mlx5"]);
        assert_eq!(
            choose(&[dev("mlx4_0", Some("mlx4_core"), false)], &all),
            ["mlx4"]
        );
        // The driver's name starts the provider's.
        assert_eq!(choose(&[dev("rdma0", Some("qed"), false)], &all), ["qedr"]);
        assert_eq!(
            choose(&[dev("x", Some("hfi1"), false)], &all),
            ["hfi1verbs"]
        );
        // Two devices, two providers, in the library order.
        let efa = dev("rdmap0s6", Some("efa"), false);
        assert_eq!(choose(&[efa, cx], &all), ["efa", "mlx5"]);
        // Nothing known: nothing chosen, and libibverbs loads them all as before.
        assert!(choose(&[dev("roce7", Some("newdrv"), false)], &all).is_empty());
        assert!(choose(&[], &all).is_empty());
    }

    #[test]
    fn provider_names_come_from_library_files() {
        assert_eq!(provider_name("librxe-rdmav34.so"), Some("rxe"));
        assert_eq!(provider_name("libvmw_pvrdma-rdmav2.so"), Some("vmw_pvrdma"));
        for not in [
            "librxe.so",
            "librxe-rdmav.so",
            "librxe-rdmav34.so.1",
            "lib-rdmav34.so",
            "rxe-rdmav34.so",
            "librxe-rdmav3x.so",
        ] {
            assert_eq!(provider_name(not), None, "{not}");
        }
    }

    #[test]
    fn missing_directories_give_nothing() {
        assert!(devices(Path::new("/nonexistent/class")).is_empty());
        assert!(libraries(Path::new("/nonexistent/libibverbs")).is_empty());
    }
}
