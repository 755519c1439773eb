//! The few rtnetlink messages the enforcer sends itself: framing of
//! requests (header, fixed body, attributes, nested attributes) and
//! reading of answers (acks, dump parts), over one `NETLINK_ROUTE` socket.
//!
//! Hand-written rather than a netlink crate: the enforcer needs a handful
//! of messages, on the pod-up path, where one socket and one `sendmsg` for
//! several requests matter (see `bpf::filters`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub const NLMSG_HDRLEN: usize = 16;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
/// Set on an attribute whose value is more attributes.
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// Why a netlink exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The socket, or the kernel's answer to one request (its errno).
    #[error("rtnetlink: {0}")]
    Io(#[from] std::io::Error),
    #[error("rtnetlink: malformed answer: {0}")]
    Malformed(String),
}

impl NetlinkError {
    /// The errno the kernel answered with, if that is what this is.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Io(e) => e.raw_os_error(),
            NetlinkError::Malformed(_) => None,
        }
    }
}

pub fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// One request: the header, then the message's fixed body, then
/// attributes; [`Request::finish`] writes the length.
pub struct Request {
    buf: Vec<u8>,
    /// Where each open nested attribute starts.
    open: Vec<usize>,
}

impl Request {
    pub fn new(kind: u16, flags: u16, seq: u32, body: &[u8]) -> Request {
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(body);
        buf.resize(align4(buf.len()), 0);
        Request {
            buf,
            open: Vec::new(),
        }
    }

    pub fn attr(&mut self, kind: u16, value: &[u8]) -> &mut Self {
        self.buf
            .extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    pub fn attr_u32(&mut self, kind: u16, value: u32) -> &mut Self {
        self.attr(kind, &value.to_ne_bytes())
    }

    /// A NUL-terminated string attribute.
    pub fn attr_str(&mut self, kind: u16, value: &str) -> &mut Self {
        let mut v = value.as_bytes().to_vec();
        v.push(0);
        self.attr(kind, &v)
    }

    pub fn begin_nested(&mut self, kind: u16) -> &mut Self {
        self.open.push(self.buf.len());
        self.attr(kind | NLA_F_NESTED, &[])
    }

    pub fn end_nested(&mut self) -> &mut Self {
        let start = self.open.pop().expect("a nested attribute is open");
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    pub fn finish(mut self) -> Vec<u8> {
        assert!(self.open.is_empty(), "a nested attribute is left open");
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf
    }
}

/// One message of an answer.
pub struct Message<'a> {
    pub kind: u16,
    pub seq: u32,
    /// After the header.
    pub body: &'a [u8],
}

impl Message<'_> {
    /// For NLMSG_ERROR: 0 (an ack) or the errno the request failed with.
    pub fn errno(&self) -> Result<i32, NetlinkError> {
        if self.body.len() < 4 {
            return Err(NetlinkError::Malformed(format!(
                "an error message of {} bytes",
                self.body.len()
            )));
        }
        Ok(-(u32_at(self.body, 0) as i32))
    }
}

/// The messages of one datagram.
pub fn messages(mut b: &[u8]) -> Result<Vec<Message<'_>>, NetlinkError> {
    let mut out = Vec::new();
    while !b.is_empty() {
        if b.len() < NLMSG_HDRLEN {
            return Err(NetlinkError::Malformed(format!(
                "{} bytes left, less than a message header",
                b.len()
            )));
        }
        let len = u32_at(b, 0) as usize;
        if len < NLMSG_HDRLEN || len > b.len() {
            return Err(NetlinkError::Malformed(format!(
                "message length {len} with {} bytes left",
                b.len()
            )));
        }
        out.push(Message {
            kind: u16_at(b, 4),
            seq: u32_at(b, 8),
            body: &b[NLMSG_HDRLEN..len],
        });
        b = &b[align4(len).min(b.len())..];
    }
    Ok(out)
}

/// The attributes in `b`, as (type without flags, value).
pub fn attributes(mut b: &[u8]) -> Result<Vec<(u16, &[u8])>, NetlinkError> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let len = u16_at(b, 0) as usize;
        if len < 4 || len > b.len() {
            return Err(NetlinkError::Malformed(format!(
                "attribute length {len} with {} bytes left",
                b.len()
            )));
        }
        out.push((u16_at(b, 2) & NLA_TYPE_MASK, &b[4..len]));
        b = &b[align4(len).min(b.len())..];
    }
    Ok(out)
}

/// A string attribute's value, without its NUL.
pub fn attr_string(value: &[u8]) -> &[u8] {
    value.split(|&c| c == 0).next().unwrap_or(value)
}

/// A `NETLINK_ROUTE` socket.
pub struct Socket(OwnedFd);

impl Socket {
    pub fn open() -> std::io::Result<Socket> {
        // SAFETY: a plain socket syscall; the fd is owned right away.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by socket and nothing else owns it.
        Ok(Socket(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Sends `requests` in one datagram: the kernel handles them in order,
    /// answering each.
    pub fn send(&self, requests: &[Vec<u8>]) -> std::io::Result<()> {
        let buf: Vec<u8> = requests.concat();
        let mut to: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        to.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: sending an owned buffer to a zeroed kernel address.
        let n = unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                0,
                &to as *const libc::sockaddr_nl as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// One datagram into `buf`; its length.
    pub fn recv(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            // SAFETY: reading into an owned buffer of the given length.
            let n =
                unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Sends requests that each ask for an ack (sequence numbers `seqs`,
    /// in order) and returns each one's errno (0: done), in that order.
    pub fn acked(&self, requests: &[Vec<u8>], seqs: &[u32]) -> Result<Vec<i32>, NetlinkError> {
        self.send(requests)?;
        let mut answers: Vec<Option<i32>> = vec![None; seqs.len()];
        let mut buf = vec![0u8; 16 * 1024];
        while answers.iter().any(Option::is_none) {
            let n = self.recv(&mut buf)?;
            for m in messages(&buf[..n])? {
                if m.kind != NLMSG_ERROR {
                    continue;
                }
                if let Some(i) = seqs.iter().position(|&s| s == m.seq) {
                    answers[i] = Some(m.errno()?);
                }
            }
        }
        Ok(answers.into_iter().map(|a| a.unwrap_or(0)).collect())
    }

    /// Sends one dump request (sequence `seq`) and hands every message of
    /// the answer to `each` until the dump is done.
    pub fn dump(
        &self,
        request: Vec<u8>,
        seq: u32,
        mut each: impl FnMut(&Message<'_>) -> Result<(), NetlinkError>,
    ) -> Result<(), NetlinkError> {
        self.send(&[request])?;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = self.recv(&mut buf)?;
            for m in messages(&buf[..n])? {
                if m.seq != seq {
                    continue;
                }
                match m.kind {
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => match m.errno()? {
                        0 => {}
                        errno => return Err(std::io::Error::from_raw_os_error(errno).into()),
                    },
                    _ => each(&m)?,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_with_nested_attributes_frames_and_reads_back() {
        let mut r = Request::new(44, NLM_F_REQUEST | NLM_F_ACK, 7, &[1, 2, 3]);
        r.attr_str(1, "bpf")
            .begin_nested(2)
            .attr_u32(6, 42)
            .attr_str(7, "x")
            .end_nested();
        let b = r.finish();
        assert_eq!(b.len() % 4, 0);
        let ms = messages(&b).unwrap();
        assert_eq!(ms.len(), 1);
        assert_eq!((ms[0].kind, ms[0].seq), (44, 7));
        // The body is padded to 4 bytes before the attributes.
        let attrs = attributes(&ms[0].body[4..]).unwrap();
        assert_eq!(attrs.len(), 2);
        assert_eq!((attrs[0].0, attr_string(attrs[0].1)), (1, &b"bpf"[..]));
        assert_eq!(attrs[1].0, 2, "the nested flag is not part of the type");
        let inner = attributes(attrs[1].1).unwrap();
        assert_eq!(inner[0], (6, &42u32.to_ne_bytes()[..]));
        assert_eq!((inner[1].0, attr_string(inner[1].1)), (7, &b"x"[..]));
    }

    #[test]
    fn damaged_answers_are_errors() {
        assert!(messages(&[1, 2, 3]).is_err());
        let mut m = Request::new(2, 0, 1, &[]).finish();
        m[0] = 200;
        assert!(messages(&m).is_err(), "a length past the datagram");
        assert!(
            attributes(&[9, 0, 1, 0]).is_err(),
            "an attribute past the bytes"
        );
        assert!(
            attributes(&[2, 0, 1, 0]).is_err(),
            "an attribute shorter than its header"
        );
        let short_error = Message {
            kind: NLMSG_ERROR,
            seq: 1,
            body: &[0, 0],
        };
        assert!(short_error.errno().is_err());
    }
}
