//! A deterministic fake LLM agent with tool calls, on an embedded SQLite file: kill it with
//! `kill -9` in the middle of a tool call, run it again, and the resumed turn skips the tools
//! that finished.
//!
//! ```text
//! cargo build --example agent
//! ./target/debug/examples/agent agent.db "plan a weekend in Lisbon" --tool-ms 3000 &
//! kill -9 $!                            # after it prints "tool 1.2 (fetch) running"
//! ./target/debug/examples/agent agent.db   # no prompt: the restart sweep resumes the turn
//! cat agent.db.effects.log              # tool 1.1 ran once, 1.2 twice, 1.3 once
//! ```
//!
//! For each prompt of a turn (`Turn::take_inputs`: after a crash, the prompts the killed attempt
//! had taken and not answered), the agent:
//!
//! 1. "streams tokens": a few words published as live-only `agent.delta` events
//!    (`Turn::publish_live`), one every `--token-ms`;
//! 2. plans three tool calls, in a step (`plan:<seq>`): a real model would not plan the same
//!    calls twice, so the plan is recorded and a resumed turn replays it;
//! 3. runs each call in a step of its own (`tool:<call id>`, the call id being
//!    `<the prompt's admission seq>.<n>`): the tool appends one line to the *effect log*
//!    `<db>.effects.log` (its external side effect), then takes `--tool-ms` to answer;
//! 4. appends one `assistant` message with the tool results and its answer.
//!
//! A step whose outcome is recorded is never run again: a resumed turn gets its result back.
//! A step killed mid-body is *ambiguous* (`Resumption::steps`): `Turn::step` runs it again and
//! tells it so (`StepContext::previous_attempts`); an API that deduplicates would be handed
//! `StepContext::key`, the same in every attempt of the turn.

use std::convert::Infallible;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use durable_sessions::{
    Admission, CreateSession, PromptInput, RunError, Runner, Runtime, SessionId, StepContext, Turn,
    TurnCause,
};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// A fake LLM agent whose tool calls survive `kill -9`.
#[derive(Debug, Parser)]
struct Args {
    /// The SQLite database file (the effect log is `<db>.effects.log`).
    db: PathBuf,
    /// A prompt to send to the session `agent`; without one, the agent only finishes what a
    /// killed run left.
    prompt: Option<String>,
    /// How long each tool call takes, in milliseconds.
    #[arg(long, default_value_t = 300)]
    tool_ms: u64,
    /// The delay between two streamed tokens, in milliseconds.
    #[arg(long, default_value_t = 40)]
    token_ms: u64,
}

/// One tool call of a plan.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Call {
    id: String,
    tool: String,
    args: String,
}

/// The agent: its delays and where its tools leave their side effects.
#[derive(Clone)]
struct Agent {
    effects: PathBuf,
    tool_delay: Duration,
    token_delay: Duration,
}

impl Runner for Agent {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let agent = self.clone();
        async move {
            let inputs = turn.take_inputs().await?;
            if inputs.is_empty() {
                return Ok(());
            }
            let cause = match turn.cause() {
                TurnCause::Recovery(_) => "resumed after a restart",
                TurnCause::Retry(_) => "retried",
                _ => "new",
            };
            println!("turn {} attempt {} ({cause})", turn.id(), turn.attempt());
            if let Some(resumption) = turn.resumption() {
                for step in &resumption.steps {
                    println!(
                        "  ambiguous step {}: started {} time(s), no outcome recorded",
                        step.name, step.attempts
                    );
                }
            }
            for input in &inputs {
                agent.answer(&turn, input).await?;
            }
            Ok(())
        }
        .boxed_local()
    }
}

impl Agent {
    /// Answers one prompt: stream, plan, call the tools, append the answer.
    async fn answer(&self, turn: &Turn, input: &Admission) -> Result<(), RunError> {
        let text = input.prompt["text"].as_str().unwrap_or_default().to_owned();
        println!("  answering {} {text:?}", input.id);
        self.stream(turn, &format!("Let me look that up: {text}"))
            .await?;

        let (mut ran, mut replayed) = (0, 0);
        let mut count = |fresh: bool| if fresh { ran += 1 } else { replayed += 1 };

        // The plan is a step: a resumed turn replays it instead of asking the model again.
        let mut fresh = false;
        let plan: Vec<Call> = turn
            .step(&format!("plan:{}", input.admitted_seq), |_| {
                fresh = true;
                async { Ok::<_, Infallible>(plan(&text, input.admitted_seq)) }
            })
            .await?;
        println!("  plan:{} {}", input.admitted_seq, how(fresh));
        count(fresh);

        let (mut results, mut found) = (Vec::new(), Vec::new());
        for call in &plan {
            let mut fresh = false;
            let result: String = turn
                .step(&format!("tool:{}", call.id), |ctx| {
                    fresh = true;
                    self.run_tool(ctx, call.clone())
                })
                .await?;
            println!(
                "  tool {} ({}) {}: {result}",
                call.id,
                call.tool,
                how(fresh)
            );
            count(fresh);
            results.push(json!({ "call_id": call.id, "tool": call.tool, "result": result }));
            found.push(result);
        }
        println!("  steps: {ran} run, {replayed} replayed");

        let answer = format!("I found {}.", found.join(", "));
        self.stream(turn, &answer).await?;
        // One append holds the tool results and the answer: the transcript never holds half.
        let reply = json!({ "text": answer, "reply_to": input.id, "tools": results });
        turn.append_message("assistant", reply).await?;
        println!("  answered {}", input.id);
        Ok(())
    }

    /// "Streams tokens": publishes each word live (never stored) and prints it.
    async fn stream(&self, turn: &Turn, text: &str) -> Result<(), RunError> {
        print!("  streaming:");
        for (index, word) in text.split(' ').enumerate() {
            turn.publish_live("agent.delta", json!({ "index": index, "word": word }))?;
            print!(" {word}");
            let _ = std::io::stdout().flush();
            actix_rt::time::sleep(self.token_delay).await;
        }
        println!();
        Ok(())
    }

    /// A tool: its side effect first (one line in the effect log), then its answer after
    /// `tool_delay`, as a request sent to a slow API.
    async fn run_tool(&self, ctx: StepContext, call: Call) -> std::io::Result<String> {
        match ctx.previous_attempts() {
            0 => println!("  tool {} ({}) running", call.id, call.tool),
            n => println!(
                "  tool {} ({}) running again (previous attempts {n})",
                call.id, call.tool
            ),
        }
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.effects)?;
        writeln!(
            log,
            "tool {} ran (key {}, previous attempts {})",
            call.id,
            ctx.key(),
            ctx.previous_attempts()
        )?;
        actix_rt::time::sleep(self.tool_delay).await;
        Ok(match call.tool.as_str() {
            "search" => format!("3 pages about {}", call.args),
            "fetch" => "the first page".to_owned(),
            _ => "its summary".to_owned(),
        })
    }
}

fn how(fresh: bool) -> &'static str {
    if fresh {
        "ran"
    } else {
        "replayed (its recorded outcome)"
    }
}

/// The "model's" plan for a prompt: the same three calls for the same text.
fn plan(text: &str, seq: u64) -> Vec<Call> {
    ["search", "fetch", "summarize"]
        .iter()
        .enumerate()
        .map(|(n, tool)| Call {
            id: format!("{seq}.{}", n + 1),
            tool: (*tool).to_owned(),
            args: text.to_owned(),
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    actix_rt::System::new().block_on(run(args))
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let effects = PathBuf::from(format!("{}.effects.log", args.db.display()));
    println!(
        "agent pid {}, database {}",
        std::process::id(),
        args.db.display()
    );
    let agent = Agent {
        effects: effects.clone(),
        tool_delay: Duration::from_millis(args.tool_ms),
        token_delay: Duration::from_millis(args.token_ms),
    };
    // `start` runs the restart sweep: a turn a killed run left claimed is resumed now.
    let runtime = Runtime::builder()
        .database(&args.db)
        .runner(agent)
        .start()
        .await?;
    let sessions = runtime.sessions();
    let id = SessionId::new("agent")?;
    let directory = std::env::current_dir()?.display().to_string();
    let create = CreateSession {
        id: Some(id.clone()),
        directory,
        ..CreateSession::default()
    };
    sessions.create(create).await?; // idempotent: a later run finds it stored
    if let Some(text) = args.prompt {
        let prompt = PromptInput::new(id.clone(), json!({ "text": text }));
        let admission = sessions.prompt(prompt).await?;
        println!(
            "prompt {} admitted at seq {}",
            admission.id, admission.admitted_seq
        );
        let terminal = sessions.await_served(&admission).await?;
        println!("its turn ended: {terminal:?}");
    } else {
        sessions.await_idle(&id).await?;
        let last = sessions.last_terminal(&id).await?;
        let last = last.map_or(Value::Null, |e| json!({ "type": e.kind, "data": e.data }));
        println!("idle; the last turn's terminal: {last}");
    }
    print_effects(&effects);
    runtime.shutdown().await;
    Ok(())
}

fn print_effects(path: &Path) {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    println!("effect log {}:", path.display());
    for line in log.lines() {
        println!("  {line}");
    }
}
