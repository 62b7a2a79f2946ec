//! Child processes: a test re-executes its own binary as a child, reads its stdout line by line
//! and kills it with SIGKILL.

use std::time::Duration;

/// How long a parent waits for a child process's marker line before failing.
pub const CHILD_WAIT: Duration = Duration::from_secs(20);

/// A running child; killed (SIGKILL) and reaped on drop if the test failed first.
pub struct ChildProcess {
    process: std::process::Child,
    /// Complete stdout lines, from a reader thread.
    lines: std::sync::mpsc::Receiver<String>,
    reader: Option<std::thread::JoinHandle<()>>,
    /// The lines read so far.
    seen: Vec<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl ChildProcess {
    /// Re-executes this test binary, running only `test`, with `env` set (and `DS_CRASH_POINT`
    /// cleared unless `env` sets it); stdout is read line by line.
    pub fn spawn(test: &str, env: &[(&str, String)]) -> ChildProcess {
        let exe = std::env::current_exe().expect("current test binary");
        let mut command = std::process::Command::new(exe);
        command
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            // An `#[ignore]`d test's children run too (the parent itself was asked for).
            .arg("--include-ignored")
            .env_remove("DS_CRASH_POINT");
        for (key, value) in env {
            command.env(key, value);
        }
        Self::run(command)
    }

    /// Runs `command` (any program, such as an example's binary) with stdin closed; its
    /// stdout is read line by line.
    pub fn run(mut command: std::process::Command) -> ChildProcess {
        command
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut process = command.spawn().expect("spawn a child process");
        let stdout = process.stdout.take().expect("piped stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut stdout = std::io::BufReader::new(stdout);
            let mut line = Vec::new();
            loop {
                line.clear();
                match std::io::BufRead::read_until(&mut stdout, b'\n', &mut line) {
                    // A line cut by the kill (no newline) was never fully printed: drop it.
                    Ok(0) | Err(_) => break,
                    Ok(_) if line.last() != Some(&b'\n') => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
                        if tx.send(text).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let mut stderr = process.stderr.take().expect("piped stderr");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        });
        ChildProcess {
            process,
            lines,
            reader: Some(reader),
            seen: Vec::new(),
            stderr: Some(stderr),
        }
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.process.id()
    }

    /// Reads stdout until a line starting with `prefix`; panics (showing the child's output)
    /// when the child exits first or [`CHILD_WAIT`] passes.
    pub fn wait_for(&mut self, prefix: &str) {
        let deadline = std::time::Instant::now() + CHILD_WAIT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.starts_with(prefix);
                    self.seen.push(line);
                    if found {
                        return;
                    }
                }
                Err(e) => self.fail(&format!("no {prefix:?} from the child ({e})")),
            }
        }
    }

    /// [`Self::wait_for`], returning the line.
    pub fn line(&mut self, prefix: &str) -> String {
        self.wait_for(prefix);
        self.seen.last().cloned().unwrap_or_default()
    }

    /// Waits (up to [`CHILD_WAIT`]) for the child to exit on its own, panics (showing its
    /// output) unless it succeeded, and returns every line it printed.
    pub fn finish(mut self) -> Vec<String> {
        let deadline = std::time::Instant::now() + CHILD_WAIT;
        loop {
            match self.process.try_wait().expect("try_wait the child") {
                Some(status) if status.success() => break,
                Some(status) => self.fail(&format!("the child failed ({status})")),
                None if std::time::Instant::now() > deadline => {
                    self.fail("the child did not exit in time")
                }
                None => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let mut lines = std::mem::take(&mut self.seen);
        lines.extend(self.lines.try_iter());
        lines
    }

    /// Reads stdout until it has seen a line starting with each of `prefixes`, in any order.
    pub fn wait_for_all(&mut self, prefixes: &[&str]) {
        for prefix in prefixes {
            if !self.seen.iter().any(|l| l.starts_with(prefix)) {
                self.wait_for(prefix);
            }
        }
    }

    pub fn fail(&mut self, why: &str) -> ! {
        let _ = self.process.kill();
        let status = self.process.wait();
        let stderr = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        panic!(
            "{why}; child status {status:?}\n--- child stdout ---\n{}\n--- child stderr ---\n{stderr}",
            self.seen.join("\n")
        );
    }

    /// SIGKILLs the child, reaps it and returns every complete line it printed.
    pub fn kill(mut self) -> Vec<String> {
        if let Ok(Some(status)) = self.process.try_wait() {
            self.fail(&format!("the child exited on its own ({status})"));
        }
        self.process.kill().expect("SIGKILL the child");
        let status = self.process.wait().expect("reap the child");
        if std::os::unix::process::ExitStatusExt::signal(&status) != Some(9) {
            self.fail(&format!("the child did not die of SIGKILL: {status}"));
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let mut lines = std::mem::take(&mut self.seen);
        lines.extend(self.lines.try_iter());
        lines
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.process.try_wait() {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}
