//! A small filesystem mounted for a test (root or `CAP_SYS_ADMIN`): a disk that really fills
//! up. A tmpfs, or an ext4 image on a loop device: on ext4, unlike tmpfs, `chattr +i` also
//! stops writes through descriptors already open.

use std::ffi::OsStr;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A small filesystem mounted for one test, unmounted (lazily) when dropped.
pub struct SmallDisk {
    _dir: tempfile::TempDir,
    pub mount: PathBuf,
    /// `"tmpfs"` or `"ext4"`.
    pub kind: &'static str,
}

/// Runs `program` with `args`, quietly; whether it succeeded.
fn run(program: &str, args: &[&OsStr]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl SmallDisk {
    /// Mounts a tmpfs of `size` (`mount -o size=` syntax), or `None` when this process may not.
    pub fn tmpfs(size: &str) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().ok()?;
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).ok()?;
        let size = format!("size={size}");
        let args = [OsStr::new("-t"), OsStr::new("tmpfs"), OsStr::new("-o")];
        let args = [
            &args[..],
            &[OsStr::new(&size), OsStr::new("tmpfs"), mount.as_os_str()],
        ];
        run("mount", &args.concat()).then_some(SmallDisk {
            _dir: dir,
            mount,
            kind: "tmpfs",
        })
    }

    /// Mounts an ext4 filesystem of `mib` MiB made in an image file on a loop device, or `None`
    /// when this process may not (no `mkfs.ext4`, no loop device). It has no journal (a freed
    /// block is free at once, and the journal's megabytes do not count against `mib`), no
    /// blocks reserved for root, and blocks of 4 KiB, a memory page: SQLite writes the last byte of each page of
    /// its `-shm` file as it grows it, which allocates the whole page only when a block is a
    /// page (with smaller blocks, a store into the page's first blocks on a full disk faults
    /// the process with `SIGBUS`).
    pub fn ext4(mib: u64) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().ok()?;
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).ok()?;
        let image = dir.path().join("disk.img");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(mib << 20))
            .ok()?;
        let made = run(
            "mkfs.ext4",
            &[
                OsStr::new("-q"),
                OsStr::new("-m0"),
                OsStr::new("-b4096"),
                OsStr::new("-O^has_journal"),
                image.as_os_str(),
            ],
        );
        let loop_option = [OsStr::new("-o"), OsStr::new("loop")];
        let mounted = made
            && run(
                "mount",
                &[&loop_option[..], &[image.as_os_str(), mount.as_os_str()]].concat(),
            );
        mounted.then_some(SmallDisk {
            _dir: dir,
            mount,
            kind: "ext4",
        })
    }

    /// Grows (or shrinks) a tmpfs in place.
    pub fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.mount)
            .status()
            .expect("run mount");
        assert!(status.success(), "remount the tmpfs");
    }

    /// Fills the filesystem: a filler file written until the disk is full (`ENOSPC`), then
    /// shrunk by `leave` bytes, so that much stays free. Removed on drop.
    pub fn fill(&self, leave: u64) -> Filler {
        let path = self.mount.join("filler");
        let mut file = std::fs::File::create(&path).expect("create the filler file");
        let chunk = vec![0xa5u8; 4096];
        let mut written = 0u64;
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("write the filler file: {e}"),
            }
        }
        if leave > 0 {
            file.set_len(written.saturating_sub(leave))
                .expect("shrink the filler file");
        }
        Filler { path, written }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

/// The file that fills a [`SmallDisk`]; removed on drop, which frees the disk.
pub struct Filler {
    path: PathBuf,
    /// Bytes written before the disk was full.
    pub written: u64,
}

impl Drop for Filler {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
