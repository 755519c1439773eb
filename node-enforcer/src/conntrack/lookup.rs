//! Asks the kernel's conntrack table about single flows, through the
//! `bpf_skb_ct_lookup` kfunc in `palisade_ct_explain` (ebpf's
//! `c/ct_explain.bpf.c`), run with BPF_PROG_TEST_RUN.
//!
//! Why not the netlink dump: ctnetlink builds a message for every kernel
//! entry, about 1.8 µs each, so a pass over a million-entry table costs well
//! over a second of CPU however little the eBPF maps hold. A lookup costs a
//! hash probe per question, and the cleanup asks only about its own entries.
//!
//! The kfunc takes TCP and UDP only, in the default zone: any other flow is
//! answered [`Answer::NotAsked`], and the sweep judges those against a
//! netlink dump as before. aya 0.14 cannot relocate kfunc calls, so the
//! program is loaded here: its two `call` instructions get the kfuncs' BTF
//! ids from the kernel's BTF ([`super::btf`]: vmlinux's, or nf_conntrack's
//! when it is a module). When the kernel lacks them or refuses the program,
//! [`KernelLookup::load`] fails with a reason, and the sweep uses the dump
//! (and says so).

use std::os::fd::{AsRawFd, OwnedFd};

use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};
use palisade_ebpf::ct_answers::{ANSWER_ERROR, ANSWER_FOUND, ANSWER_NONE};
use palisade_ebpf::{sizes, CT_EXPLAIN_OBJECT, PROG_CT_EXPLAIN};

use super::{btf, Tuple};
use crate::sys_bpf::{self, cmd};

const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
const KFUNCS: [&str; 2] = ["bpf_skb_ct_lookup", "bpf_ct_release"];

/// The program's batch layout (struct batch_head, struct ask), as its C
/// defines it.
const HEAD: usize = sizes::CT_EXPLAIN_HEAD_BYTES as usize;
const ASK: usize = sizes::CT_EXPLAIN_ASK_BYTES as usize;
const PROTO_AT: usize = sizes::CT_ASK_PROTO_AT as usize;
const FAMILY_AT: usize = sizes::CT_ASK_FAMILY_AT as usize;
const ANSWER_AT: usize = sizes::CT_ASK_ANSWER_AT as usize;
const ERROR_AT: usize = sizes::CT_ASK_ERROR_AT as usize;
/// Records per test run.
pub const BATCH_MAX: usize = sizes::CT_EXPLAIN_BATCH_MAX as usize;

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

/// The kernel's answer about one flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A kernel entry holds the flow (either direction, either end).
    Found,
    /// No kernel entry holds it.
    Absent,
    /// Not asked: the kfunc takes only TCP and UDP (or the tuple mixes an
    /// IPv4 and an IPv6 address).
    NotAsked,
    /// The kernel refused the question with this errno.
    Refused(u8),
}

/// Can the kfunc answer for this flow?
pub fn askable(t: &Tuple) -> bool {
    (t.proto == IPPROTO_TCP || t.proto == IPPROTO_UDP) && family(t).is_some()
}

fn v4_mapped(a: &[u8; 16]) -> bool {
    a[..10].iter().all(|b| *b == 0) && a[10] == 0xff && a[11] == 0xff
}

fn family(t: &Tuple) -> Option<u8> {
    match (v4_mapped(&t.src), v4_mapped(&t.dst)) {
        (true, true) => Some(4),
        (false, false) => Some(6),
        _ => None,
    }
}

/// Writes `t` as a `struct ask` record (struct bpf_sock_tuple first,
/// addresses and ports in network order).
fn encode(t: &Tuple, fam: u8, rec: &mut [u8]) {
    rec.fill(0);
    if fam == 4 {
        rec[0..4].copy_from_slice(&t.src[12..]);
        rec[4..8].copy_from_slice(&t.dst[12..]);
        rec[8..10].copy_from_slice(&t.sport.to_be_bytes());
        rec[10..12].copy_from_slice(&t.dport.to_be_bytes());
    } else {
        rec[0..16].copy_from_slice(&t.src);
        rec[16..32].copy_from_slice(&t.dst);
        rec[32..34].copy_from_slice(&t.sport.to_be_bytes());
        rec[34..36].copy_from_slice(&t.dport.to_be_bytes());
    }
    rec[PROTO_AT] = t.proto;
    rec[FAMILY_AT] = fam;
    // Overwritten by the program; left as is, it fails the pass rather
    // than read as "absent" (which would remove the entry).
    rec[ANSWER_AT] = UNANSWERED;
}

/// What `struct ask.answer` holds until the program answers.
const UNANSWERED: u8 = 0xff;

/// Why the lookup program cannot be loaded (the sweep then dumps the
/// kernel's table instead), or failed while asking (the pass fails).
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// The kernel's BTF lacks the kfuncs, or cannot be read.
    #[error(transparent)]
    Btf(#[from] btf::BtfError),
    /// The embedded object does not parse (no `std` error of `object`'s
    /// to carry as a source).
    #[error("the {PROG_CT_EXPLAIN} object: {0}")]
    Object(object::read::Error),
    /// The embedded object is not the one program this loader patches.
    #[error("the {PROG_CT_EXPLAIN} object: {0}")]
    ObjectShape(String),
    /// BPF_PROG_LOAD refused it: the errno and the verifier log's last
    /// lines.
    #[error("loading {PROG_CT_EXPLAIN}: {source}: {log}")]
    Load {
        #[source]
        source: std::io::Error,
        log: String,
    },
    #[error("running {PROG_CT_EXPLAIN}: {0}")]
    Run(#[source] std::io::Error),
    #[error("{PROG_CT_EXPLAIN} answered {answered} of {asked} questions (last verdict {verdict})")]
    Incomplete {
        answered: u32,
        asked: usize,
        verdict: u32,
    },
    #[error("{PROG_CT_EXPLAIN} left a question unanswered")]
    Unanswered,
    #[error("{PROG_CT_EXPLAIN} wrote answer {0}, which no version of it writes")]
    UnknownAnswer(u8),
}

fn decode(rec: &[u8]) -> Result<Answer, LookupError> {
    match rec[ANSWER_AT] {
        ANSWER_NONE => Ok(Answer::Absent),
        ANSWER_FOUND => Ok(Answer::Found),
        ANSWER_ERROR => Ok(Answer::Refused(rec[ERROR_AT])),
        UNANSWERED => Err(LookupError::Unanswered),
        other => Err(LookupError::UnknownAnswer(other)),
    }
}

/// The loaded program; asks in the calling thread's network namespace.
pub struct KernelLookup {
    prog: OwnedFd,
    buf: Vec<u8>,
}

impl KernelLookup {
    /// Loads the program, or says why it cannot be (no BTF, no kfuncs in
    /// vmlinux, no permission, a verifier refusal).
    pub fn load() -> Result<Self, LookupError> {
        let kfuncs = btf::find(&KFUNCS, "nf_conntrack")?;
        // A module's kfunc names its BTF by an index into fd_array; 0
        // means vmlinux, so the module's descriptor goes at 1.
        let (off, fd_array) = match &kfuncs.module {
            Some(fd) => (1, vec![fd.as_raw_fd(), fd.as_raw_fd()]),
            None => (0, Vec::new()),
        };
        let insns = patched_program(CT_EXPLAIN_OBJECT, off, |name| {
            KFUNCS
                .iter()
                .position(|k| *k == name)
                .map(|i| kfuncs.ids[i])
        })?;
        let prog = prog_load(&insns, &fd_array)?;
        Ok(KernelLookup {
            prog,
            buf: vec![0u8; HEAD + BATCH_MAX * ASK],
        })
    }

    /// Answers for each of `tuples`, in order, into `out` (cleared first).
    pub fn ask(&mut self, tuples: &[Tuple], out: &mut Vec<Answer>) -> Result<(), LookupError> {
        out.clear();
        out.resize(tuples.len(), Answer::NotAsked);
        // Indices of the tuples in the batch being filled.
        let mut batch: Vec<usize> = Vec::with_capacity(BATCH_MAX);
        for (i, t) in tuples.iter().enumerate() {
            let Some(fam) = family(t).filter(|_| askable(t)) else {
                continue;
            };
            let at = HEAD + batch.len() * ASK;
            encode(t, fam, &mut self.buf[at..at + ASK]);
            batch.push(i);
            if batch.len() == BATCH_MAX {
                self.run(&batch, out)?;
                batch.clear();
            }
        }
        if !batch.is_empty() {
            self.run(&batch, out)?;
        }
        Ok(())
    }

    fn run(&mut self, batch: &[usize], out: &mut [Answer]) -> Result<(), LookupError> {
        let n = batch.len();
        self.buf[..HEAD].fill(0);
        self.buf[4..8].copy_from_slice(&(n as u32).to_ne_bytes());
        let len = HEAD + n * ASK;
        let retval = test_run(&self.prog, &mut self.buf[..len], n as u32)?;
        let answered = u32::from_ne_bytes(self.buf[0..4].try_into().expect("4 bytes"));
        if retval != 0 || answered as usize != n {
            return Err(LookupError::Incomplete {
                answered,
                asked: n,
                verdict: retval,
            });
        }
        for (k, &i) in batch.iter().enumerate() {
            let at = HEAD + k * ASK;
            out[i] = decode(&self.buf[at..at + ASK])?;
        }
        Ok(())
    }
}

/// The program's instructions with each kfunc call pointed at its BTF id
/// (in the BTF at `fd_array[off]`, vmlinux's for 0). The object must hold
/// nothing else to relocate: it is loaded as is.
fn patched_program(
    elf: &[u8],
    off: u16,
    btf_id: impl Fn(&str) -> Option<u32>,
) -> Result<Vec<u8>, LookupError> {
    let shape = |what: &str| LookupError::ObjectShape(what.to_string());
    let file = object::File::parse(elf).map_err(LookupError::Object)?;
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(PROG_CT_EXPLAIN))
        .ok_or_else(|| shape("no such symbol"))?;
    let section = sym
        .section_index()
        .and_then(|i| file.section_by_index(i).ok())
        .ok_or_else(|| shape("the symbol has no section"))?;
    let mut insns = section.data().map_err(LookupError::Object)?.to_vec();
    if sym.address() != 0 || insns.len() as u64 != sym.size() || !insns.len().is_multiple_of(8) {
        return Err(shape("the program is not alone in its section"));
    }
    for (offset, reloc) in section.relocations() {
        let target = match reloc.target() {
            RelocationTarget::Symbol(i) => file.symbol_by_index(i).map_err(LookupError::Object)?,
            _ => return Err(shape("a relocation not against a symbol")),
        };
        let name = target.name().map_err(LookupError::Object)?;
        let id = btf_id(name).ok_or_else(|| shape(&format!("unexpected relocation to {name}")))?;
        let at = offset as usize;
        if !at.is_multiple_of(8) || at + 8 > insns.len() || insns[at] != 0x85 {
            return Err(shape(&format!("the relocation to {name} is not a call")));
        }
        // dst_reg 0, src_reg BPF_PSEUDO_KFUNC_CALL, off: whose BTF.
        insns[at + 1] = BPF_PSEUDO_KFUNC_CALL << 4;
        insns[at + 2..at + 4].copy_from_slice(&off.to_le_bytes());
        insns[at + 4..at + 8].copy_from_slice(&id.to_le_bytes());
    }
    Ok(insns)
}

/// The `BPF_PROG_LOAD` member of `union bpf_attr`, as far as used.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    attach_prog_fd: u32,
    core_relo_cnt: u32,
    fd_array: u64,
}

fn prog_load(insns: &[u8], fd_array: &[i32]) -> Result<OwnedFd, LookupError> {
    let license = c"Dual BSD/GPL";
    let mut name = [0u8; 16];
    name[..15].copy_from_slice(&PROG_CT_EXPLAIN.as_bytes()[..15]);
    let attempt = |log: Option<&mut Vec<u8>>| {
        let mut attr = ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_SCHED_CLS,
            insn_cnt: (insns.len() / 8) as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            prog_name: name,
            fd_array: if fd_array.is_empty() {
                0
            } else {
                fd_array.as_ptr() as u64
            },
            ..Default::default()
        };
        if let Some(log) = log {
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
        }
        // SAFETY: the PROG_LOAD member; its pointers name `insns`,
        // `license`, `fd_array` and `log`, each of the length given.
        unsafe { sys_bpf::call(cmd::PROG_LOAD, &mut attr) }
    };
    let err = match attempt(None) {
        Ok(fd) => return Ok(sys_bpf::owned_fd(fd)),
        Err(e) => e,
    };
    // Again with the verifier's log, to say why.
    let mut log = vec![0u8; 1 << 16];
    let _ = attempt(Some(&mut log));
    let text = String::from_utf8_lossy(&log[..log.iter().position(|b| *b == 0).unwrap_or(0)])
        .lines()
        .rev()
        .take(4)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join(" / ");
    Err(LookupError::Load {
        source: err,
        log: text,
    })
}

/// The `test` member of `union bpf_attr`, as far as used.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
}

/// Runs the program `repeat` times over `data`, which receives the packet
/// as the last run left it. Returns the last run's verdict.
fn test_run(prog: &OwnedFd, data: &mut [u8], repeat: u32) -> Result<u32, LookupError> {
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: data.len() as u32,
        data_size_out: data.len() as u32,
        data_in: data.as_ptr() as u64,
        data_out: data.as_mut_ptr() as u64,
        repeat,
        ..Default::default()
    };
    // SAFETY: the PROG_TEST_RUN member; data_in and data_out name `data`,
    // of the sizes given.
    unsafe { sys_bpf::call(cmd::PROG_TEST_RUN, &mut attr) }.map_err(LookupError::Run)?;
    Ok(attr.retval)
}

#[cfg(test)]
mod tests {
    use super::super::tests::v4;
    use super::*;

    #[test]
    fn records_carry_network_order_tuples_of_their_family() {
        let t = Tuple {
            src: v4([10, 0, 0, 1]),
            dst: v4([10, 0, 0, 2]),
            sport: 40000,
            dport: 80,
            proto: IPPROTO_TCP,
        };
        let mut rec = [0xaau8; ASK];
        encode(&t, family(&t).unwrap(), &mut rec);
        assert_eq!(&rec[0..12], &[10, 0, 0, 1, 10, 0, 0, 2, 0x9c, 0x40, 0, 80]);
        assert!(rec[12..36].iter().all(|b| *b == 0));
        assert_eq!((rec[36], rec[37], rec[38], rec[39]), (6, 4, UNANSWERED, 0));
        assert!(
            matches!(decode(&rec), Err(LookupError::Unanswered)),
            "an unanswered question is no answer"
        );

        let mut six = t;
        six.src = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        six.dst = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        six.proto = IPPROTO_UDP;
        encode(&six, family(&six).unwrap(), &mut rec);
        assert_eq!(&rec[0..16], &six.src);
        assert_eq!(&rec[16..32], &six.dst);
        assert_eq!(&rec[32..36], &[0x9c, 0x40, 0, 80]);
        assert_eq!((rec[36], rec[37]), (17, 6));
    }

    #[test]
    fn only_tcp_and_udp_of_one_family_are_asked() {
        let mut t = Tuple {
            src: v4([10, 0, 0, 1]),
            dst: v4([10, 0, 0, 2]),
            sport: 1,
            dport: 2,
            proto: IPPROTO_TCP,
        };
        assert!(askable(&t));
        for proto in [1, 58, 132] {
            t.proto = proto;
            assert!(!askable(&t), "protocol {proto}");
        }
        t.proto = IPPROTO_UDP;
        t.dst[10] = 0;
        assert!(!askable(&t), "mixed families");
    }

    #[test]
    fn an_unknown_answer_is_an_error_not_a_verdict() {
        let mut rec = [0u8; ASK];
        rec[38] = 7;
        let e = decode(&rec).unwrap_err();
        assert!(matches!(e, LookupError::UnknownAnswer(7)), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("{PROG_CT_EXPLAIN} wrote answer 7, which no version of it writes")
        );
        rec[38] = 2;
        rec[39] = 22;
        assert_eq!(decode(&rec).unwrap(), Answer::Refused(22));
    }

    #[test]
    fn the_object_patches_to_kfunc_calls_only() {
        let insns = patched_program(CT_EXPLAIN_OBJECT, 1, |name| match name {
            "bpf_skb_ct_lookup" => Some(1000),
            "bpf_ct_release" => Some(2000),
            _ => None,
        })
        .unwrap();
        let calls: Vec<(u8, u16, u32)> = insns
            .chunks(8)
            .filter(|i| i[0] == 0x85)
            .map(|i| {
                (
                    i[1] >> 4,
                    u16::from_le_bytes([i[2], i[3]]),
                    u32::from_le_bytes(i[4..8].try_into().unwrap()),
                )
            })
            .collect();
        assert!(calls.contains(&(BPF_PSEUDO_KFUNC_CALL, 1, 1000)));
        assert!(calls.contains(&(BPF_PSEUDO_KFUNC_CALL, 1, 2000)));
        assert!(
            calls
                .iter()
                .all(|(src, off, _)| *src == BPF_PSEUDO_KFUNC_CALL && *off == 1),
            "every call is a kfunc call into fd_array[1]: {calls:?}"
        );
        let refuse = patched_program(CT_EXPLAIN_OBJECT, 0, |_| None).unwrap_err();
        assert!(matches!(refuse, LookupError::ObjectShape(_)), "{refuse:?}");
        assert!(
            refuse.to_string().contains("unexpected relocation"),
            "{refuse}"
        );
    }
}
