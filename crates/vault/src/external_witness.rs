//! The external witness (`[audit] witness`): a file on another path where every advance of
//! the anchor is appended as one line, opened append-only for each write. Put it where the
//! local administrator cannot rewrite it silently (another machine's mount, a file the
//! kernel keeps append-only with `chattr +a`, a log shipper's spool): then a wipe of the
//! database, the anchor file and the audit key together still leaves a record the log
//! must match, and `audit verify --witness` finds it.
//!
//! A line is JSON: `{"length", "hash", "mac", "time_ms"}`. Appending can only add lines,
//! and the check takes the longest length any line records, so an added line can make
//! verify fail but never lower what it expects.

use std::fs::OpenOptions;
use std::io::{self, BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::audit::AuditChain;
use crate::witness::{Anchored, WitnessError};

/// One line of the witness file.
#[derive(Debug, Serialize, Deserialize)]
struct Line {
    length: i64,
    hash: String,
    mac: String,
    time_ms: i64,
}

/// The longest length the witness records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Witnessed {
    pub(crate) anchored: Anchored,
    /// When it was written, Unix milliseconds UTC.
    pub(crate) time_ms: i64,
    /// Its line number, from 1.
    pub(crate) line: usize,
    /// Whether its MAC verifies with this installation's audit key.
    pub(crate) mac_ok: bool,
}

/// The witness file at one path.
#[derive(Debug, Clone)]
pub(crate) struct ExternalWitness {
    path: PathBuf,
}

impl ExternalWitness {
    pub(crate) fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `anchored` as one line, with one write on a file opened append-only.
    pub(crate) fn append(&self, chain: &AuditChain, anchored: Anchored) -> io::Result<()> {
        let line = Line {
            length: anchored.length,
            hash: hex::encode(anchored.hash),
            mac: hex::encode(chain.external_witness_mac(anchored.length, &anchored.hash)),
            time_ms: chrono::Utc::now().timestamp_millis(),
        };
        let mut text = serde_json::to_string(&line).map_err(io::Error::other)?;
        text.push('\n');
        let mut options = OpenOptions::new();
        options.append(true).create(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        options.open(&self.path)?.write_all(text.as_bytes())
    }

    /// The line recording the longest log; `None` when the file is missing or empty. A
    /// last line without its newline (a write cut short) is left out; any other line
    /// that is not a witness record is an error naming it.
    pub(crate) fn longest(&self, chain: &AuditChain) -> Result<Option<Witnessed>, WitnessError> {
        let damaged = |problem: String| WitnessError::Damaged {
            path: self.path.display().to_string(),
            problem,
        };
        let file = match std::fs::File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(WitnessError::Io {
                    path: self.path.display().to_string(),
                    doing: "opened",
                    source,
                });
            }
        };
        let mut reader = BufReader::new(file);
        let mut longest: Option<Witnessed> = None;
        let mut text = String::new();
        for number in 1.. {
            text.clear();
            let read = reader
                .read_line(&mut text)
                .map_err(|source| WitnessError::Io {
                    path: self.path.display().to_string(),
                    doing: "read",
                    source,
                })?;
            if read == 0 || !text.ends_with('\n') {
                break;
            }
            let parsed = serde_json::from_str::<Line>(text.trim_end())
                .ok()
                .and_then(|line| witnessed(chain, &line, number));
            let Some(entry) = parsed else {
                return Err(damaged(format!("line {number} is not a witness record")));
            };
            if longest.is_none_or(|l| entry.anchored.length > l.anchored.length) {
                longest = Some(entry);
            }
        }
        Ok(longest)
    }
}

fn witnessed(chain: &AuditChain, line: &Line, number: usize) -> Option<Witnessed> {
    let mut hash = [0u8; 32];
    hex::decode_to_slice(&line.hash, &mut hash).ok()?;
    let mut mac = [0u8; 32];
    hex::decode_to_slice(&line.mac, &mut mac).ok()?;
    (line.length >= 0).then(|| Witnessed {
        anchored: Anchored {
            length: line.length,
            hash,
        },
        time_ms: line.time_ms,
        line: number,
        mac_ok: chain.external_witness_mac(line.length, &hash) == mac,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_record_wins_a_cut_last_line_is_left_out_and_a_bad_line_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let chain = AuditChain::from_audit_key(&[1; 32]);
        let witness = ExternalWitness::new(dir.path().join("witness.log"));
        assert_eq!(witness.longest(&chain).unwrap(), None);
        for length in [0, 4, 9] {
            let anchored = Anchored {
                length,
                hash: [length as u8; 32],
            };
            witness.append(&chain, anchored).unwrap();
        }
        let longest = witness.longest(&chain).unwrap().unwrap();
        assert_eq!(
            (longest.anchored.length, longest.line, longest.mac_ok),
            (9, 3, true)
        );
        let other = AuditChain::from_audit_key(&[2; 32]);
        assert!(!witness.longest(&other).unwrap().unwrap().mac_ok);

        let mut text = std::fs::read_to_string(witness.path()).unwrap();
        text.push_str("{\"length\": 99");
        std::fs::write(witness.path(), &text).unwrap();
        assert_eq!(witness.longest(&chain).unwrap().unwrap().anchored.length, 9);
        text.push('\n');
        std::fs::write(witness.path(), &text).unwrap();
        let error = witness.longest(&chain).unwrap_err().to_string();
        assert!(error.contains("line 4 is not a witness record"), "{error}");
    }
}
