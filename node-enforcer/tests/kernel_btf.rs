//! The real kernel's BTF: the kfuncs the conntrack cleanup calls are found,
//! in vmlinux or in nf_conntrack's module BTF (distribution kernels build it
//! as a module), with the ids bpftool reads from the same BTF; the kernel's
//! BTF objects can be opened by name. Needs root (BPF_BTF_GET_FD_BY_ID).

use node_enforcer::conntrack::btf::{find, kernel_btf_fd, Types};
use palisade_test_support::require_root;

#[test]
#[ignore = "needs root"]
fn the_kernels_kfuncs_are_found() {
    require_root();
    let names = ["bpf_skb_ct_lookup", "bpf_ct_release"];
    let k = find(&names, "nf_conntrack").unwrap();
    // Where they were found decides which BTF bpftool must list them in.
    let (file, base) = match &k.module {
        None => ("/sys/kernel/btf/vmlinux".to_string(), None),
        Some(_) => (
            "/sys/kernel/btf/nf_conntrack".to_string(),
            Some("/sys/kernel/btf/vmlinux"),
        ),
    };
    let mut args = vec!["btf", "dump", "file", file.as_str()];
    if let Some(b) = base {
        args.extend(["base", b]);
    }
    args.extend(["format", "raw"]);
    // bpftool's own reading of the same BTF is the oracle.
    let out = std::process::Command::new("bpftool")
        .args(&args)
        .output()
        .expect("bpftool (scripts/setup.sh installs it)");
    assert!(out.status.success(), "bpftool {args:?}: {:?}", out.status);
    let raw = String::from_utf8_lossy(&out.stdout);
    for (name, id) in names.iter().zip(&k.ids) {
        let line = format!("[{id}] FUNC '{name}' ");
        assert!(
            raw.contains(&line),
            "bpftool does not list {line:?} in {file}"
        );
    }
    let vmlinux = std::fs::read("/sys/kernel/btf/vmlinux").unwrap();
    let base = Types::parse(&vmlinux, None).unwrap();
    assert_eq!(base.func("no_such_kfunc_anywhere", None), None);
    kernel_btf_fd("vmlinux").unwrap();
    if k.module.is_some() {
        kernel_btf_fd("nf_conntrack").unwrap();
    }
    let e = kernel_btf_fd("no_such_module").unwrap_err();
    assert!(
        matches!(&e, node_enforcer::conntrack::btf::BtfError::NoObject(n) if n == "no_such_module"),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("no BTF object named no_such_module"),
        "{e}"
    );
}
