//! A local server's process group: a signal to all of it, and the memory all of it holds.
//! Its first process leads the group (its pid is the group's id) and every process it
//! starts stays in it unless it leaves on purpose.

use std::fs;

use super::sys;

/// A signal runwarden sends to a local server's process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// SIGTERM: asks every process of the group to end.
    Term,
    /// SIGKILL: ends every process of the group at once.
    Kill,
}

/// Sends `signal` to every process of the group led by `pid`. A group already gone is
/// not an error: it is what the signal was for.
pub(crate) fn kill_group(pid: i32, signal: Signal) {
    // A pid of 0 or below would name our own group or every process we may signal.
    if pid <= 0 {
        return;
    }
    let signal = match signal {
        Signal::Term => libc::SIGTERM,
        Signal::Kill => libc::SIGKILL,
    };
    sys::kill_process_group(pid, signal);
}

/// The resident memory, in bytes, of every process in the group led by `pid`: the sum of
/// their VmRSS read from /proc (0 when the group is gone). Memory is watched this way, not
/// with an rlimit, because runtimes such as Node reserve far more address space than they
/// use. In a sandbox the leader is runwarden's own process that waits outside the
/// server's PID namespace (a fork of runwarden, sharing its pages): it is not counted.
pub(crate) fn group_rss_bytes(pid: i32, sandboxed: bool) -> u64 {
    let Ok(entries) = fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|member| {
            fs::read_to_string(format!("/proc/{member}/stat"))
                .ok()
                .and_then(|stat| process_group(&stat))
                == Some(pid)
                && !(sandboxed && *member == pid)
        })
        .filter_map(|member| fs::read_to_string(format!("/proc/{member}/status")).ok())
        .filter_map(|status| resident_bytes(&status))
        .sum()
}

/// The process group id in the text of /proc/PID/stat: the third field after the
/// command name, which is in parentheses and may itself hold spaces and parentheses.
fn process_group(stat: &str) -> Option<i32> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(2)?.parse().ok()
}

/// VmRSS in the text of /proc/PID/status, in bytes (the kernel writes kB). A process
/// that has ended but is not yet reaped has none.
fn resident_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line["VmRSS:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_group_is_read_after_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (my (odd) server) S 1 4240 4240 0 -1 4194560 120 0 0 0";
        assert_eq!(process_group(stat), Some(4240));
        assert_eq!(process_group("4242 (truncated"), None);
    }

    #[test]
    fn resident_memory_is_read_in_bytes_from_the_status_text() {
        let status = "Name:\tnode\nVmPeak:\t  900000 kB\nVmRSS:\t  102400 kB\nThreads:\t7\n";
        assert_eq!(resident_bytes(status), Some(100 * 1024 * 1024));
        assert_eq!(resident_bytes("Name:\tzombie\nState:\tZ (zombie)\n"), None);
    }

    #[test]
    fn a_group_that_does_not_exist_holds_no_memory_and_takes_no_signal() {
        // Above the kernel's largest pid (4194304), so no process can lead such a group.
        assert_eq!(group_rss_bytes(5_000_000, false), 0);
        kill_group(5_000_000, Signal::Kill);
        kill_group(0, Signal::Kill);
    }
}
