//! What the host gives a throwaway cluster: the PostgreSQL binaries' directories, an
//! unprivileged user to run them as (the server refuses root), a private temp directory, a free
//! port, and a thread of its own for the sync client.

use std::ffi::OsStr;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{SystemTime, UNIX_EPOCH};

use super::*;

/// `/usr/lib/postgresql/*/bin`, highest version first.
pub(super) fn debian_bin_dirs() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") else {
        return Vec::new();
    };
    let mut versions: Vec<(Vec<u32>, PathBuf)> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let version = name
                .split('.')
                .map(str::parse)
                .collect::<Result<Vec<u32>, _>>()
                .ok()?;
            Some((version, entry.path().join("bin")))
        })
        .collect();
    versions.sort_by(|a, b| b.0.cmp(&a.0));
    versions.into_iter().map(|(_, dir)| dir).collect()
}

pub(super) fn binaries_in(dir: &Path) -> Option<PgBinaries> {
    let initdb = dir.join("initdb");
    let postgres = dir.join("postgres");
    (is_executable(&initdb) && is_executable(&postgres)).then(|| PgBinaries {
        dir: dir.to_path_buf(),
        initdb,
        postgres,
    })
}

pub(super) fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether this process runs as root (effective uid 0).
pub(super) fn running_as_root() -> bool {
    // `/proc/self` belongs to the process's effective uid; `id -u` where there is no /proc.
    if let Ok(meta) = std::fs::metadata("/proc/self") {
        return meta.uid() == 0;
    }
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The user PostgreSQL runs as under root, resolved (and created) once per process.
pub(super) fn unprivileged_user() -> Result<String, PgUnavailable> {
    static USER: OnceLock<Mutex<Option<String>>> = OnceLock::new();
    let mut cached = USER
        .get_or_init(|| Mutex::new(None))
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(user) = &*cached {
        return Ok(user.clone());
    }
    let user = resolve_user()?;
    *cached = Some(user.clone());
    Ok(user)
}

pub(super) fn resolve_user() -> Result<String, PgUnavailable> {
    if let Some(user) = std::env::var(USER_ENV).ok().filter(|u| !u.is_empty()) {
        return if user_exists(&user) {
            Ok(user)
        } else {
            Err(PgUnavailable::NoUser(format!(
                "${USER_ENV}={user}: no such user"
            )))
        };
    }
    if user_exists(DEFAULT_USER) {
        return Ok(DEFAULT_USER.to_owned());
    }
    let created = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
        ])
        .args(["--comment", "durable-sessions test PostgreSQL"])
        .arg(DEFAULT_USER)
        .stdin(Stdio::null())
        .output();
    // Another process may have created it meanwhile: what counts is that it exists now.
    if user_exists(DEFAULT_USER) {
        return Ok(DEFAULT_USER.to_owned());
    }
    if user_exists("nobody") {
        return Ok("nobody".to_owned());
    }
    Err(PgUnavailable::NoUser(match created {
        Ok(output) => format!(
            "useradd {DEFAULT_USER} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Err(e) => format!("cannot run useradd: {e}"),
    }))
}

pub(super) fn user_exists(user: &str) -> bool {
    id_of(user, "-u").is_ok()
}

pub(super) fn ids_of(user: &str) -> Result<(u32, u32), PgUnavailable> {
    Ok((id_of(user, "-u")?, id_of(user, "-g")?))
}

pub(super) fn id_of(user: &str, flag: &str) -> Result<u32, PgUnavailable> {
    let output: Output = Command::new("id")
        .arg(flag)
        .arg(user)
        .stderr(Stdio::null())
        .output()
        .map_err(PgUnavailable::io("run id"))?;
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .ok()
        .filter(|_| output.status.success())
        .ok_or_else(|| PgUnavailable::NoUser(format!("`id {flag} {user}` failed")))
}

/// `program` as a command run by `user` (through `runuser`, else `su`), or as is.
pub(super) fn as_user(user: Option<&str>, program: &OsStr) -> Command {
    let Some(user) = user else {
        return Command::new(program);
    };
    if has_runuser() {
        let mut command = Command::new("runuser");
        command.args(["-u", user, "--"]).arg(program);
        command
    } else {
        // `su -c` takes a shell string: `exec "$0" "$@"` keeps every argument as given.
        let mut command = Command::new("su");
        command
            .args(["-s", "/bin/sh", user, "-c", r#"exec "$0" "$@""#])
            .arg(program);
        command
    }
}

pub(super) fn has_runuser() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        Command::new("runuser")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// A new empty directory of this process only (mode 0700) under the temp dir.
pub(super) fn make_temp_dir() -> Result<PathBuf, PgUnavailable> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let base = std::env::temp_dir();
    loop {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name: OsString = format!(
            "ds-pg-{}-{}-{nanos:x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        )
        .into();
        let dir = base.join(name);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(PgUnavailable::Io {
                    what: format!("create {}", dir.display()),
                    source: e,
                })
            }
        }
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub(super) fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// Runs `f(url)` on a thread of its own: the sync `postgres` client panics on a thread that is
/// inside a tokio runtime (as an `#[actix_rt::test]` body is).
pub(super) fn off_runtime<T: Send + 'static>(
    url: String,
    f: impl FnOnce(String) -> Result<T, postgres::Error> + Send + 'static,
) -> Result<T, postgres::Error> {
    match thread::spawn(move || f(url)).join() {
        Ok(result) => result,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}
