//! The datapath's error: what was being done, the cause kept as the
//! error's source (aya's map, program and link errors, `std::io::Error`,
//! an errno), and a kind a caller decides by (a gone interface is not a
//! refusing kernel). Its text is the context, then ": " and the cause's
//! text when there is one, as logs and the pods' error fields show it.

use std::error::Error as StdError;
use std::fmt::Display;

/// A cause of any type, as the source of a [`DatapathError`].
pub type Cause = Box<dyn StdError + Send + Sync + 'static>;

pub type Result<T> = std::result::Result<T, DatapathError>;

/// What kind of failure a [`DatapathError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DatapathErrorKind {
    /// The interface does not exist (any more): ENODEV, or aya's unknown
    /// interface. A pod that went away, not a fault of the node.
    InterfaceGone,
    /// A map or the endpoint slots have no room (E2BIG, ENOSPC): the node
    /// holds more than its datapath was sized for.
    Full,
    /// The kernel refused or failed a call (bpf(), netlink, membarrier):
    /// a permission, the verifier, memory, a kernel without a feature.
    Kernel,
    /// A file or directory under the pin root could not be made, read or
    /// removed.
    Io,
    /// Our own invariant: a map or program missing from the object or of
    /// another shape, an endpoint or table that is not there, an entry the
    /// datapath cannot hold.
    Invariant,
}

impl DatapathErrorKind {
    /// Every kind, so a counter by kind can show each, zeros included.
    pub const ALL: [DatapathErrorKind; 5] = [
        DatapathErrorKind::InterfaceGone,
        DatapathErrorKind::Full,
        DatapathErrorKind::Kernel,
        DatapathErrorKind::Io,
        DatapathErrorKind::Invariant,
    ];

    /// A short, stable label for metrics and structured logs.
    pub fn metric_label(self) -> &'static str {
        match self {
            DatapathErrorKind::InterfaceGone => "interface_gone",
            DatapathErrorKind::Full => "full",
            DatapathErrorKind::Kernel => "kernel",
            DatapathErrorKind::Io => "io",
            DatapathErrorKind::Invariant => "invariant",
        }
    }

    /// The kind a cause says. An errno anywhere in its chain decides a gone
    /// interface or a full map; a datapath error keeps its own kind; an
    /// object of another shape than ours is our invariant; else a bare
    /// `std::io::Error` is a file's and anything else the kernel's.
    pub fn of(cause: &(dyn StdError + 'static)) -> Self {
        let mut cur = Some(cause);
        while let Some(c) = cur {
            if let Some(d) = c.downcast_ref::<DatapathError>() {
                return d.kind;
            }
            if mismatched_object(c) {
                return DatapathErrorKind::Invariant;
            }
            match errno(c) {
                Some(libc::ENODEV) => return DatapathErrorKind::InterfaceGone,
                Some(libc::E2BIG | libc::ENOSPC) => return DatapathErrorKind::Full,
                _ => {}
            }
            cur = c.source();
        }
        if cause.is::<std::io::Error>() {
            DatapathErrorKind::Io
        } else {
            DatapathErrorKind::Kernel
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{context}{}", tail(.cause.as_deref()))]
pub struct DatapathError {
    kind: DatapathErrorKind,
    /// What was being done ("writing pal_ports"), or the whole message of
    /// a failure without a cause.
    context: String,
    #[source]
    cause: Option<Cause>,
}

fn tail(cause: Option<&(dyn StdError + Send + Sync + 'static)>) -> String {
    cause.map(|c| format!(": {c}")).unwrap_or_default()
}

impl DatapathError {
    /// A failure without a cause, of the kind given.
    pub fn new(kind: DatapathErrorKind, msg: impl Into<String>) -> Self {
        DatapathError {
            kind,
            context: msg.into(),
            cause: None,
        }
    }

    /// One of our own invariants does not hold (see
    /// [`DatapathErrorKind::Invariant`]).
    pub fn invariant(msg: impl Into<String>) -> Self {
        Self::new(DatapathErrorKind::Invariant, msg)
    }

    /// `context` failed because of `cause`; the kind is the cause's (see
    /// [`DatapathErrorKind::of`]).
    pub fn caused(context: impl Display, cause: impl Into<Cause>) -> Self {
        let cause = cause.into();
        DatapathError {
            kind: DatapathErrorKind::of(&*cause),
            context: context.to_string(),
            cause: Some(cause),
        }
    }

    /// As [`caused`](Self::caused), the cause's text being its whole chain
    /// of sources: for causes whose own text does not say why (aya's
    /// "failed to create map").
    pub fn chained(context: impl Display, cause: impl StdError + Send + Sync + 'static) -> Self {
        let kind = DatapathErrorKind::of(&cause);
        DatapathError {
            kind,
            context: context.to_string(),
            cause: Some(Box::new(Chained(Box::new(cause)))),
        }
    }

    pub fn kind(&self) -> DatapathErrorKind {
        self.kind
    }

    pub fn metric_label(&self) -> &'static str {
        self.kind.metric_label()
    }

    /// What was being done, without the cause.
    pub fn context(&self) -> &str {
        &self.context
    }
}

/// A cause shown with its chain; it stands for the error it wraps, so its
/// source is that error's.
#[derive(Debug)]
struct Chained(Cause);

impl Display for Chained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&palisade_runtime::transport::source_chain(&*self.0))
    }
}

impl StdError for Chained {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

/// The errno an error carries itself (transparent variants of aya's errors
/// show it in their text but not as a source).
fn errno(e: &(dyn StdError + 'static)) -> Option<i32> {
    use aya::maps::MapError;
    use aya::programs::links::LinkError;
    use aya::programs::ProgramError;
    if let Some(e) = e.downcast_ref::<std::io::Error>() {
        return e.raw_os_error();
    }
    if let Some(e) = e.downcast_ref::<nix::errno::Errno>() {
        return Some(*e as i32);
    }
    if let Some(e) = e.downcast_ref::<aya::sys::SyscallError>() {
        return e.io_error.raw_os_error();
    }
    if let Some(e) = e.downcast_ref::<MapError>() {
        return match e {
            MapError::IoError(io) => io.raw_os_error(),
            MapError::SyscallError(s) => s.io_error.raw_os_error(),
            MapError::CreateError { io_error, .. } => io_error.raw_os_error(),
            _ => None,
        };
    }
    if let Some(e) = e.downcast_ref::<ProgramError>() {
        return match e {
            ProgramError::UnknownInterface { .. } => Some(libc::ENODEV),
            ProgramError::IOError(io) => io.raw_os_error(),
            ProgramError::SyscallError(s) => s.io_error.raw_os_error(),
            ProgramError::MapError(m) => errno(m),
            ProgramError::TcError(aya::programs::tc::TcError::IoError(io)) => io.raw_os_error(),
            _ => None,
        };
    }
    if let Some(LinkError::SyscallError(s)) = e.downcast_ref::<LinkError>() {
        return s.io_error.raw_os_error();
    }
    if let Some(aya::pin::PinError::SyscallError(s)) = e.downcast_ref::<aya::pin::PinError>() {
        return s.io_error.raw_os_error();
    }
    None
}

/// Whether aya says the object (a map or program) is not of the shape this
/// code expects.
fn mismatched_object(e: &(dyn StdError + 'static)) -> bool {
    use aya::maps::MapError;
    use aya::programs::ProgramError;
    let map = |m: &MapError| {
        matches!(
            m,
            MapError::InvalidMapType { .. }
                | MapError::InvalidKeySize { .. }
                | MapError::InvalidValueSize { .. }
                | MapError::InvalidValueStride { .. }
                | MapError::InvalidName { .. }
        )
    };
    if let Some(m) = e.downcast_ref::<MapError>() {
        return map(m);
    }
    if let Some(p) = e.downcast_ref::<ProgramError>() {
        return match p {
            ProgramError::UnexpectedProgramType | ProgramError::InvalidName { .. } => true,
            ProgramError::MapError(m) => map(m),
            _ => false,
        };
    }
    if let Some(aya::EbpfError::MapError(m)) = e.downcast_ref::<aya::EbpfError>() {
        return map(m);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(errno: i32) -> std::io::Error {
        std::io::Error::from_raw_os_error(errno)
    }

    #[test]
    fn the_text_is_the_context_then_the_cause_and_the_cause_is_the_source() {
        let e = DatapathError::caused("writing pal_ports", io(libc::EPERM));
        assert_eq!(
            e.to_string(),
            format!("writing pal_ports: {}", io(libc::EPERM))
        );
        let source = StdError::source(&e).expect("a source");
        assert_eq!(
            source
                .downcast_ref::<std::io::Error>()
                .unwrap()
                .raw_os_error(),
            Some(libc::EPERM)
        );
        let plain = DatapathError::invariant("map pal_ports missing from object");
        assert_eq!(plain.to_string(), "map pal_ports missing from object");
        assert!(StdError::source(&plain).is_none());
        // A text cause reads as it did.
        let text = DatapathError::caused("pal_ct4", "batch lookup: EPERM".to_string());
        assert_eq!(text.to_string(), "pal_ct4: batch lookup: EPERM");
    }

    #[test]
    fn the_kind_follows_the_errno_and_nested_errors_keep_theirs() {
        use DatapathErrorKind::*;
        let kind = |e: DatapathError| e.kind();
        assert_eq!(
            kind(DatapathError::caused("x", nix::errno::Errno::ENODEV)),
            InterfaceGone
        );
        let unknown = aya::programs::ProgramError::UnknownInterface { name: "v".into() };
        assert_eq!(
            kind(DatapathError::caused("attaching", unknown)),
            InterfaceGone
        );
        let full = aya::maps::MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_update_elem",
            io_error: io(libc::E2BIG),
        });
        assert_eq!(kind(DatapathError::caused("writing", full)), Full);
        let refused = aya::maps::MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_update_elem",
            io_error: io(libc::EPERM),
        });
        assert_eq!(kind(DatapathError::caused("writing", refused)), Kernel);
        let shape = aya::maps::MapError::InvalidMapType { map_type: 9 };
        assert_eq!(kind(DatapathError::caused("pal_ports", shape)), Invariant);
        assert_eq!(
            kind(DatapathError::caused("unpinning", io(libc::EBUSY))),
            Io
        );
        // Wrapped again, it is still what it was.
        let inner = DatapathError::caused("x", io(libc::ENOSPC));
        let outer = DatapathError::caused("writing the endpoint of ifindex 3", inner);
        assert_eq!(outer.kind(), Full);
        assert_eq!(outer.metric_label(), "full");
        assert_eq!(
            DatapathError::invariant("no endpoint").metric_label(),
            "invariant"
        );
    }

    #[test]
    fn a_chained_cause_shows_its_chain_once() {
        let create = aya::maps::MapError::CreateError {
            name: "pal_ct4".into(),
            io_error: io(libc::EPERM),
        };
        let e = DatapathError::chained("loading the eBPF object", create);
        assert_eq!(
            e.to_string(),
            format!(
                "loading the eBPF object: failed to create map `pal_ct4`: {}",
                io(libc::EPERM)
            )
        );
        assert_eq!(e.kind(), DatapathErrorKind::Kernel);
    }
}
