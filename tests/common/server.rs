//! The `server` example's binary (and other examples'), for the tests that run it as a child
//! process.
//!
//! The binary cargo leaves at `target/<profile>/examples/server` is shared: any build of the
//! example in the same target directory replaces it, with that build's features. So each test
//! binary builds the example with its own features (a no-op when it is fresh), links the
//! result under `target/test-bins/`, asks the link for its features (`server --version`) and
//! builds again when another build replaced the file in between. Only a binary with exactly
//! this test binary's features is moved to the path the tests run
//! (`target/test-bins/server-<profile>-<features>`), so a node restarted later runs it too.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// How many builds may be replaced under this one before it gives up.
const ATTEMPTS: usize = 5;

/// The `server` example's binary with this test binary's features, built (once per test
/// binary) by cargo and checked.
///
/// # Panics
/// When cargo fails, or no build of it kept its features long enough to be linked.
pub fn server_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(build_and_check).clone()
}

/// The cargo features the server must have: the library's default `http`, and those of this
/// test binary among `crash-points` and `postgres` (the same as the tests', so the library is
/// not rebuilt back and forth; `postgres` for the multi-node tests' `postgres://` URLs).
fn wanted() -> BTreeSet<String> {
    [
        ("http", true),
        ("crash-points", cfg!(feature = "crash-points")),
        ("postgres", cfg!(feature = "postgres")),
    ]
    .into_iter()
    .filter(|(_, on)| *on)
    .map(|(name, _)| name.to_owned())
    .collect()
}

/// An example's binary that behaves the same whatever features it was built with, such as
/// `quickstart`: built (a no-op when it is fresh) with this test binary's features, so the
/// library is not rebuilt, linked under `target/test-bins/` and moved to
/// `target/test-bins/<name>-<profile>-<features>`, a path no build of the example replaces.
///
/// # Panics
/// When cargo fails.
pub fn example_binary(name: &str) -> PathBuf {
    let (target_dir, profile_dir, profile) = target_paths();
    let wanted = wanted();
    build(&target_dir, &profile, &wanted, name);
    let shared = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let bins = target_dir.join("test-bins");
    std::fs::create_dir_all(&bins).expect("create target/test-bins");
    let tag = wanted.iter().cloned().collect::<Vec<_>>().join("-");
    let suffix = std::env::consts::EXE_SUFFIX;
    let kept = bins.join(format!("{name}-{profile}-{tag}{suffix}"));
    let candidate = bins.join(format!("{name}-{profile}-{tag}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&candidate);
    if std::fs::hard_link(&shared, &candidate).is_err() {
        std::fs::copy(&shared, &candidate).expect("copy the example's binary");
    }
    std::fs::rename(&candidate, &kept).expect("keep the example's binary");
    kept
}

/// `target`, `target/<profile>` and the profile's name, from this test binary's path.
fn target_paths() -> (PathBuf, PathBuf, String) {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/http_api-<hash> → target/<profile>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf();
    let target_dir = profile_dir.parent().expect("target").to_path_buf();
    let profile = profile_dir
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or("debug")
        .to_owned();
    (target_dir, profile_dir, profile)
}

fn build_and_check() -> PathBuf {
    let (target_dir, profile_dir, profile) = target_paths();
    let shared = profile_dir
        .join("examples")
        .join(format!("server{}", std::env::consts::EXE_SUFFIX));
    let wanted = wanted();
    let bins = target_dir.join("test-bins");
    std::fs::create_dir_all(&bins).expect("create target/test-bins");
    let tag = wanted.iter().cloned().collect::<Vec<_>>().join("-");
    let kept = bins.join(format!(
        "server-{profile}-{tag}{}",
        std::env::consts::EXE_SUFFIX
    ));
    let candidate = bins.join(format!("server-{profile}-{tag}.{}.tmp", std::process::id()));
    let mut found = None;
    for _ in 0..ATTEMPTS {
        build(&target_dir, &profile, &wanted, "server");
        let _ = std::fs::remove_file(&candidate);
        // A link keeps this build's file even if another build replaces the shared path.
        if std::fs::hard_link(&shared, &candidate).is_err() {
            std::fs::copy(&shared, &candidate).expect("copy the server binary");
        }
        let features = features_of(&candidate);
        if features.as_ref() == Some(&wanted) {
            std::fs::rename(&candidate, &kept).expect("keep the server binary");
            return kept;
        }
        eprintln!(
            "{}: features {features:?}, not {wanted:?} (another build replaced it); building again",
            shared.display()
        );
        found = features;
    }
    let _ = std::fs::remove_file(&candidate);
    panic!(
        "the server example at {} kept being replaced by builds with other features (last seen \
         {found:?}, wanted {wanted:?})",
        shared.display()
    );
}

/// Builds the example `name` with `features` in `target_dir` (a no-op when it is fresh).
fn build(target_dir: &Path, profile: &str, features: &BTreeSet<String>, name: &str) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "--quiet", "--example", name])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("--target-dir")
        .arg(target_dir);
    let extra: Vec<&str> = features
        .iter()
        .map(String::as_str)
        .filter(|f| *f != "http")
        .collect();
    if !extra.is_empty() {
        build.args(["--features", &extra.join(",")]);
    }
    if profile == "release" {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build");
    assert!(
        status.success(),
        "could not build the {name} example: {status}"
    );
}

/// The features `binary` says it was built with (`--version`: `server 0.1.0 (features: …)`).
fn features_of(binary: &Path) -> Option<BTreeSet<String>> {
    let output = Command::new(binary).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let list = text.split("(features:").nth(1)?.split(')').next()?;
    Some(list.split_whitespace().map(str::to_owned).collect())
}
