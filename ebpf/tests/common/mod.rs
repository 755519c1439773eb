//! What more than one test binary of this crate needs.

#![allow(dead_code)] // not every test binary uses every helper

/// Runs `test` with the ifindexes of two interfaces that exist for
/// BPF_PROG_TEST_RUN (it refuses an unknown ifindex): the ends of a veth
/// pair in a network namespace of its own, made on a thread of its own
/// (the namespace is per thread and goes away with it).
pub fn with_two_pods(test: impl FnOnce(u32, u32) + Send) {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: unshare only changes this thread's namespaces.
                let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
                assert_eq!(
                    rc,
                    0,
                    "unshare(CLONE_NEWNET): {}",
                    std::io::Error::last_os_error()
                );
                let status = std::process::Command::new("ip")
                    .args([
                        "link", "add", "pal-a", "type", "veth", "peer", "name", "pal-b",
                    ])
                    .status()
                    .expect("run ip");
                assert!(status.success(), "ip link add: {status}");
                test(ifindex_of("pal-a"), ifindex_of("pal-b"));
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    });
}

pub fn ifindex_of(name: &str) -> u32 {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    assert_ne!(index, 0, "{name}: {}", std::io::Error::last_os_error());
    index
}
