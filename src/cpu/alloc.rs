//! The allocator's settings for a simulation, made in-process at the start of `main`.
//!
//! A simulation of a large cluster allocates and frees the actors' records all run long. By
//! default glibc gives the top of its heap back to the system once 128 KiB of it are free, so
//! at cluster scale the heap shrinks and grows every few requests and the kernel zeroes the
//! same pages again; and blocks of 128 KiB and more come from `mmap`, fresh pages each time.
//! [`tune_allocator`] keeps freed memory in the heap for reuse instead (up to 1 GiB of it),
//! serves blocks below 32 MiB from it, and grows the heap 16 MiB at a time. Only speed
//! changes; results never depend on where memory is. Elsewhere than Linux with glibc it does
//! nothing.

/// Sets glibc's heap parameters (see the module doc). Call it first thing in `main`, before
/// any thread starts.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets allocator parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TOP_PAD, 16 << 20);
    }
}
