//! One probe: real traffic from inside a pod's namespace to a target.
//!
//! The verdict is about the network, not the server: a TCP reset or an ICMP
//! port unreachable means the packets got through, so it is an allow.
//! Silence until the timeout is a deny.

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket};
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::forge;

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
        Protocol::Sctp => match to {
            SocketAddr::V4(v4) => crate::sctp::probe(v4, timeout),
            SocketAddr::V6(_) => Outcome::Error("SCTP probes are IPv4 only".into()),
        },
    });
    result.unwrap_or_else(|e| Outcome::Error(format!("{e:#}")))
}

/// The forged-reply probe: from `me` (the pod's own address), first the
/// crafted packets of [`forge::reply_forgeries`] naming source port
/// `my_port`, then a real TCP connection from that very port.
pub fn run_forged(
    from: &NetNs,
    me: Ipv4Addr,
    my_port: u16,
    to: SocketAddrV4,
    timeout: Duration,
) -> Outcome {
    let result = from.run(move || {
        let forged = forge::reply_forgeries(me, my_port, *to.ip(), to.port());
        let sent = forge::default_gateway()
            .and_then(|gw| forge::gateway_mac(gw, Duration::from_secs(2)))
            .and_then(|mac| forge::send(crate::cni::IFNAME, mac, &forged));
        match sent {
            Ok(()) => tcp_from_port(my_port, to, timeout),
            Err(e) => Outcome::Error(format!("forging: {e:#}")),
        }
    });
    result.unwrap_or_else(|e| Outcome::Error(format!("{e:#}")))
}

/// A TCP probe whose socket is bound to `port`, so that it is the flow the
/// forged packets named.
fn tcp_from_port(port: u16, to: SocketAddrV4, timeout: Duration) -> Outcome {
    let start = Instant::now();
    match connect_from(port, to, timeout) {
        Ok(mut stream) => echo(&mut stream, timeout.saturating_sub(start.elapsed())),
        Err(outcome) => outcome,
    }
}

fn sockaddr(addr: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*addr.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// A TCP connection from inside `from` bound to source port `port`, for
/// flows that must reuse a 5-tuple.
pub fn connect_bound(
    from: &NetNs,
    port: u16,
    to: SocketAddrV4,
    timeout: Duration,
) -> Result<TcpStream, Outcome> {
    from.run(move || connect_from(port, to, timeout))
        .unwrap_or_else(|e| Err(Outcome::Error(format!("{e:#}"))))
}

/// Closes with a reset (SO_LINGER 0): no TIME_WAIT, so the same 5-tuple can
/// be connected again at once.
pub fn abort(stream: TcpStream) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket fd and a live linger struct of the right size.
    let r = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as u32,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    drop(stream);
    Ok(())
}

/// A connected UDP socket from inside `from`: a UDP "connection" whose
/// datagrams all share one 5-tuple.
pub fn connect_udp(from: &NetNs, to: SocketAddr) -> Result<UdpSocket, Outcome> {
    from.run(move || {
        let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        sock.connect(to)?;
        Ok::<_, std::io::Error>(sock)
    })
    .map_err(|e| Outcome::Error(format!("{e:#}")))?
    .map_err(|e| Outcome::Error(format!("udp socket: {e}")))
}

/// Sends the payload on a connected UDP socket and waits for the echo.
pub fn udp_echo(sock: &UdpSocket, timeout: Duration) -> Outcome {
    udp_exchange(sock, timeout, Outcome::NoEcho)
}

/// One datagram out and its echo back on a connected socket; silence until
/// `timeout` is `silence` (a deny, or no echo on a flow already open).
fn udp_exchange(sock: &UdpSocket, timeout: Duration, silence: Outcome) -> Outcome {
    let attempt = || -> std::io::Result<Vec<u8>> {
        sock.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
        sock.send(PAYLOAD)?;
        let mut buf = [0u8; 64];
        let n = sock.recv(&mut buf)?;
        Ok(buf[..n].to_vec())
    };
    match attempt() {
        Ok(data) if data == PAYLOAD => Outcome::Echo,
        Ok(_) => Outcome::Error("the echo did not match what was sent".into()),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Outcome::Refused,
        Err(e) if is_timeout(e.kind()) => silence,
        Err(e) => Outcome::Error(e.to_string()),
    }
}

fn connect_from(port: u16, to: SocketAddrV4, timeout: Duration) -> Result<TcpStream, Outcome> {
    let os = |what: &str| Outcome::Error(format!("{what}: {}", std::io::Error::last_os_error()));
    let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
    // SAFETY: socket returns a new fd or -1; OwnedFd closes it on every path.
    let raw = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if raw < 0 {
        return Err(os("socket"));
    }
    // SAFETY: raw is a fresh fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    use std::os::fd::AsRawFd;
    let one: libc::c_int = 1;
    let local = sockaddr(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port));
    let remote = sockaddr(to);
    // SAFETY: the pointers reference live locals of the right sizes.
    unsafe {
        if libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        ) != 0
        {
            return Err(os("SO_REUSEADDR"));
        }
        if libc::bind(
            fd.as_raw_fd(),
            (&local as *const libc::sockaddr_in).cast(),
            len,
        ) != 0
        {
            return Err(os(&format!("binding source port {port}")));
        }
        if libc::connect(
            fd.as_raw_fd(),
            (&remote as *const libc::sockaddr_in).cast(),
            len,
        ) != 0
            && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINPROGRESS)
        {
            return Err(os("connect"));
        }
    }
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
    if ready < 0 {
        return Err(os("poll"));
    }
    if ready == 0 {
        return Err(Outcome::Timeout);
    }
    let mut err: libc::c_int = 0;
    let mut err_len = std::mem::size_of::<libc::c_int>() as u32;
    // SAFETY: err and err_len are live locals of the right sizes.
    if unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut err as *mut libc::c_int).cast(),
            &mut err_len,
        )
    } != 0
    {
        return Err(os("SO_ERROR"));
    }
    match err {
        0 => {}
        libc::ECONNREFUSED => return Err(Outcome::Refused),
        libc::ETIMEDOUT => return Err(Outcome::Timeout),
        e => {
            return Err(Outcome::Error(format!(
                "connect: {}",
                std::io::Error::from_raw_os_error(e)
            )))
        }
    }
    let stream = TcpStream::from(fd);
    stream
        .set_nonblocking(false)
        .map_err(|e| Outcome::Error(format!("set blocking: {e}")))?;
    Ok(stream)
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
    let open = || -> std::io::Result<UdpSocket> {
        let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        // Connected, so an ICMP port unreachable surfaces as ECONNREFUSED.
        sock.connect(to)?;
        Ok(sock)
    };
    match open() {
        Ok(sock) => udp_exchange(&sock, timeout, Outcome::Timeout),
        Err(e) => Outcome::Error(e.to_string()),
    }
}
