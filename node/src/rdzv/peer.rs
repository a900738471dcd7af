//! Who is at the other end of a loopback TCP connection: the uid that owns the peer's socket,
//! read from the kernel's socket tables (`/proc/net/tcp`, `/proc/net/tcp6`), since TCP carries
//! no credentials. A job's store answers only its own user's processes and root's.

use std::net::SocketAddr;

/// TCP's ESTABLISHED state in the tables.
const ESTABLISHED: &str = "01";

/// The uid owning the socket whose local port is `peer`'s and remote port `ours`'s, among the
/// lines of a socket table; `None` when no line matches.
pub fn uid_in_table(table: &str, peer: SocketAddr, ours: SocketAddr) -> Option<u32> {
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (local, remote, state, uid) = (f.get(1)?, f.get(2)?, f.get(3)?, f.get(7)?);
        let port = |addr: &str| addr.rsplit_once(':').and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
        let matches = *state == ESTABLISHED && port(local) == Some(peer.port()) && port(remote) == Some(ours.port());
        matches.then(|| uid.parse().ok()).flatten()
    })
}

/// The uid owning the peer's end of a loopback connection from `peer` to `ours`.
pub fn uid_of(peer: SocketAddr, ours: SocketAddr) -> Option<u32> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok().and_then(|t| uid_in_table(&t, peer, ours)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peers_own_line_gives_its_uid_whatever_its_address_family() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:AD83 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:B84A 0100007F:AD83 01 00000000:00000000 00:00000000 00000000  1000        0 2 1 0 20 4 30 10 -1
   2: 0100007F:AD83 0100007F:B84A 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 20 4 30 10 -1
";
        let (peer, ours): (SocketAddr, SocketAddr) = ("127.0.0.1:47178".parse().unwrap(), "127.0.0.1:44419".parse().unwrap());
        assert_eq!(uid_in_table(v4, peer, ours), Some(1000), "the client's line, not the server's");
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000100007F:B84A 0000000000000000FFFF00000100007F:AD83 01 00000000:00000000 00:00000000 00000000  1001        0 9 1 0 20 4 30 10 -1
";
        assert_eq!(uid_in_table(v6, peer, ours), Some(1001));
        assert_eq!(uid_in_table(v4, "127.0.0.1:1".parse().unwrap(), ours), None);
    }
}
