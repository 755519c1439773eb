//! The heap allocator of the controller's binary (and of its benchmarks,
//! which must measure what ships), and how it is tuned.
//!
//! A cluster-wide change rebuilds and decodes a plan entry for every pod it
//! reaches, each a tree of small allocations. With glibc's allocator,
//! freeing them was half the time of an edit that reaches all 100,000 pods
//! of the full-scale benchmark (1,050 of 2,000 ms for the deltas alone);
//! with mimalloc, about 230 ms.
//!
//! Transparent huge pages are not asked for (the `no_thp` feature): on a
//! node whose THP defrag setting is `madvise` (Debian's default), every
//! fault in an madvised region may compact memory first, and the full
//! computation of the mixed benchmark shape took anywhere from 1.0 to 3.3 s
//! from run to run. Without them, freed memory returned to the system at
//! mimalloc's default 10 ms was faulted in again, 4 KiB at a time, by the
//! next change; it is kept for [`PURGE_DELAY_MS`] instead.

pub use mimalloc::MiMalloc as Allocator;

/// How long freed memory is kept for reuse before it is returned to the
/// system: longer than one change takes, so that a change's memory is
/// reused by the next while changes come, and released once they stop.
pub const PURGE_DELAY_MS: i64 = 1_000;

/// mimalloc's `mi_option_purge_delay` (mimalloc.h, v3), for which
/// libmimalloc-sys names no constant; `tests::the_option_is_the_purge_delay`
/// checks the number against the environment variable mimalloc reads for it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Applies the settings above; called first thing by the binary.
pub fn tune() {
    // SAFETY: sets one of mimalloc's global options; any thread may, at
    // any time, and the value is only read when memory is purged.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS as _) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run only as the child of the test below: prints what mimalloc holds
    /// for the option number.
    #[test]
    #[ignore = "the child process of the_option_is_the_purge_delay"]
    fn print_option() {
        // SAFETY: reads one of mimalloc's global options.
        let value = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        println!("option={value}");
    }

    #[test]
    fn the_option_is_the_purge_delay() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "allocator::tests::print_option",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("MIMALLOC_PURGE_DELAY", "4321")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("option=4321"),
            "option {MI_OPTION_PURGE_DELAY} is not the one MIMALLOC_PURGE_DELAY sets: {stdout}"
        );
    }
}
