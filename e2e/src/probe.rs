//! One probe: real traffic from inside a pod's namespace to a target.
//!
//! The verdict is about the network, not the server: a TCP reset or an ICMP
//! port unreachable means the packets got through, so it is an allow.
//! Silence until the timeout is a deny.

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use crate::netns::NetNs;
use crate::scenario::{Protocol, Verdict};

const PAYLOAD: &[u8] = b"palisade-lab-probe";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The server echoed our payload.
    Echo,
    /// Connection refused (TCP RST or ICMP port unreachable).
    Refused,
    /// Nothing came back before the timeout.
    Timeout,
    /// The TCP handshake completed but the echo never came.
    NoEcho,
    /// Anything else (no route, the probe could not run...): never matches.
    Error(String),
}

impl Outcome {
    pub fn verdict(&self) -> Option<Verdict> {
        match self {
            Self::Echo | Self::Refused => Some(Verdict::Allow),
            Self::Timeout | Self::NoEcho => Some(Verdict::Deny),
            Self::Error(_) => None,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Echo => f.write_str("allow"),
            Self::Refused => f.write_str("allow (refused)"),
            Self::Timeout => f.write_str("deny"),
            Self::NoEcho => f.write_str("deny (connected, no echo)"),
            Self::Error(e) => write!(f, "error: {e}"),
        }
    }
}

pub fn run(from: &NetNs, to: SocketAddr, protocol: Protocol, timeout: Duration) -> Outcome {
    let result = from.run(move || match protocol {
        Protocol::Tcp => tcp(to, timeout),
        Protocol::Udp => udp(to, timeout),
        Protocol::Sctp => Outcome::Error("SCTP probes are not supported".into()),
    });
    result.unwrap_or_else(|e| Outcome::Error(format!("{e:#}")))
}

fn is_timeout(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::TimedOut | ErrorKind::WouldBlock)
}

fn tcp(to: SocketAddr, timeout: Duration) -> Outcome {
    let start = Instant::now();
    match tcp_connect(to, timeout) {
        Ok(mut stream) => echo(&mut stream, timeout.saturating_sub(start.elapsed())),
        Err(outcome) => outcome,
    }
}

fn tcp_connect(to: SocketAddr, timeout: Duration) -> Result<TcpStream, Outcome> {
    match TcpStream::connect_timeout(&to, timeout) {
        Ok(s) => Ok(s),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Err(Outcome::Refused),
        Err(e) if is_timeout(e.kind()) => Err(Outcome::Timeout),
        Err(e) => Err(Outcome::Error(format!("connect: {e}"))),
    }
}

/// Sends the payload on an established connection and waits for the echo.
pub fn echo(stream: &mut TcpStream, timeout: Duration) -> Outcome {
    let timeout = timeout.max(Duration::from_millis(1));
    if let Err(e) = stream.set_read_timeout(Some(timeout)) {
        return Outcome::Error(format!("set timeout: {e}"));
    }
    if let Err(e) = stream.write_all(PAYLOAD) {
        return Outcome::Error(format!("send: {e}"));
    }
    let mut buf = [0u8; PAYLOAD.len()];
    match stream.read_exact(&mut buf) {
        Ok(()) if buf == PAYLOAD => Outcome::Echo,
        Ok(()) => Outcome::Error("the echo did not match what was sent".into()),
        Err(e) if is_timeout(e.kind()) => Outcome::NoEcho,
        Err(e) => Outcome::Error(format!("read: {e}")),
    }
}

/// A TCP connection opened from inside `from`, kept open by the caller (to
/// check that established flows survive policy changes or restarts).
pub fn connect(from: &NetNs, to: SocketAddr, timeout: Duration) -> Result<TcpStream, Outcome> {
    from.run(move || tcp_connect(to, timeout))
        .unwrap_or_else(|e| Err(Outcome::Error(format!("{e:#}"))))
}

fn udp(to: SocketAddr, timeout: Duration) -> Outcome {
    let attempt = || -> std::io::Result<Vec<u8>> {
        let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        // Connected, so an ICMP port unreachable surfaces as ECONNREFUSED.
        sock.connect(to)?;
        sock.set_read_timeout(Some(timeout))?;
        sock.send(PAYLOAD)?;
        let mut buf = [0u8; 64];
        let n = sock.recv(&mut buf)?;
        Ok(buf[..n].to_vec())
    };
    match attempt() {
        Ok(data) if data == PAYLOAD => Outcome::Echo,
        Ok(_) => Outcome::Error("the echo did not match what was sent".into()),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Outcome::Refused,
        Err(e) if is_timeout(e.kind()) => Outcome::Timeout,
        Err(e) => Outcome::Error(e.to_string()),
    }
}
