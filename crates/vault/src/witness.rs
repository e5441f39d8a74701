//! The anchor file: a witness of the audit log's length and tip kept outside the database
//! (V7 amended), so a wipe or a rollback of rows plus tip is detectable.
//!
//! The file holds two fixed-size slots written alternately. Each slot carries a sequence
//! number, the anchored length, the hash of the row at that length and a MAC keyed from
//! the audit key. A reader takes the valid slot with the higher sequence, and refuses a
//! file whose other slot is damaged, wiped or out of step: each slot is written whole
//! with one small write inside the first disk sector, so a damaged slot means the file was
//! altered (or the disk fails), and falling back to the older slot would let a one-batch
//! rollback pass. Writers take an exclusive lock on the file, so processes sharing one
//! database never interleave, and never lower the anchored length.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use crate::audit::AuditChain;

const MAGIC: &[u8; 8] = b"RWANCHR1";
/// One slot: magic, sequence, length, hash, MAC, zero padding.
const SLOT: usize = 128;
const USED: usize = 8 + 8 + 8 + 32 + 32;

/// The anchored state: the log held `length` rows and row `length` had `hash`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Anchored {
    pub(crate) length: i64,
    pub(crate) hash: [u8; 32],
}

/// A slot as read from the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    sequence: u64,
    anchored: Anchored,
}

/// Why the anchor file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WitnessError {
    #[error("the audit anchor file {path} could not be {doing}: {source}")]
    Io {
        path: String,
        doing: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "the audit anchor file {path} holds no valid anchor for this log: it was altered or \
         belongs to another installation"
    )]
    Invalid { path: String },
    #[error(
        "the audit anchor file {path} is damaged ({problem}), so a rollback of the log to \
         an older anchor cannot be ruled out: keep the file as evidence, restore a copy \
         from a backup, and check the log against its external witness (`runwarden audit \
         verify --witness`) if one is configured"
    )]
    Damaged { path: String, problem: String },
}

/// What [`Witness::advance`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Advanced {
    /// The new state was written and synced.
    Written,
    /// The file already records at least this length; nothing was written (monotonic).
    AlreadyAhead(Anchored),
    /// The file no longer holds the state the caller checked against; check again.
    Moved(Option<Anchored>),
}

/// The anchor file at one path.
#[derive(Debug, Clone)]
pub(crate) struct Witness {
    path: PathBuf,
}

impl Witness {
    pub(crate) fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, doing: &'static str) -> impl FnOnce(io::Error) -> WitnessError + '_ {
        move |source| WitnessError::Io {
            path: self.path.display().to_string(),
            doing,
            source,
        }
    }

    fn invalid(&self) -> WitnessError {
        WitnessError::Invalid {
            path: self.path.display().to_string(),
        }
    }

    /// The anchored state, or `None` when the file does not exist.
    pub(crate) fn read(&self, chain: &AuditChain) -> Result<Option<Anchored>, WitnessError> {
        let file = match File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io("opened")(e)),
        };
        // A shared lock: a writer in another process never shows us half a slot.
        file.lock_shared().map_err(self.io("locked"))?;
        let newest = self.newest(&file, chain)?;
        Ok(Some(newest.ok_or_else(|| self.invalid())?.anchored))
    }

    /// Creates the file recording `anchored`, unless it exists. The content is written and
    /// synced under a temporary name first, then linked into place, so a crash never
    /// leaves a half-written anchor under the real name. Answers whether it created it.
    pub(crate) fn create(
        &self,
        chain: &AuditChain,
        anchored: Anchored,
    ) -> Result<bool, WitnessError> {
        let dir = self
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let temp = dir.join(format!(
            ".{}.{}.tmp",
            self.path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "audit.anchor".into()),
            std::process::id()
        ));
        let mut content = vec![0u8; 2 * SLOT];
        // Sequence 1 in slot 1, so the first advance (sequence 2, slot 0) leaves it whole.
        encode(chain, 1, anchored, &mut content[SLOT..]);
        let written = (|| {
            let mut options = OpenOptions::new();
            options.write(true).create(true).truncate(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                options.mode(0o600);
            }
            let file = options.open(&temp)?;
            write_all_at(&file, &content, 0)?;
            file.sync_all()?;
            std::fs::hard_link(&temp, &self.path)
        })();
        let _ = std::fs::remove_file(&temp);
        match written {
            Ok(()) => {
                sync_dir(dir).map_err(self.io("synced"))?;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(self.io("created")(e)),
        }
    }

    /// Records `next` if the file still holds `expected` (what the caller checked `next`
    /// against) and records fewer rows than `next`. Never lowers the length.
    pub(crate) fn advance(
        &self,
        chain: &AuditChain,
        expected: Anchored,
        next: Anchored,
    ) -> Result<Advanced, WitnessError> {
        let file = match OpenOptions::new().read(true).write(true).open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Advanced::Moved(None)),
            Err(e) => return Err(self.io("opened")(e)),
        };
        // Exclusive: two processes sharing one database never interleave their writes.
        file.lock().map_err(self.io("locked"))?;
        let current = self.newest(&file, chain)?.ok_or_else(|| self.invalid())?;
        if current.anchored.length >= next.length {
            return Ok(Advanced::AlreadyAhead(current.anchored));
        }
        if current.anchored != expected {
            return Ok(Advanced::Moved(Some(current.anchored)));
        }
        let sequence = current.sequence + 1;
        let mut slot = [0u8; SLOT];
        encode(chain, sequence, next, &mut slot);
        // Alternate slots: the one not written stays valid if this write is torn.
        let offset = (sequence % 2) * SLOT as u64;
        write_all_at(&file, &slot, offset).map_err(self.io("written"))?;
        // Not synced, on purpose: the rows it names were synced to disk before this write
        // was issued, so after a power cut the anchor can only lag the log, never lead it
        // (which would read as a rollback). A lagging anchor still witnesses everything up
        // to where it stands, and an fsync here would double the cost of every audit row.
        Ok(Advanced::Written)
    }

    /// The valid slot with the higher sequence; `None` when neither slot was ever
    /// written. A damaged slot, an empty one beside a slot that says both were written, or
    /// two slots whose sequences are not consecutive are [`WitnessError::Damaged`].
    fn newest(&self, file: &File, chain: &AuditChain) -> Result<Option<Slot>, WitnessError> {
        let mut content = [0u8; 2 * SLOT];
        let read = read_at_most(file, &mut content).map_err(self.io("read"))?;
        let damaged = |problem: String| WitnessError::Damaged {
            path: self.path.display().to_string(),
            problem,
        };
        let state = |i: usize| {
            let slot = &content[i * SLOT..(i + 1) * SLOT];
            if read < (i + 1) * SLOT || slot.iter().all(|b| *b == 0) {
                SlotState::Empty
            } else {
                decode(chain, slot).map_or(SlotState::Damaged, SlotState::Valid)
            }
        };
        match (state(0), state(1)) {
            (SlotState::Empty, SlotState::Empty) => Ok(None),
            // Nothing verifies: altered whole, or made with another installation's key.
            (SlotState::Damaged, SlotState::Damaged | SlotState::Empty)
            | (SlotState::Empty, SlotState::Damaged) => Err(self.invalid()),
            (SlotState::Damaged, _) => Err(damaged("slot 0 does not verify".into())),
            (_, SlotState::Damaged) => Err(damaged("slot 1 does not verify".into())),
            // Sequences 1 and 2 may stand alone (an anchor created, then advanced once by
            // a version that wrote sequence 1 to slot 0); any later one has a predecessor.
            (SlotState::Valid(only), SlotState::Empty)
            | (SlotState::Empty, SlotState::Valid(only)) => {
                if only.sequence <= 2 {
                    Ok(Some(only))
                } else {
                    Err(damaged(format!(
                        "one slot is empty beside sequence {}",
                        only.sequence
                    )))
                }
            }
            (SlotState::Valid(a), SlotState::Valid(b)) => {
                if a.sequence.abs_diff(b.sequence) != 1 {
                    return Err(damaged(format!(
                        "the slots hold sequences {} and {}, not consecutive ones",
                        a.sequence, b.sequence
                    )));
                }
                Ok(Some(if a.sequence > b.sequence { a } else { b }))
            }
        }
    }
}

/// What one slot holds.
#[derive(Debug, Clone, Copy)]
enum SlotState {
    /// Zeros: never written.
    Empty,
    /// A slot whose MAC verifies.
    Valid(Slot),
    /// Anything else.
    Damaged,
}

fn encode(chain: &AuditChain, sequence: u64, anchored: Anchored, out: &mut [u8]) {
    out[..8].copy_from_slice(MAGIC);
    out[8..16].copy_from_slice(&sequence.to_be_bytes());
    out[16..24].copy_from_slice(&anchored.length.to_be_bytes());
    out[24..56].copy_from_slice(&anchored.hash);
    out[56..USED].copy_from_slice(&chain.witness_mac(sequence, anchored.length, &anchored.hash));
}

fn decode(chain: &AuditChain, slot: &[u8]) -> Option<Slot> {
    if &slot[..8] != MAGIC {
        return None;
    }
    let sequence = u64::from_be_bytes(slot[8..16].try_into().ok()?);
    let length = i64::from_be_bytes(slot[16..24].try_into().ok()?);
    let hash: [u8; 32] = slot[24..56].try_into().ok()?;
    let mac: [u8; 32] = slot[56..USED].try_into().ok()?;
    // Comparing MACs of our own making: not a timing oracle an attacker can query.
    if chain.witness_mac(sequence, length, &hash) != mac || length < 0 {
        return None;
    }
    Some(Slot {
        sequence,
        anchored: Anchored { length, hash },
    })
}

#[cfg(unix)]
fn write_all_at(file: &File, bytes: &[u8], offset: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(bytes, offset)
}

#[cfg(not(unix))]
fn write_all_at(mut file: &File, bytes: &[u8], offset: u64) -> io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    file.seek(SeekFrom::Start(offset))?;
    file.write_all(bytes)
}

fn read_at_most(mut file: &File, buf: &mut [u8]) -> io::Result<usize> {
    use std::io::Read;
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(length: i64) -> Anchored {
        Anchored {
            length,
            hash: [length as u8; 32],
        }
    }

    #[test]
    fn the_newest_valid_slot_wins_and_a_damaged_slot_is_an_error_never_a_fallback() {
        let dir = tempfile::tempdir().unwrap();
        let chain = AuditChain::from_audit_key(&[1; 32]);
        let witness = Witness::new(dir.path().join("audit.anchor"));
        assert_eq!(witness.read(&chain).unwrap(), None);
        assert!(witness.create(&chain, at(0)).unwrap());
        assert!(
            !witness.create(&chain, at(9)).unwrap(),
            "create never replaces"
        );
        assert_eq!(
            witness.advance(&chain, at(0), at(3)).unwrap(),
            Advanced::Written
        );
        assert_eq!(
            witness.advance(&chain, at(3), at(5)).unwrap(),
            Advanced::Written
        );
        assert_eq!(witness.read(&chain).unwrap(), Some(at(5)));
        assert_eq!(
            witness.advance(&chain, at(5), at(7)).unwrap(),
            Advanced::Written
        );
        assert_eq!(witness.read(&chain).unwrap(), Some(at(7)));
        let good = std::fs::read(witness.path()).unwrap();
        // Sequence 4 went to slot 0. Damaged, it does not fall back to slot 1 (length 5,
        // a one-batch rollback): the file is refused, naming the slot.
        let mut bytes = good.clone();
        bytes[20] ^= 0xff;
        std::fs::write(witness.path(), &bytes).unwrap();
        let error = witness.read(&chain).unwrap_err();
        assert!(matches!(error, WitnessError::Damaged { .. }), "{error}");
        assert!(
            error.to_string().contains("slot 0 does not verify"),
            "{error}"
        );
        // A damaged anchor is never advanced past (the write would hide the damage).
        assert!(witness.advance(&chain, at(5), at(9)).is_err());
        // Wiped to zeros, the same.
        let mut bytes = good.clone();
        bytes[..SLOT].fill(0);
        std::fs::write(witness.path(), &bytes).unwrap();
        let error = witness.read(&chain).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("one slot is empty beside sequence 3"),
            "{error}"
        );
        // An older copy of a slot put back: the sequences are not consecutive.
        let mut bytes = good.clone();
        let mut stale = [0u8; SLOT];
        encode(&chain, 2, at(3), &mut stale);
        bytes[SLOT..].copy_from_slice(&stale);
        std::fs::write(witness.path(), &bytes).unwrap();
        let error = witness.read(&chain).unwrap_err();
        assert!(error.to_string().contains("not consecutive"), "{error}");
    }

    #[test]
    fn the_anchored_length_never_goes_down_and_a_moved_anchor_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let chain = AuditChain::from_audit_key(&[1; 32]);
        let witness = Witness::new(dir.path().join("audit.anchor"));
        witness.create(&chain, at(4)).unwrap();
        assert_eq!(
            witness.advance(&chain, at(4), at(2)).unwrap(),
            Advanced::AlreadyAhead(at(4))
        );
        assert_eq!(
            witness.advance(&chain, at(1), at(6)).unwrap(),
            Advanced::Moved(Some(at(4)))
        );
        assert_eq!(witness.read(&chain).unwrap(), Some(at(4)));
    }

    #[test]
    fn an_anchor_made_with_another_key_is_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let witness = Witness::new(dir.path().join("audit.anchor"));
        witness
            .create(&AuditChain::from_audit_key(&[1; 32]), at(2))
            .unwrap();
        let other = AuditChain::from_audit_key(&[2; 32]);
        assert!(matches!(
            witness.read(&other),
            Err(WitnessError::Invalid { .. })
        ));
    }

    #[cfg(unix)]
    #[test]
    fn the_anchor_file_is_private_to_its_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let witness = Witness::new(dir.path().join("audit.anchor"));
        witness
            .create(&AuditChain::from_audit_key(&[1; 32]), at(0))
            .unwrap();
        let mode = std::fs::metadata(witness.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
