//! [`OwnerLock`]: the exclusive OS lock that makes one runtime the owner of a database file.
//!
//! The lock is taken on a sidecar file, `<database>.lock`, never on the database itself, so a
//! read-only inspection tool (`sqlite3`) still opens the database. It is an advisory whole-file
//! lock (`File::try_lock`: `flock` on Unix, `LockFileEx` on Windows) held by one open file: a
//! second runtime on the same database — in another process, or in this one, which opens the
//! file again — is refused at once. The OS releases it when the process dies, however it dies,
//! so a restart after `SIGKILL` is never refused by a stale lock. The lock file stays on disk:
//! deleting it would race with a concurrent opener, which could lock the unlinked file while a
//! third opener creates and locks a new one.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The suffix appended to the database path to name its lock file.
const SUFFIX: &str = ".lock";

/// The held lock on a database's `<database>.lock` file; dropping it releases the lock.
#[derive(Debug)]
pub(crate) struct OwnerLock {
    /// The locked lock file. The lock belongs to this open file and lives exactly as long as it.
    file: File,
}

impl OwnerLock {
    /// Locks the lock file of `database`, creating it when missing, and records this process's
    /// pid in it (informative only: best effort).
    ///
    /// Symbolic links in the database path are resolved first, as SQLite resolves them, so two
    /// paths naming the same database share one lock file.
    ///
    /// # Errors
    /// [`Error::Config`] when `database` names no file (empty, `:memory:` or a `file:` URI);
    /// [`Error::LockFile`] when the lock file cannot be created or locked (e.g. the directory
    /// does not exist); [`Error::DatabaseInUse`] when another runtime holds the lock.
    pub(crate) fn acquire(database: &Path) -> Result<OwnerLock> {
        let path = lock_path(database)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|source| Error::LockFile {
                path: path.clone(),
                source,
            })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(Error::DatabaseInUse {
                    path: database.to_path_buf(),
                    pid: read_pid(&mut file),
                })
            }
            Err(TryLockError::Error(source)) => return Err(Error::LockFile { path, source }),
        }
        if let Err(e) = write_pid(&mut file) {
            log::warn!(
                "could not record this process's pid in {}: {e}",
                path.display()
            );
        }
        Ok(OwnerLock { file })
    }

    /// Releases the lock (the OS does the same when the process dies).
    pub(crate) fn release(self) {
        drop(self);
    }
}

impl Drop for OwnerLock {
    /// Unlocks before the file closes: a child this process is forking at that moment holds a
    /// copy of the descriptor until it execs, and closing ours alone would leave the lock held
    /// by that copy, refusing a runtime this process starts next.
    fn drop(&mut self) {
        if let Err(e) = self.file.unlock() {
            log::warn!("could not unlock the database's lock file: {e}");
        }
    }
}

/// The lock file of `database`: `<database>.lock`, next to the file a symbolic link points to.
///
/// # Errors
/// [`Error::Config`] for a database that is no file; [`Error::LockFile`] when the database's
/// directory cannot be resolved (it does not exist, or is not searchable).
fn lock_path(database: &Path) -> Result<PathBuf> {
    let text = database.as_os_str();
    let lossy = text.to_string_lossy();
    if text.is_empty() || lossy == ":memory:" || lossy.starts_with("file:") {
        return Err(Error::Config(format!(
            "database {lossy:?} is not a file path: the runtime needs a SQLite file on disk, \
             which it owns through the lock file `<path>{SUFFIX}`"
        )));
    }
    let resolved = match std::fs::canonicalize(database) {
        Ok(file) => file,
        // The database does not exist yet (or is a dangling link, which SQLite refuses): the
        // lock file goes into its directory, resolved.
        Err(_) => {
            let dir = match database.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => Path::new("."),
            };
            let name = database.file_name().unwrap_or(text);
            match std::fs::canonicalize(dir) {
                Ok(dir) => dir.join(name),
                Err(source) => {
                    return Err(Error::LockFile {
                        path: with_suffix(database),
                        source,
                    })
                }
            }
        }
    };
    Ok(with_suffix(&resolved))
}

/// `path` with [`SUFFIX`] appended to its last component.
fn with_suffix(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(SUFFIX);
    PathBuf::from(name)
}

/// The pid the holder recorded in the lock file, if it is there yet.
fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// Replaces the lock file's content with this process's pid.
fn write_pid(file: &mut File) -> std::io::Result<()> {
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    writeln!(file, "{}", std::process::id())?;
    file.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second lock on the same database in this process is refused, naming the holder's pid;
    /// once the first is released, it is granted.
    #[test]
    fn a_second_lock_in_one_process_is_refused_until_the_first_is_released() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("x.db");
        let first = OwnerLock::acquire(&db).unwrap();
        match OwnerLock::acquire(&db) {
            Err(Error::DatabaseInUse { path, pid }) => {
                assert_eq!(path, db);
                assert_eq!(pid, Some(std::process::id()));
            }
            other => panic!("expected DatabaseInUse, got {other:?}"),
        }
        let pid = std::fs::read_to_string(dir.path().join("x.db.lock")).unwrap();
        assert_eq!(pid, format!("{}\n", std::process::id()));
        first.release();
        OwnerLock::acquire(&db).unwrap().release();
        // The lock file stays; the database itself was never created.
        assert!(dir.path().join("x.db.lock").exists());
        assert!(!db.exists());
    }

    /// A path through a symbolic link to the database shares the database's lock file.
    #[cfg(unix)]
    #[test]
    fn a_symbolic_link_to_the_database_shares_its_lock() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("x.db");
        std::fs::write(&db, b"").unwrap();
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(&db, &link).unwrap();
        let _held = OwnerLock::acquire(&db).unwrap();
        assert!(matches!(
            OwnerLock::acquire(&link),
            Err(Error::DatabaseInUse { .. })
        ));
    }

    /// In-memory databases and a missing directory are clear errors naming the path.
    #[test]
    fn paths_that_cannot_be_locked_are_clear_errors() {
        for memory in ["", ":memory:", "file::memory:?cache=shared"] {
            match OwnerLock::acquire(Path::new(memory)) {
                Err(Error::Config(message)) => assert!(message.contains(&format!("{memory:?}"))),
                other => panic!("{memory:?}: expected Config, got {other:?}"),
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("missing").join("x.db");
        let err = OwnerLock::acquire(&db).unwrap_err();
        assert!(matches!(err, Error::LockFile { .. }), "{err:?}");
        let message = err.to_string();
        assert!(
            message.contains(&format!("{}.lock", db.display())),
            "{message}"
        );
    }
}
