//! Files made read-only under a test (the store-fault tests): `chattr +i` as root, who
//! ignores file modes, `chmod 0444` otherwise.

use std::path::PathBuf;
use std::process::Command;

/// Whether this process runs as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2))
            == Some("0")
    })
}

/// Files made read-only for a test: `chattr +i` as root (root ignores file modes), `chmod 0444`
/// otherwise; undone on drop.
pub struct ReadOnly {
    files: Vec<PathBuf>,
    immutable: bool,
}

impl ReadOnly {
    /// Whether the files were made immutable (`chattr +i`), which, unlike a mode, also stops
    /// writes through descriptors already open.
    pub fn immutable(&self) -> bool {
        self.immutable
    }

    /// Makes `files` read-only, or `None` when it cannot (no `chattr`, or a filesystem
    /// without the immutable attribute).
    pub fn set(files: &[PathBuf]) -> Option<ReadOnly> {
        let immutable = is_root();
        let mut done = ReadOnly {
            files: Vec::new(),
            immutable,
        };
        for file in files {
            let ok = if immutable {
                Command::new("chattr")
                    .arg("+i")
                    .arg(file)
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            } else {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o444)).is_ok()
            };
            if !ok {
                return None;
            }
            done.files.push(file.clone());
        }
        Some(done)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        for file in &self.files {
            if self.immutable {
                let _ = Command::new("chattr").arg("-i").arg(file).status();
            } else {
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644));
            }
        }
    }
}
