//! systemd integration: readiness and status notifications for `Type=notify` units.

use tracing::warn;

/// Tells systemd (`Type=notify`) about a state change; nothing when not run by systemd.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let result = std::os::unix::net::UnixDatagram::unbound().and_then(|sock| {
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
        if let Some(name) = bytes.strip_prefix(b"@") {
            let addr = <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)
        } else {
            sock.send_to(state.as_bytes(), &path)
        }
    });
    if let Err(e) = result {
        warn!(error = %e, state, "notify systemd");
    }
}
