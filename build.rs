//! Links the release binary with the functions routerd runs placed together, in the order of
//! `link/code-order.txt` (written by `scripts/order-code`).
//!
//! Why: the kernel maps a binary's code 64 KiB and more at a time around each page that runs, so
//! functions that run scattered among 13 MiB of machine code that never runs kept about 11 MiB of
//! it resident. Placed together, the same functions keep about 8 (docs/benchmarks.md). A name
//! the binary no longer defines is skipped by the linker, so a stale list costs only memory.
//!
//! Only where the linker is LLD, which takes `--symbol-ordering-file`: rustc 1.90 and later link
//! x86_64-unknown-linux-gnu with its own LLD unless a linker is chosen in the build's flags.

use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=link/code-order.txt");
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER");
    if env::var("PROFILE").as_deref() != Ok("release") || !links_with_rust_lld() {
        return;
    }
    let manifest = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let order = Path::new(&manifest).join("link").join("code-order.txt");
    println!(
        "cargo:rustc-link-arg-bin=routerd=-Wl,--symbol-ordering-file={}",
        order.display()
    );
    println!("cargo:rustc-link-arg-bin=routerd=-Wl,--no-warn-symbol-ordering");
}

/// rustc's own LLD is the linker: the target is x86_64 Linux with glibc, rustc is 1.90 or
/// later, and neither the flags nor the environment choose another linker.
fn links_with_rust_lld() -> bool {
    if env::var("TARGET").as_deref() != Ok("x86_64-unknown-linux-gnu") {
        return false;
    }
    if env::var_os("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER").is_some() {
        return false;
    }
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if flags
        .split('\x1f')
        .any(|f| f.contains("linker") || f.contains("fuse-ld"))
    {
        return false;
    }
    rustc_minor().is_some_and(|minor| minor >= 90)
}

/// The minor version of the rustc that builds this crate (`rustc 1.95.0 (...)` gives 95).
fn rustc_minor() -> Option<u32> {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let out = Command::new(rustc).arg("--version").output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let version = text.split_whitespace().nth(1)?;
    let mut parts = version.split('.');
    (parts.next()? == "1").then_some(())?;
    parts.next()?.parse().ok()
}
