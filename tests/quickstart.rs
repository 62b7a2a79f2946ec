//! The README's quickstart runner (its "Embedding" section), run as the program
//! `examples/quickstart.rs`: killed with SIGKILL while it answers a prompt, it answers that
//! prompt when it starts again. And the README and the crate docs show exactly the example's
//! runner, so what is tested is what they show.

mod common;

use std::path::Path;
use std::process::Command;

use common::{example_binary, ChildProcess};
use durable_sessions::{kind, SessionId};

/// The runner as a text shows it: from the line `/// Your agent` to the first line `}` after
/// it (the end of `impl Runner for Agent`).
fn runner_block(text: &str, what: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with("/// Your agent"))
        .unwrap_or_else(|| panic!("{what} shows no `/// Your agent` runner"));
    let end = lines[start..]
        .iter()
        .position(|l| *l == "}")
        .unwrap_or_else(|| panic!("{what}: the runner's `impl` never ends"));
    let mut block = lines[start..=start + end].join("\n");
    block.push('\n');
    block
}

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_readme_and_the_crate_docs_show_the_quickstart_examples_runner() {
    let example = read("examples/quickstart.rs");
    let readme = runner_block(&read("README.md"), "README.md");
    assert!(readme.contains("turn.take_inputs()"), "{readme}");
    assert!(
        example.contains(&readme),
        "examples/quickstart.rs does not hold the README's runner as it is:\n{readme}"
    );
    // The crate docs show it too, each line behind `//! `.
    let docs: String = read("src/lib.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| format!("{}\n", l.strip_prefix(' ').unwrap_or(l)))
        .collect();
    assert_eq!(runner_block(&docs, "the crate docs"), readme);
}

#[test]
fn the_quickstart_runner_answers_a_prompt_whose_turn_was_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("quickstart.db");
    let binary = example_binary("quickstart");

    // The first process admits the prompt and takes it into a turn, which is slow to answer:
    // it is killed there, its turn claimed and the prompt promoted without a reply.
    let mut first = Command::new(&binary);
    first
        .arg(&db)
        .arg("are you still there?")
        .env("QUICKSTART_DELAY_MS", "60000");
    let mut first = ChildProcess::run(first);
    let admitted = first.line("ADMITTED ");
    let prompt = admitted.trim_start_matches("ADMITTED ").to_owned();
    assert_eq!(first.line("PROMOTED "), format!("PROMOTED {prompt}"));
    first.kill();

    // The second process is given no prompt: its restart sweep resumes the turn, whose
    // `take_inputs` hands the runner the prompt again.
    let mut second = Command::new(&binary);
    second.arg(&db).env("QUICKSTART_DELAY_MS", "0");
    let lines = ChildProcess::run(second).finish();
    assert!(
        lines.contains(&format!("PROMOTED {prompt}")),
        "the resumed turn took the prompt: {lines:?}"
    );
    assert_eq!(lines.last().map(String::as_str), Some("IDLE"), "{lines:?}");

    let session = SessionId::new("quickstart").expect("id");
    let events = durable_sessions::testing::events(&db, &session).expect("read the log");
    let replies: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e.kind == kind::MESSAGE_APPENDED && e.data["type"] == "assistant")
        .map(|e| &e.data["data"])
        .collect();
    assert_eq!(
        replies,
        [&serde_json::json!({
            "text": "you said \"are you still there?\"",
            "reply_to": prompt,
        })],
        "one reply, to the prompt"
    );
    let last = events.last().expect("events");
    assert_eq!(last.kind, kind::EXECUTION_SUCCEEDED, "{events:#?}");
    assert!(
        events.iter().any(|e| e.kind == kind::SYNTHETIC),
        "the turn was resumed by the restart sweep: {events:#?}"
    );
}
