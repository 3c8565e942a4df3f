//! The original destination of a connection that iptables' `REDIRECT` sent to us
//! (`getsockopt(SOL_IP, SO_ORIGINAL_DST)`).

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;

/// `SO_ORIGINAL_DST` from `linux/netfilter_ipv4.h`.
const SO_ORIGINAL_DST: libc::c_int = 80;

/// Where the connection on `socket` was going before it was redirected. Fails for a
/// connection that was not redirected (no conntrack NAT entry) and for IPv6.
pub fn original_dst(socket: &impl AsRawFd) -> io::Result<SocketAddr> {
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `addr` is a valid, writable sockaddr_in and `len` holds its size; the kernel
    // writes at most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_IP,
            SO_ORIGINAL_DST,
            (&mut addr as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let ip = Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
    Ok(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(addr.sin_port))))
}
