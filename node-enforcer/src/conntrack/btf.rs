//! Finds kfuncs in the kernel's BTF: their type ids, and when they live in
//! a module (nf_conntrack built as one, as most distributions do), a file
//! descriptor of that module's BTF for BPF_PROG_LOAD's `fd_array`.
//!
//! Only what a call instruction needs is read: type kinds and names. A
//! module's BTF is "split": its type ids continue after vmlinux's and its
//! string offsets after vmlinux's strings, so vmlinux is read first.

use std::os::fd::{AsFd, OwnedFd};

use crate::sys_bpf::{self, cmd};

const MAGIC: u16 = 0xeb9f;
const KIND_FUNC: u32 = 12;

/// Names and kinds of one BTF blob's types.
pub struct Types {
    /// Id of the first type here (1 for vmlinux; after vmlinux's last for a
    /// module).
    first_id: u32,
    /// (kind, name offset) of each type, in id order.
    types: Vec<(u32, u32)>,
    strings: Vec<u8>,
    /// String offsets below this are the base's (0 for vmlinux).
    first_str: u32,
}

/// What is wrong with a BTF blob (for this reader).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfParseError {
    #[error("not little-endian BTF (bad magic)")]
    BadMagic,
    #[error("BTF truncated at byte {0}")]
    Truncated(usize),
    #[error("BTF section out of bounds")]
    SectionOutOfBounds,
    /// A newer kernel's kind: its size is unknown, so nothing after it can
    /// be read.
    #[error("BTF type kind {0} unknown to this reader")]
    UnknownKind(u32),
    #[error("BTF type {0} runs past the type section")]
    TypePastSection(usize),
}

/// Why the kfuncs could not be found.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Damaged {
        path: String,
        #[source]
        source: BtfParseError,
    },
    /// Not in vmlinux, and the module has no BTF file (not loaded, or
    /// built without BTF).
    #[error("the kernel's BTF has no kfunc {names} (reading {path}: {source})")]
    NoModuleBtf {
        names: String,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("neither vmlinux's nor {module}'s BTF has kfunc {name}")]
    NoKfunc { module: String, name: String },
    #[error("the kernel has no BTF object named {0}")]
    NoObject(String),
    #[error("listing the kernel's BTF objects: {0}")]
    List(#[source] std::io::Error),
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, BtfParseError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
        .ok_or(BtfParseError::Truncated(at))
}

impl Types {
    /// Parses vmlinux's BTF (`base` None) or a module's, split on `base`.
    pub fn parse(data: &[u8], base: Option<&Types>) -> Result<Types, BtfParseError> {
        if data.len() < 24 || u16::from_le_bytes([data[0], data[1]]) != MAGIC {
            return Err(BtfParseError::BadMagic);
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let (type_off, type_len) = (u32_at(data, 8)? as usize, u32_at(data, 12)? as usize);
        let (str_off, str_len) = (u32_at(data, 16)? as usize, u32_at(data, 20)? as usize);
        let section = |off: usize, len: usize| {
            data.get(hdr_len + off..hdr_len + off + len)
                .ok_or(BtfParseError::SectionOutOfBounds)
        };
        let raw = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?.to_vec();
        let mut types = Vec::new();
        let mut at = 0;
        while at < raw.len() {
            let name = u32_at(raw, at)?;
            let info = u32_at(raw, at + 4)?;
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            let extra = match kind {
                1 | 14 | 17 => 4,          // int, var, decl tag
                3 => 12,                   // array
                4 | 5 | 15 => 12 * vlen,   // struct, union, datasec
                6 | 13 => 8 * vlen,        // enum, func proto
                19 => 12 * vlen,           // enum64
                2 | 7..=12 | 16 | 18 => 0, // ptr, fwd, modifiers, func, float, type tag
                other => return Err(BtfParseError::UnknownKind(other)),
            };
            if at + 12 + extra > raw.len() {
                return Err(BtfParseError::TypePastSection(types.len() + 1));
            }
            types.push((kind, name));
            at += 12 + extra;
        }
        let (first_id, first_str) = match base {
            None => (1, 0),
            Some(b) => (
                b.first_id + b.types.len() as u32,
                b.first_str + b.strings.len() as u32,
            ),
        };
        Ok(Types {
            first_id,
            types,
            strings,
            first_str,
        })
    }

    fn name<'a>(&'a self, off: u32, base: Option<&'a Types>) -> Option<&'a [u8]> {
        let (strings, off) = if off < self.first_str {
            let b = base?;
            (&b.strings, off - b.first_str)
        } else {
            (&self.strings, off - self.first_str)
        };
        let s = strings.get(off as usize..)?;
        Some(&s[..s.iter().position(|c| *c == 0)?])
    }

    /// The id of the function `name` defined here, if any.
    pub fn func(&self, name: &str, base: Option<&Types>) -> Option<u32> {
        self.types.iter().enumerate().find_map(|(i, &(kind, off))| {
            (kind == KIND_FUNC && self.name(off, base) == Some(name.as_bytes()))
                .then_some(self.first_id + i as u32)
        })
    }
}

/// Where the kfuncs were found.
pub struct Kfuncs {
    /// Their BTF ids, in the order asked.
    pub ids: Vec<u32>,
    /// The module's BTF, when they are a module's (None: vmlinux).
    pub module: Option<OwnedFd>,
}

/// Finds `names` in vmlinux, or else in `module`'s BTF.
pub fn find(names: &[&str], module: &str) -> Result<Kfuncs, BtfError> {
    let damaged = |path: &str| {
        let path = path.to_string();
        move |source| BtfError::Damaged { path, source }
    };
    const VMLINUX: &str = "/sys/kernel/btf/vmlinux";
    let data = std::fs::read(VMLINUX).map_err(|source| BtfError::Read {
        path: VMLINUX.to_string(),
        source,
    })?;
    let vmlinux = Types::parse(&data, None).map_err(damaged(VMLINUX))?;
    if let Some(ids) = names.iter().map(|n| vmlinux.func(n, None)).collect() {
        return Ok(Kfuncs { ids, module: None });
    }
    let path = format!("/sys/kernel/btf/{module}");
    let data = std::fs::read(&path).map_err(|source| BtfError::NoModuleBtf {
        names: names.join(", "),
        path: path.clone(),
        source,
    })?;
    let types = Types::parse(&data, Some(&vmlinux)).map_err(damaged(&path))?;
    let ids = names
        .iter()
        .map(|n| {
            types
                .func(n, Some(&vmlinux))
                .ok_or_else(|| BtfError::NoKfunc {
                    module: module.to_string(),
                    name: n.to_string(),
                })
        })
        .collect::<Result<Vec<u32>, BtfError>>()?;
    Ok(Kfuncs {
        ids,
        module: Some(kernel_btf_fd(module)?),
    })
}

/// A descriptor of the kernel's BTF object `name` (`vmlinux` or a module).
pub fn kernel_btf_fd(name: &str) -> Result<OwnedFd, BtfError> {
    let mut id = 0u32;
    loop {
        // start_id, next_id, open_flags
        let mut attr = [id, 0, 0];
        // SAFETY: the member BTF_GET_NEXT_ID reads, without pointers.
        if let Err(e) = unsafe { sys_bpf::call(cmd::BTF_GET_NEXT_ID, &mut attr) } {
            return Err(match e.raw_os_error() {
                Some(libc::ENOENT) => BtfError::NoObject(name.to_string()),
                _ => BtfError::List(e),
            });
        }
        id = attr[1];
        let mut attr = [id, 0, 0];
        // SAFETY: the member BTF_GET_FD_BY_ID reads, without pointers.
        let Ok(fd) = (unsafe { sys_bpf::call(cmd::BTF_GET_FD_BY_ID, &mut attr) }) else {
            continue; // gone since listed
        };
        let fd = sys_bpf::owned_fd(fd);
        let mut got = [0u8; 64];
        // struct bpf_btf_info: btf, btf_size, id, name, name_len, kernel_btf
        let mut info = [0u32; 8];
        let ptr = got.as_mut_ptr() as u64;
        info[4] = ptr as u32;
        info[5] = (ptr >> 32) as u32;
        info[6] = got.len() as u32;
        // SAFETY: a prefix of bpf_btf_info whose name points at `got`, of
        // the length given.
        if unsafe { sys_bpf::obj_info(fd.as_fd(), &mut info) }.is_err() {
            continue;
        }
        let kernel_btf = info[7] != 0;
        let len = got.iter().position(|c| *c == 0).unwrap_or(got.len());
        if kernel_btf && got[..len] == *name.as_bytes() {
            return Ok(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob of `types` (raw records) and `strings`.
    fn blob(types: &[u8], strings: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(types);
        b.extend_from_slice(strings);
        b
    }

    fn ty(name: u32, kind: u32, vlen: u32, extra: usize) -> Vec<u8> {
        let mut t = Vec::new();
        for v in [name, kind << 24 | vlen, 0] {
            t.extend_from_slice(&v.to_le_bytes());
        }
        t.resize(12 + extra, 0);
        t
    }

    #[test]
    fn split_btf_continues_the_base_ids_and_strings() {
        // Base: int "int" (id 1), struct of 2 members (2), func "f" (3).
        let base_strings = b"\0int\0s\0f\0";
        let base_types = [ty(1, 1, 0, 4), ty(5, 4, 2, 24), ty(7, KIND_FUNC, 0, 0)].concat();
        let base = Types::parse(&blob(&base_types, base_strings), None).unwrap();
        assert_eq!(base.func("f", None), Some(3));
        assert_eq!(base.func("int", None), None, "an int is not a function");
        // Module: func proto of 1 param (4), func "g" (5), func named by a
        // base string "f" (6).
        let mod_strings = b"\0g\0";
        let base_len = base_strings.len() as u32;
        let mod_types = [
            ty(0, 13, 1, 8),
            ty(base_len + 1, KIND_FUNC, 0, 0),
            ty(7, KIND_FUNC, 0, 0),
        ]
        .concat();
        let module = Types::parse(&blob(&mod_types, mod_strings), Some(&base)).unwrap();
        assert_eq!(module.func("g", Some(&base)), Some(5));
        assert_eq!(module.func("f", Some(&base)), Some(6));
        assert_eq!(module.func("h", Some(&base)), None);
    }

    #[test]
    fn damaged_btf_is_an_error() {
        let parse = |b: &[u8]| Types::parse(b, None).err();
        assert_eq!(
            parse(b"\x9f\xeb"),
            Some(BtfParseError::BadMagic),
            "too short"
        );
        let mut b = blob(&ty(0, 1, 0, 4), b"\0");
        b[0] = 0;
        assert_eq!(parse(&b), Some(BtfParseError::BadMagic));
        let b = blob(&ty(0, 31, 0, 0), b"\0");
        let e = parse(&b).unwrap();
        assert_eq!(e, BtfParseError::UnknownKind(31));
        assert!(e.to_string().contains("kind 31"), "{e}");
        let b = blob(&ty(0, 4, 3, 12), b"\0");
        assert_eq!(
            parse(&b),
            Some(BtfParseError::TypePastSection(1)),
            "members past the end"
        );
    }
}
