//! GPU device fencing on cgroup v2: an eBPF device program (`BPF_PROG_TYPE_CGROUP_DEVICE`)
//! attached to a job run's cgroup denies the character devices of the GPUs the run was not
//! given, as the v1 `devices` controller's `devices.deny` does on hybrid hosts (and as Slurm's
//! `ConstrainDevices=yes` and systemd's `DeviceAllow=` do on v2).
//!
//! The program is built here as plain BPF instructions (no compiler, no object file): it
//! allows every access except to a character device in the deny list. The kernel runs it for
//! each `open`/`mknod` of a device file by any process in the cgroup or below it; the program is
//! attached with `BPF_F_ALLOW_MULTI`, so a program that systemd attached above still runs too
//! (the kernel allows an access only when every program allows it). The attachment holds the
//! program: it goes when the run's cgroup is removed.
//!
//! Loading needs `CAP_BPF` and `CAP_SYS_ADMIN` (root); [`probe`] says at start whether it
//! works here, so the node never claims a fence it cannot build.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// Most device numbers one program denies (4 instructions each; far under the verifier's
/// limits). A node has at most a few dozen GPU device files.
pub const DENY_MAX: usize = 512;
/// Bytes of verifier log kept when a load fails.
const VERIFIER_LOG_BYTES: usize = 16 * 1024;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 1 << 1;
/// `bpf_cgroup_dev_ctx.access_type`'s low 16 bits: the device's type.
const BPF_DEVCG_DEV_CHAR: i32 = 2;

/// Why a device program could not be put in place.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    #[error("{count} device numbers to deny, more than {DENY_MAX}")]
    TooMany { count: usize },
    #[error("open cgroup {path}: {source}")]
    OpenCgroup { path: String, source: std::io::Error },
    #[error("load the device program: {source}{}", if log.is_empty() { String::new() } else { format!(" (verifier: {log})") })]
    Load { source: std::io::Error, log: String },
    #[error("attach the device program to {path}: {source}")]
    Attach { path: String, source: std::io::Error },
    #[error("{what} {path}: {source}")]
    Probe { what: &'static str, path: String, source: std::io::Error },
}

/// One BPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    /// Destination register in the low nibble, source in the high one.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

// The opcodes the program uses.
/// `dst = *(u32 *)(src + off)`.
const LDX_MEM_W: u8 = 0x61;
/// `dst &= imm` (64-bit).
const ALU64_AND_K: u8 = 0x57;
/// `dst = imm` (64-bit).
const ALU64_MOV_K: u8 = 0xb7;
/// `if dst != imm goto +off`.
const JMP_JNE_K: u8 = 0x55;
/// `return r0`.
const JMP_EXIT: u8 = 0x95;

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn { code, regs: (src << 4) | (dst & 0x0f), off, imm }
}

/// The program for `deny`: r1 is `struct bpf_cgroup_dev_ctx { u32 access_type, major, minor }`.
/// Returns 0 (deny) for a character device in `deny`, 1 (allow) for anything else.
pub fn program(deny: &[(u32, u32)]) -> Result<Vec<Insn>, FenceError> {
    if deny.len() > DENY_MAX {
        return Err(FenceError::TooMany { count: deny.len() });
    }
    let per_entry = 4i16;
    let mut p = vec![
        insn(LDX_MEM_W, 2, 1, 0, 0),        // r2 = access_type
        insn(ALU64_AND_K, 2, 0, 0, 0xffff), // r2 = device type
        insn(LDX_MEM_W, 3, 1, 4, 0),        // r3 = major
        insn(LDX_MEM_W, 4, 1, 8, 0),        // r4 = minor
        // Not a character device: allow (skip every entry).
        insn(JMP_JNE_K, 2, 0, per_entry * deny.len() as i16, BPF_DEVCG_DEV_CHAR),
    ];
    for &(major, minor) in deny {
        // Numbers above i32::MAX cannot be device numbers (major < 2^12, minor < 2^20).
        let (Ok(major), Ok(minor)) = (i32::try_from(major), i32::try_from(minor)) else { continue };
        p.push(insn(JMP_JNE_K, 3, 0, 3, major));
        p.push(insn(JMP_JNE_K, 4, 0, 2, minor));
        p.push(insn(ALU64_MOV_K, 0, 0, 0, 0));
        p.push(insn(JMP_EXIT, 0, 0, 0, 0));
    }
    // Entries skipped above shorten the program: the type check must still land on "allow".
    let entries = ((p.len() - 5) / 4) as i16;
    p[4].off = per_entry * entries;
    p.push(insn(ALU64_MOV_K, 0, 0, 0, 1));
    p.push(insn(JMP_EXIT, 0, 0, 0, 0));
    Ok(p)
}

/// `struct bpf_attr` for `BPF_PROG_LOAD`, as far as the fields used (the kernel wants the
/// rest of the size it is told zero).
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
}

/// `struct bpf_attr` for `BPF_PROG_ATTACH`.
#[repr(C)]
#[derive(Default)]
struct ProgAttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<i64> {
    // SAFETY: `attr` is a live, fully initialized `#[repr(C)]` bpf_attr prefix of the size
    // passed; the kernel reads (and for a log, writes through pointers into) memory we own.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>() as libc::c_uint) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Loads the program for `deny`; the descriptor holds it until attached or dropped.
fn load(deny: &[(u32, u32)]) -> Result<OwnedFd, FenceError> {
    let insns = program(deny)?;
    let license = b"GPL\0";
    let mut log = vec![0u8; VERIFIER_LOG_BYTES];
    let mut name = [0u8; 16];
    name[..14].copy_from_slice(b"corral_devices");
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        prog_name: name,
        ..Default::default()
    };
    match bpf(BPF_PROG_LOAD, &mut attr) {
        // SAFETY: BPF_PROG_LOAD returned a new descriptor that nothing else owns.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) }),
        Err(source) => {
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let last: Vec<&str> = text.lines().rev().take(3).collect();
            Err(FenceError::Load { source, log: last.into_iter().rev().collect::<Vec<_>>().join("; ") })
        }
    }
}

/// Attaches a program denying `deny` to the cgroup (v2) at `dir`, before any process joins it.
pub fn attach(dir: &Path, deny: &[(u32, u32)]) -> Result<(), FenceError> {
    let prog = load(deny)?;
    let cgroup = std::fs::File::open(dir).map_err(|source| FenceError::OpenCgroup { path: dir.display().to_string(), source })?;
    let mut attr = ProgAttachAttr {
        target_fd: cgroup.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
        ..Default::default()
    };
    bpf(BPF_PROG_ATTACH, &mut attr).map_err(|source| FenceError::Attach { path: dir.display().to_string(), source })?;
    Ok(())
}

/// Whether device programs can be loaded and attached below `base` here: attaches one that
/// denies nothing to a fresh child cgroup, then removes that cgroup.
pub fn probe(base: &Path) -> Result<(), FenceError> {
    let dir = base.join("devices-probe");
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(FenceError::Probe { what: "create cgroup", path: dir.display().to_string(), source }),
    }
    let attached = attach(&dir, &[]);
    let removed =
        std::fs::remove_dir(&dir).map_err(|source| FenceError::Probe { what: "remove cgroup", path: dir.display().to_string(), source });
    attached.and(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the program on one access as the kernel would, for the opcodes it uses; a step
    /// bound keeps a bad jump from looping.
    fn run(p: &[Insn], access_type: u32, major: u32, minor: u32) -> u64 {
        let ctx = [access_type, major, minor];
        let mut r = [0u64; 11];
        let mut pc = 0usize;
        for _ in 0..10_000 {
            let i = p[pc];
            let (dst, src) = ((i.regs & 0x0f) as usize, (i.regs >> 4) as usize);
            assert!(dst <= 10 && src <= 10);
            pc += 1;
            match i.code {
                LDX_MEM_W => {
                    assert_eq!(src, 1, "loads only from the context");
                    r[dst] = u64::from(ctx[i.off as usize / 4]);
                }
                ALU64_AND_K => r[dst] &= i.imm as i64 as u64,
                ALU64_MOV_K => r[dst] = i.imm as i64 as u64,
                JMP_JNE_K => {
                    if r[dst] != i.imm as i64 as u64 {
                        pc = (pc as i64 + i64::from(i.off)) as usize;
                    }
                }
                JMP_EXIT => return r[0],
                other => panic!("opcode {other:#x}"),
            }
        }
        panic!("no exit in 10,000 steps");
    }

    const CHAR: u32 = 2;
    const BLOCK: u32 = 1;
    const READ_WRITE: u32 = 3 << 16;

    #[test]
    fn the_program_denies_exactly_the_listed_character_devices() {
        let deny = [(195, 1), (195, 3), (237, 12)];
        let p = program(&deny).expect("program");
        assert_eq!(p.len(), 5 + 4 * deny.len() + 2);
        for (major, minor) in deny {
            assert_eq!(run(&p, READ_WRITE | CHAR, major, minor), 0, "{major}:{minor}");
        }
        for (major, minor) in [(195, 0), (195, 2), (195, 255), (1, 3), (237, 1), (3, 195)] {
            assert_eq!(run(&p, READ_WRITE | CHAR, major, minor), 1, "{major}:{minor}");
        }
        // A block device with the same numbers is not a GPU.
        assert_eq!(run(&p, READ_WRITE | BLOCK, 195, 1), 1);
        let none = program(&[]).expect("empty");
        assert_eq!(run(&none, READ_WRITE | CHAR, 195, 0), 1);
    }

    #[test]
    fn numbers_that_are_no_device_numbers_are_skipped_and_the_list_is_bounded() {
        let p = program(&[(u32::MAX, 1), (195, 1)]).expect("program");
        assert_eq!(p.len(), 5 + 4 + 2);
        assert_eq!(run(&p, READ_WRITE | CHAR, 195, 1), 0);
        assert_eq!(run(&p, READ_WRITE | BLOCK, 195, 1), 1);
        let many: Vec<(u32, u32)> = (0..=DENY_MAX as u32).map(|m| (195, m)).collect();
        assert!(matches!(program(&many), Err(FenceError::TooMany { count }) if count == DENY_MAX + 1));
    }
}
