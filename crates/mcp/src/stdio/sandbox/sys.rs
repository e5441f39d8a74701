//! The system calls of the sandbox: what a local server's process does between fork and
//! exec, the probe of the kernel, the hand-over of the proxy's listening socket, and the
//! wait for the end. The only `unsafe` code of the crate lives here (crates/mcp/Cargo.toml
//! says why the crate denies it rather than forbids it).
//!
//! Between fork and exec the child is a copy of a multi-threaded process: another thread
//! may have held the allocator's lock at the moment of the fork, so the child may not
//! allocate, take a lock or run a destructor. Everything it needs is built before the
//! fork ([`ChildSetup`]) and it makes raw system calls only.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use libc::c_int;

/// The first byte of a message saying the listening socket travels with it.
const LISTENER: u8 = 0;

/// A step of the child's set-up, reported back to the parent with the error number when
/// it fails (as its first byte, the errno following in native byte order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Step {
    /// `unshare(CLONE_NEWUSER | CLONE_NEWNET)`.
    Unshare = 1,
    /// Making the process dumpable again so that it may write its own id maps.
    Dumpable,
    /// `deny` to /proc/self/setgroups.
    Setgroups,
    /// Its own user id to /proc/self/uid_map.
    UidMap,
    /// Its own group id to /proc/self/gid_map.
    GidMap,
    /// The loopback interface brought up.
    Loopback,
    /// The listening socket of the egress proxy: socket, bind, listen.
    Listen,
    /// The listening socket sent to the parent.
    HandOver,
    /// RLIMIT_NOFILE.
    OpenFiles,
    /// RLIMIT_CPU.
    CpuTime,
    /// PR_SET_PDEATHSIG.
    DeathSignal,
    /// The fork that makes the server the first process of its own PID namespace.
    Fork,
}

impl Step {
    const ALL: [Step; 12] = [
        Step::Unshare,
        Step::Dumpable,
        Step::Setgroups,
        Step::UidMap,
        Step::GidMap,
        Step::Loopback,
        Step::Listen,
        Step::HandOver,
        Step::OpenFiles,
        Step::CpuTime,
        Step::DeathSignal,
        Step::Fork,
    ];

    fn from_byte(byte: u8) -> Option<Step> {
        Step::ALL.into_iter().find(|step| *step as u8 == byte)
    }

    /// The step in an error message: the system call or the file written.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Step::Unshare => "unshare",
            Step::Dumpable => "prctl PR_SET_DUMPABLE",
            Step::Setgroups => "writing /proc/self/setgroups",
            Step::UidMap => "writing /proc/self/uid_map",
            Step::GidMap => "writing /proc/self/gid_map",
            Step::Loopback => "bringing up the loopback interface",
            Step::Listen => "listen",
            Step::HandOver => "sending the listening socket",
            Step::OpenFiles => "setrlimit RLIMIT_NOFILE",
            Step::CpuTime => "setrlimit RLIMIT_CPU",
            Step::DeathSignal => "prctl PR_SET_PDEATHSIG",
            Step::Fork => "fork",
        }
    }
}

/// A failed step and its error number.
pub(super) type Failure = (Step, i32);

/// What the child does between fork and exec, built whole before the fork.
pub(super) struct ChildSetup {
    /// runwarden's pid: the child checks that it is still its parent once the death signal
    /// is set, since runwarden may have died before.
    parent: libc::pid_t,
    /// The namespace to enter, when sandboxed.
    namespace: Option<NamespaceSetup>,
    open_files: libc::rlim_t,
    cpu_seconds: Option<libc::rlim_t>,
    /// The child's end of the report channel (a SOCK_SEQPACKET pair, close-on-exec).
    report: RawFd,
}

/// A network namespace in its own user namespace, mapping the process's own ids.
pub(super) struct NamespaceSetup {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    /// Where the proxy's listener is bound inside, if one is wanted (the probe wants none).
    listen: Option<libc::sockaddr_in>,
}

impl NamespaceSetup {
    /// A namespace whose loopback has a listening socket on `127.0.0.1:port` when `port`
    /// is given.
    pub(super) fn new(port: Option<u16>) -> NamespaceSetup {
        // SAFETY: geteuid and getegid cannot fail and touch no memory of ours.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        NamespaceSetup {
            // The child maps only its own ids: files keep their owner, and an unprivileged
            // process may write exactly this line without any capability.
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            listen: port.map(loopback_address),
        }
    }

    /// Runs in the child: its own user and network namespaces, its ids mapped, `lo` up.
    fn enter(&self) -> Result<(), Failure> {
        // A non-dumpable process (runwarden makes itself one) has its /proc files owned by
        // root of the host once it is in a new user namespace, so an unprivileged one
        // could not write its id maps. The program run next is dumpable anyway: exec
        // resets the flag.
        // SAFETY: prctl with integer arguments touches no memory.
        check(
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) },
            Step::Dumpable,
        )?;
        // Always a user namespace, also when root: the child then holds no capability in
        // the host's namespaces, so it cannot configure the host's network or setns back.
        // SAFETY: unshare takes flags only.
        // A PID namespace too: the server becomes its first process (see `run_as_init`),
        // so whatever it starts dies with it.
        let flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNET | libc::CLONE_NEWPID;
        check(unsafe { libc::unshare(flags) }, Step::Unshare)?;
        // setgroups must be denied before an unprivileged process may write its gid_map.
        write_file(c"/proc/self/setgroups", b"deny", Step::Setgroups)?;
        write_file(c"/proc/self/uid_map", &self.uid_map, Step::UidMap)?;
        write_file(c"/proc/self/gid_map", &self.gid_map, Step::GidMap)?;
        loopback_up()
    }
}

impl ChildSetup {
    /// The set-up of one child whose failures are reported on `report`.
    pub(super) fn new(
        namespace: Option<NamespaceSetup>,
        open_files: u64,
        cpu_seconds: Option<u64>,
        report: RawFd,
    ) -> ChildSetup {
        ChildSetup {
            // SAFETY: getpid cannot fail.
            parent: unsafe { libc::getpid() },
            namespace,
            open_files,
            cpu_seconds,
            report,
        }
    }

    /// Makes `command` run the set-up in its child, after std has made the child its own
    /// process group leader and before exec.
    pub(super) fn install(self, command: &mut Command) {
        // SAFETY: the closure only reads `self`, built before the fork, and makes
        // async-signal-safe system calls; it neither allocates nor locks. On failure it
        // returns an error made from a raw errno, which does not allocate either.
        unsafe {
            command.pre_exec(move || match self.run() {
                Ok(()) => Ok(()),
                Err((step, errno)) => {
                    report_failure(self.report, step, errno);
                    Err(io::Error::from_raw_os_error(errno))
                }
            });
        }
    }

    /// The steps, in this order: the namespace first, while the child may still open
    /// sockets whatever its open-files limit; then the limits; last the death signal, so
    /// that nothing after it changes the process's credentials (which would clear it).
    fn run(&self) -> Result<(), Failure> {
        if let Some(namespace) = &self.namespace {
            namespace.enter()?;
            if let Some(address) = &namespace.listen {
                hand_over_listener(address, self.report)?;
            }
        }
        set_limit(libc::RLIMIT_NOFILE, self.open_files, self.open_files)
            .map_err(|errno| (Step::OpenFiles, errno))?;
        if let Some(seconds) = self.cpu_seconds {
            // The soft limit sends SIGXCPU, which ends the process unless it handles the
            // signal; the hard limit a second later sends SIGKILL. With both equal the
            // kernel would send SIGKILL alone, and the reason would not show.
            set_limit(libc::RLIMIT_CPU, seconds, seconds.saturating_add(1))
                .map_err(|errno| (Step::CpuTime, errno))?;
        }
        // The child dies with the thread that forked it (the long-lived spawner thread,
        // so in effect with runwarden). If runwarden died before this line, the signal
        // will never come: the parent is then no longer the one recorded, and we leave.
        // SAFETY: prctl with integer arguments; getppid and _exit cannot fail.
        unsafe {
            let signal = libc::SIGKILL as libc::c_ulong;
            check(
                libc::prctl(libc::PR_SET_PDEATHSIG, signal, 0, 0, 0),
                Step::DeathSignal,
            )?;
            if libc::getppid() != self.parent {
                libc::_exit(127);
            }
        }
        if self.namespace.is_some() {
            run_as_init()?;
        }
        Ok(())
    }
}

/// Splits the child in two, after `unshare(CLONE_NEWPID)`: the new process is the first
/// of the new PID namespace and goes on to exec the server; this one stays outside as its
/// parent, waits for it and ends the way it ended. When the first process of a PID
/// namespace dies, the kernel kills every other process in it, so a server's own children
/// (`node` under `npx`) die with it, and it dies with this process, which dies with
/// runwarden: nothing is left after `kill -9` of runwarden.
fn run_as_init() -> Result<(), Failure> {
    // SAFETY: fork in a child that makes raw system calls only from here on.
    let server = unsafe { libc::fork() };
    if server < 0 {
        return Err((Step::Fork, last_errno()));
    }
    if server == 0 {
        // SAFETY: prctl with integer arguments. The death signal is not inherited by a
        // fork, so the server sets its own: it dies with the process outside.
        unsafe {
            let signal = libc::SIGKILL as libc::c_ulong;
            check(
                libc::prctl(libc::PR_SET_PDEATHSIG, signal, 0, 0, 0),
                Step::DeathSignal,
            )?;
        }
        return Ok(());
    }
    // The process outside needs no descriptor: closing them all leaves the pipes, the
    // report channel and std's exec-status channel to the server alone, so each ends
    // when the server's ends.
    // SAFETY: close_range and close take integers; waitpid writes only `status`.
    unsafe {
        if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) < 0 {
            for fd in 0..1024 {
                libc::close(fd);
            }
        }
        // A polite signal to the group is the server's to answer: this process waits.
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(signal, libc::SIG_IGN);
        }
        let mut status = 0;
        loop {
            if libc::waitpid(server, &mut status, 0) == server {
                break;
            }
            if last_errno() != libc::EINTR {
                libc::_exit(127);
            }
        }
        if libc::WIFSIGNALED(status) {
            // Ends by the same signal, so runwarden reads the same reason.
            let signal = libc::WTERMSIG(status);
            libc::signal(signal, libc::SIG_DFL);
            libc::kill(libc::getpid(), signal);
            libc::_exit(128 + signal);
        }
        libc::_exit(libc::WEXITSTATUS(status));
    }
}

/// Whether this kernel gives a process a network namespace in its own user namespace,
/// tried in a throwaway child: the failed step and errno when it does not. The outer error
/// is ours (no descriptor or process to try with), not the kernel's answer.
pub(super) fn probe_namespace() -> io::Result<Result<(), Failure>> {
    let (ours, theirs) = report_pair()?;
    let namespace = NamespaceSetup::new(None);
    let report = theirs.as_raw_fd();
    // SAFETY: the child makes async-signal-safe system calls on data built before the fork
    // and leaves with _exit, running no destructor and returning to no caller.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = match namespace.enter() {
            Ok(()) => 0,
            Err((step, errno)) => {
                report_failure(report, step, errno);
                1
            }
        };
        // SAFETY: _exit ends the child at once.
        unsafe { libc::_exit(code) };
    }
    drop(theirs);
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    let (ended, _) = wait(pid)?;
    Ok(match (read_reports(&ours).failure, ended) {
        (Some(failure), _) => Err(failure),
        (None, Ended::Exited(0)) => Ok(()),
        // Ended without a word: a signal or a crash before the report.
        (None, _) => Err((Step::Unshare, libc::ECHILD)),
    })
}

/// A SOCK_SEQPACKET pair, both ends close-on-exec: the child's set-up reports on one end
/// and the parent reads the other; message boundaries keep a report and a socket apart.
pub(super) fn report_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds: [c_int; 2] = [-1, -1];
    let kind = libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC;
    // SAFETY: socketpair writes two descriptors into the array it is given.
    if unsafe { libc::socketpair(libc::AF_UNIX, kind, 0, fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// What a child's set-up reported: the listening socket it handed over, the step that
/// failed.
#[derive(Default)]
pub(super) struct Reports {
    pub(super) listener: Option<OwnedFd>,
    pub(super) failure: Option<Failure>,
}

/// Reads every report the child sent, without waiting: the child has sent all it will by
/// the time it has exec'd or failed, which is when std's spawn returns.
pub(super) fn read_reports(ours: &OwnedFd) -> Reports {
    let mut reports = Reports::default();
    while let Some((bytes, fd)) = receive(ours.as_raw_fd()) {
        match bytes {
            [LISTENER, ..] => reports.listener = fd.or(reports.listener),
            [step, a, b, c, d] => {
                if let Some(step) = Step::from_byte(step) {
                    reports.failure = Some((step, i32::from_ne_bytes([a, b, c, d])));
                }
            }
        }
    }
    reports
}

/// How a process ended, as wait4 tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// exit(code).
    Exited(i32),
    /// Ended by this signal.
    Signalled(i32),
}

/// Waits for the child `pid` to end (blocking) and answers how, with the CPU time it used.
pub(super) fn wait(pid: i32) -> io::Result<(Ended, Duration)> {
    let mut status: c_int = 0;
    // SAFETY: rusage is plain data for which all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 writes into the two values it is given.
        let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if waited == pid {
            break;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
    let ended = if libc::WIFSIGNALED(status) {
        Ended::Signalled(libc::WTERMSIG(status))
    } else {
        Ended::Exited(libc::WEXITSTATUS(status))
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    Ok((ended, time(usage.ru_utime) + time(usage.ru_stime)))
}

/// The address 127.0.0.1:port as the kernel reads it.
fn loopback_address(port: u16) -> libc::sockaddr_in {
    // SAFETY: sockaddr_in is plain data for which all zeroes is a valid value.
    let mut address: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    address.sin_family = libc::AF_INET as libc::sa_family_t;
    address.sin_port = port.to_be();
    address.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
    address
}

/// Turns a system call's -1 into the step and errno.
fn check(result: c_int, step: Step) -> Result<(), Failure> {
    if result < 0 {
        Err((step, last_errno()))
    } else {
        Ok(())
    }
}

fn last_errno() -> i32 {
    errno_of(&io::Error::last_os_error())
}

fn errno_of(error: &io::Error) -> i32 {
    error.raw_os_error().unwrap_or(libc::EIO)
}

/// Writes `bytes` to a /proc file in one write, as the id-map files require.
fn write_file(path: &std::ffi::CStr, bytes: &[u8], step: Step) -> Result<(), Failure> {
    // SAFETY: open reads a NUL-terminated path; write reads `bytes`; close ends the fd.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        check(fd, step)?;
        let written = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let errno = last_errno();
        libc::close(fd);
        if written != bytes.len() as isize {
            return Err((step, if written < 0 { errno } else { libc::EIO }));
        }
    }
    Ok(())
}

/// A new network namespace has a loopback interface that is down: brought up, it is the
/// only interface, so 127.0.0.1 is reachable and every other address is unreachable.
fn loopback_up() -> Result<(), Failure> {
    // SAFETY: the ioctls read and write the ifreq on this stack frame; the socket is closed.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        check(fd, Step::Loopback)?;
        let mut request: libc::ifreq = std::mem::zeroed();
        request.ifr_name[0] = b'l' as libc::c_char;
        request.ifr_name[1] = b'o' as libc::c_char;
        let mut result = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut request);
        if result == 0 {
            request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            result = libc::ioctl(fd, libc::SIOCSIFFLAGS, &request);
        }
        let errno = last_errno();
        libc::close(fd);
        if result != 0 {
            return Err((Step::Loopback, errno));
        }
    }
    Ok(())
}

/// Opens the proxy's listening socket inside the namespace and sends it to the parent,
/// which accepts on it from outside: the child keeps no copy.
fn hand_over_listener(address: &libc::sockaddr_in, report: RawFd) -> Result<(), Failure> {
    // SAFETY: bind reads the address; the socket is sent, then closed.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        check(fd, Step::Listen)?;
        let length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let mut result = libc::bind(fd, (address as *const libc::sockaddr_in).cast(), length);
        if result == 0 {
            result = libc::listen(fd, 128);
        }
        if result != 0 {
            let errno = last_errno();
            libc::close(fd);
            return Err((Step::Listen, errno));
        }
        let sent = send_fd(report, fd);
        let errno = last_errno();
        libc::close(fd);
        if sent < 0 {
            return Err((Step::HandOver, errno));
        }
    }
    Ok(())
}

/// The bytes of a control message holding one descriptor.
// SAFETY: CMSG_SPACE computes a size.
const CONTROL_LEN: usize = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;

/// A control-message buffer aligned as a cmsghdr.
#[repr(C)]
union Control {
    header: libc::cmsghdr,
    bytes: [u8; CONTROL_LEN],
}

/// Sends the byte [`LISTENER`] with `fd` attached (SCM_RIGHTS). Async-signal-safe.
unsafe fn send_fd(socket: RawFd, fd: RawFd) -> isize {
    let mut byte = [LISTENER];
    let mut control = Control {
        bytes: [0; CONTROL_LEN],
    };
    // SAFETY (whole body): every pointer refers to a value on this stack frame, and
    // CMSG_FIRSTHDR of a buffer of CONTROL_LEN bytes is a valid header inside it.
    unsafe {
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = (&raw mut control).cast();
        message.msg_controllen = CONTROL_LEN as _;
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), fd);
        libc::sendmsg(socket, &message, libc::MSG_NOSIGNAL)
    }
}

/// Writes a failed step and its errno on the report channel. Async-signal-safe; a failure
/// to report leaves the parent with std's errno alone.
fn report_failure(report: RawFd, step: Step, errno: i32) {
    let e = errno.to_ne_bytes();
    let message = [step as u8, e[0], e[1], e[2], e[3]];
    // SAFETY: send reads the message on this stack frame.
    unsafe {
        libc::send(
            report,
            message.as_ptr().cast(),
            message.len(),
            libc::MSG_NOSIGNAL,
        )
    };
}

/// Receives one message without waiting: its first bytes and the descriptor attached to
/// it, or `None` when no message is waiting.
fn receive(socket: RawFd) -> Option<([u8; 5], Option<OwnedFd>)> {
    let mut bytes = [0xff_u8; 5];
    let mut control = Control {
        bytes: [0; CONTROL_LEN],
    };
    // SAFETY: every pointer refers to a value on this stack frame; a descriptor found in
    // an SCM_RIGHTS message is new in this process and owned by nothing else.
    unsafe {
        let mut iov = libc::iovec {
            iov_base: bytes.as_mut_ptr().cast(),
            iov_len: bytes.len(),
        };
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = (&raw mut control).cast();
        message.msg_controllen = CONTROL_LEN as _;
        let flags = libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC;
        if libc::recvmsg(socket, &mut message, flags) <= 0 {
            return None;
        }
        let header = libc::CMSG_FIRSTHDR(&message);
        let fd = (!header.is_null()
            && (*header).cmsg_level == libc::SOL_SOCKET
            && (*header).cmsg_type == libc::SCM_RIGHTS)
            .then(|| std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<RawFd>()))
            .map(|fd| OwnedFd::from_raw_fd(fd));
        Some((bytes, fd))
    }
}

/// Sets a resource limit (soft, hard). Async-signal-safe.
fn set_limit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> Result<(), i32> {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads the limit on this stack frame.
    if unsafe { libc::setrlimit(resource, &limit) } != 0 {
        return Err(last_errno());
    }
    Ok(())
}

/// Sends `signal` to the process group `group`; false when no such group exists any more.
pub(super) fn kill_process_group(group: i32, signal: c_int) -> bool {
    // SAFETY: killpg takes integers only.
    unsafe { libc::killpg(group, signal) == 0 }
}

/// Makes this process non-dumpable, as runwarden makes itself at start (for the tests of
/// a sandbox started by such a process).
#[cfg(test)]
pub(super) fn make_not_dumpable() {
    // SAFETY: prctl with integer arguments touches no memory.
    let result = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    assert_eq!(result, 0, "{}", io::Error::last_os_error());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_survives_its_trip_as_one_byte() {
        for step in Step::ALL {
            assert_eq!(Step::from_byte(step as u8), Some(step));
        }
        assert_eq!(Step::from_byte(LISTENER), None);
    }

    #[test]
    fn a_failure_report_is_read_back_as_the_step_and_errno() {
        let (ours, theirs) = report_pair().unwrap();
        report_failure(theirs.as_raw_fd(), Step::GidMap, libc::EPERM);
        let reports = read_reports(&ours);
        assert_eq!(reports.failure, Some((Step::GidMap, libc::EPERM)));
        assert!(reports.listener.is_none());
    }

    #[test]
    fn a_descriptor_sent_with_the_listener_byte_arrives_as_a_new_descriptor() {
        let (ours, theirs) = report_pair().unwrap();
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        // SAFETY: both descriptors are open for the length of the call.
        assert_eq!(
            unsafe { send_fd(theirs.as_raw_fd(), socket.as_raw_fd()) },
            1
        );
        let listener = read_reports(&ours).listener.expect("a descriptor");
        assert_ne!(listener.as_raw_fd(), socket.as_raw_fd());
        let received = std::net::TcpListener::from(listener);
        assert_eq!(received.local_addr().unwrap().port(), port);
    }
}
