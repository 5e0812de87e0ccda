//! Gives librsock.so its SONAME (`librsock.so`), so that the loader, `ldconfig`,
//! `dpkg-shlibdeps` and `readelf -d` know it by its installed name; rustc sets none for a
//! cdylib. Unversioned: the shim is preloaded by path, never linked against.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librsock.so");
}
