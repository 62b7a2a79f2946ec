//! The check that a database's main file is there before SQLite opens it.
//!
//! SQLite keeps committed transactions in the write-ahead log (`<database>-wal`) until a
//! checkpoint copies them into the main file. When the main file is missing or empty (a bad
//! restore, a damaged copy) and the log beside it holds committed transactions, SQLite opens
//! an empty database and deletes or resets the log: every transaction in it is lost. That is
//! refused here, before anything opens the file, with [`StoreError::WalWithoutDatabase`].
//!
//! "Holds committed transactions" is read as SQLite's own recovery reads the log (see the WAL
//! format in SQLite's file format document): a 32-byte header (magic `0x377f0682` or
//! `0x377f0683`, format version 3007000, page size, two salts, its checksum), then frames of a
//! 24-byte header and a page. A frame is valid when its salts are the header's and its
//! checksum, which continues the previous one over the frame's first 8 bytes and its page, is
//! right; recovery stops at the first invalid frame. A valid frame whose "database size after
//! commit" (bytes 4..8) is not zero ends a committed transaction. A log with no such frame (0
//! bytes, a header alone, frames of an earlier log) holds nothing: the start goes on.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::error::StoreError;

/// The WAL magic numbers; the low bit says the checksums read big-endian words.
const MAGIC: u32 = 0x377f_0682;
/// The only WAL format version.
const VERSION: u32 = 3_007_000;
/// The WAL header's size in bytes.
const HEADER: usize = 32;
/// A frame header's size in bytes.
const FRAME_HEADER: usize = 24;

/// Refuses a database whose main file at `database` is missing or empty while its WAL holds a
/// committed transaction. Anything else passes (SQLite reports what it cannot open).
///
/// # Errors
/// [`StoreError::WalWithoutDatabase`], naming both files.
pub(crate) fn check_main_file(database: &Path) -> Result<(), StoreError> {
    // SQLite resolves symbolic links: the log lies beside the file the path points to.
    let main = std::fs::canonicalize(database).unwrap_or_else(|_| database.to_path_buf());
    let lost = match std::fs::metadata(&main) {
        Ok(meta) => meta.is_file() && meta.len() == 0,
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    };
    if !lost {
        return Ok(());
    }
    let wal = wal_path(&main);
    let committed = match File::open(&wal) {
        Ok(file) => holds_commit(BufReader::new(file)).unwrap_or(false),
        Err(_) => false,
    };
    if committed {
        return Err(StoreError::WalWithoutDatabase {
            database: database.to_path_buf(),
            wal,
        });
    }
    Ok(())
}

/// `<database>-wal`.
fn wal_path(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// Whether the log read from `log` holds a valid commit frame. A read error or a short read
/// ends the log where it happens.
fn holds_commit(mut log: impl Read) -> io::Result<bool> {
    let mut header = [0u8; HEADER];
    if !read_whole(&mut log, &mut header)? {
        return Ok(false);
    }
    let magic = word(&header, 0);
    if magic & !1 != MAGIC || word(&header, 4) != VERSION {
        return Ok(false);
    }
    let page_size = word(&header, 8);
    if !page_size.is_power_of_two() || !(512..=65536).contains(&page_size) {
        return Ok(false);
    }
    let big_endian = magic & 1 == 1;
    let mut sum = checksum((0, 0), &header[..24], big_endian);
    if sum != (word(&header, 24), word(&header, 28)) {
        return Ok(false);
    }
    let salts = &header[16..24];
    let mut frame = vec![0u8; FRAME_HEADER + page_size as usize];
    while read_whole(&mut log, &mut frame)? {
        let page_number = word(&frame, 0);
        if page_number == 0 || &frame[8..16] != salts {
            return Ok(false);
        }
        sum = checksum(sum, &frame[..8], big_endian);
        sum = checksum(sum, &frame[FRAME_HEADER..], big_endian);
        if sum != (word(&frame, 16), word(&frame, 20)) {
            return Ok(false);
        }
        if word(&frame, 4) != 0 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Fills `buf` from `log`; `false` when the log ends first.
fn read_whole(log: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    match log.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// The big-endian 32-bit word at `at` (the WAL's fields are big-endian).
fn word(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// SQLite's WAL checksum of `data` (a multiple of 8 bytes), continuing from `sum`: over pairs
/// of 32-bit words, read big-endian or little-endian as the magic says.
fn checksum(sum: (u32, u32), data: &[u8], big_endian: bool) -> (u32, u32) {
    let (mut s0, mut s1) = sum;
    for pair in data.chunks_exact(8) {
        let read = |w: &[u8]| {
            let w = [w[0], w[1], w[2], w[3]];
            if big_endian {
                u32::from_be_bytes(w)
            } else {
                u32::from_le_bytes(w)
            }
        };
        s0 = s0.wrapping_add(read(&pair[..4])).wrapping_add(s1);
        s1 = s1.wrapping_add(read(&pair[4..])).wrapping_add(s0);
    }
    (s0, s1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::sqlite::test_support::tempdir;

    /// A database written through a connection that is still open: its log holds every
    /// transaction (no checkpoint). Returns the main file's path.
    fn written(dir: &Path) -> Result<PathBuf, StoreError> {
        let path = dir.join("w.db");
        let conn = rusqlite::Connection::open(&path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1), (2);")?;
        // Copies, as a crash would leave them: the connection would checkpoint on close.
        let copy = dir.join("copy.db");
        for suffix in ["", "-wal"] {
            std::fs::copy(
                format!("{}{suffix}", path.display()),
                format!("{}{suffix}", copy.display()),
            )
            .map_err(|e| StoreError::Inconsistent(e.to_string()))?;
        }
        drop(conn);
        Ok(copy)
    }

    fn io(e: io::Error) -> StoreError {
        StoreError::Inconsistent(e.to_string())
    }

    #[test]
    fn a_log_of_committed_transactions_beside_a_lost_main_file_is_refused() -> Result<(), StoreError>
    {
        let dir = tempdir()?;
        let db = written(dir.path())?;
        let wal = wal_path(&db);
        let log = std::fs::read(&wal).map_err(io)?;
        assert!(holds_commit(&log[..]).map_err(io)?);
        // The main file is there: nothing to check.
        check_main_file(&db)?;
        for lost in ["missing", "empty"] {
            match lost {
                "missing" => std::fs::remove_file(&db).map_err(io)?,
                _ => std::fs::write(&db, b"").map_err(io)?,
            }
            match check_main_file(&db) {
                Err(StoreError::WalWithoutDatabase { database, wal: w }) => {
                    assert_eq!((database, w), (db.clone(), wal.clone()), "{lost}");
                }
                other => panic!("{lost}: expected WalWithoutDatabase, got {other:?}"),
            }
        }
        Ok(())
    }

    #[test]
    fn a_log_without_a_valid_commit_frame_holds_nothing() -> Result<(), StoreError> {
        let dir = tempdir()?;
        let db = written(dir.path())?;
        let log = std::fs::read(wal_path(&db)).map_err(io)?;
        let page = word(&log, 8) as usize;
        let first_frame = HEADER + FRAME_HEADER + page;
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("the header alone", log[..HEADER].to_vec()),
            (
                "cut inside the first frame",
                log[..first_frame - 1].to_vec(),
            ),
            ("bad magic", {
                let mut l = log.clone();
                l[0] ^= 0xff;
                l
            }),
            ("header checksum wrong", {
                let mut l = log.clone();
                l[12] ^= 1;
                l
            }),
            ("frames of an earlier log (other salts)", {
                let mut l = log.clone();
                for f in (HEADER..l.len()).step_by(FRAME_HEADER + page) {
                    l[f + 8] ^= 1;
                }
                l
            }),
            ("first frame's page damaged", {
                let mut l = log.clone();
                l[HEADER + FRAME_HEADER + 100] ^= 1;
                l
            }),
        ];
        for (name, bytes) in cases {
            assert!(!holds_commit(&bytes[..]).map_err(io)?, "{name}");
        }
        // A missing or empty main file beside an empty log, or none, is a new database.
        let fresh = dir.path().join("fresh.db");
        check_main_file(&fresh)?;
        std::fs::write(&fresh, b"").map_err(io)?;
        check_main_file(&fresh)?;
        std::fs::write(wal_path(&fresh), &log[..HEADER]).map_err(io)?;
        check_main_file(&fresh)?;
        Ok(())
    }
}
