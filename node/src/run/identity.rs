//! Local user accounts: names for the uids the local socket reports, and the uid, gid and
//! supplementary groups a job runs with. Reads the system's user database (NSS) through libc.

use std::ffi::{CStr, CString};

/// A local account as a job runs with it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    /// Supplementary groups, the primary one included.
    pub groups: Vec<u32>,
}

/// The most groups one account may have here.
const GROUPS_MAX: usize = 1024;

fn passwd_to_account(pw: &libc::passwd) -> Option<Account> {
    // SAFETY: getpwnam_r/getpwuid_r filled `pw` with pointers into our buffer, NUL-terminated.
    let name = unsafe { CStr::from_ptr(pw.pw_name) }.to_str().ok()?.to_string();
    let home = if pw.pw_dir.is_null() { String::new() } else { unsafe { CStr::from_ptr(pw.pw_dir) }.to_string_lossy().into_owned() };
    let groups = groups_of(&name, pw.pw_gid);
    Some(Account { name, uid: pw.pw_uid, gid: pw.pw_gid, home, groups })
}

fn groups_of(name: &str, gid: u32) -> Vec<u32> {
    let Ok(cname) = CString::new(name) else { return vec![gid] };
    let mut n: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let mut count = n;
        // SAFETY: `groups` has room for `count` entries; getgrouplist writes at most that many.
        let rc = unsafe { libc::getgrouplist(cname.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(count.max(0) as usize);
            return groups;
        }
        if count as usize > GROUPS_MAX || count <= n {
            return vec![gid];
        }
        n = count;
    }
}

/// The names of groups `gids` (those without a name here left out).
pub fn group_names(gids: &[u32]) -> Vec<String> {
    let mut names = Vec::with_capacity(gids.len());
    for &gid in gids {
        let mut buf = vec![0 as libc::c_char; 64 * 1024];
        // SAFETY: zeroed group is a valid out-parameter; getgrgid_r fills it from `buf`.
        let mut gr: libc::group = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the sizes given.
        let rc = unsafe { libc::getgrgid_r(gid, &mut gr, buf.as_mut_ptr(), buf.len(), &mut result) };
        if rc == 0 && !result.is_null() && !gr.gr_name.is_null() {
            // SAFETY: getgrgid_r filled `gr_name` with a NUL-terminated string in `buf`.
            names.push(unsafe { CStr::from_ptr(gr.gr_name) }.to_string_lossy().into_owned());
        }
    }
    names
}

/// Looks up an account by name; none when the name is unknown here.
pub fn by_name(name: &str) -> Option<Account> {
    let cname = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: zeroed passwd is a valid out-parameter; getpwnam_r fills it from `buf`.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the sizes given.
    let rc = unsafe { libc::getpwnam_r(cname.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc != 0 || result.is_null() {
        return None;
    }
    passwd_to_account(&pw)
}

/// Looks up an account by uid; none when no account has it.
pub fn by_uid(uid: u32) -> Option<Account> {
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: as in `by_name`.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the sizes given.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc != 0 || result.is_null() {
        return None;
    }
    passwd_to_account(&pw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_found_both_ways_and_unknown_names_are_not() {
        let root = by_name("root").expect("root exists");
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(root.groups.contains(&0));
        assert_eq!(by_uid(0).map(|a| a.name), Some("root".to_string()));
        assert_eq!(by_name("no-such-user-corral"), None);
        assert_eq!(by_name("bad\0name"), None);
    }
}
