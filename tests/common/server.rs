//! The `server` example's binary, for the tests that run it as a child process.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The `server` example's binary, built (once per test run) by cargo: a no-op when it is fresh.
pub fn server_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("current exe");
            // target/<profile>/deps/http_api-<hash> → target/<profile>
            let profile_dir = exe
                .parent()
                .and_then(Path::parent)
                .expect("target/<profile>")
                .to_path_buf();
            let binary = profile_dir
                .join("examples")
                .join(format!("server{}", std::env::consts::EXE_SUFFIX));
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut build = Command::new(cargo);
            build
                .args(["build", "--quiet", "--example", "server"])
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if let Some(target_dir) = profile_dir.parent() {
                build.arg("--target-dir").arg(target_dir);
            }
            // The same features as this test binary, so the library is not rebuilt back and
            // forth.
            // `postgres` too: the multi-node tests run it on a postgres:// URL.
            let features: Vec<&str> = [
                ("crash-points", cfg!(feature = "crash-points")),
                ("postgres", cfg!(feature = "postgres")),
            ]
            .into_iter()
            .filter_map(|(name, on)| on.then_some(name))
            .collect();
            if !features.is_empty() {
                build.args(["--features", &features.join(",")]);
            }
            if profile_dir
                .file_name()
                .is_some_and(|name| name == "release")
            {
                build.arg("--release");
            }
            let built = build.status().is_ok_and(|status| status.success());
            assert!(
                built || binary.exists(),
                "could not build the server example ({})",
                binary.display()
            );
            binary
        })
        .clone()
}
