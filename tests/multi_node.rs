//! Several nodes over one PostgreSQL database, with real processes: the `server` example (built
//! with `--features postgres`) runs as each node, on a throwaway PostgreSQL cluster
//! (`testing::postgres`), one database per test. The tests talk to the nodes over HTTP (any
//! node serves any session), kill (`SIGKILL`) or freeze (`SIGSTOP`) them, stop or restart
//! PostgreSQL under them (`PgCluster::stop_server`, `restart`), and check what the
//! database holds, with the sync `postgres` client: the crash matrix's store-wide invariants
//! (`tests/common/store.rs`) over a snapshot of the shared tables, plus what only several nodes
//! promise (each event's node and epoch: one writer per epoch, epochs never decreasing along a
//! log, a zombie's late writes rejected).
//!
//! Everything here blocks, from plain `#[test]` threads (the sync `postgres` client panics
//! inside a tokio runtime). Without PostgreSQL each test prints one skip line (and fails under
//! `CI=true`).
#![cfg(feature = "testing-postgres")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::nodes::{
    call, connect, notices_after, now_ms, quiesce, request, sql_violations, words, Ledger,
    NodeOptions, Nodes, PgView, Spread, Sse, SseEvent,
};
use common::{run_seed, StoreView, XorShift};
use durable_sessions::kind;
use durable_sessions::testing::postgres::{start_or_skip, PgCluster, ShutdownMode};
use serde_json::json;

/// How long a test waits for the nodes to settle (no claim, nothing owed) after its workload.
const SETTLE: Duration = Duration::from_secs(60);

/// One test at a time: each runs three servers and a PostgreSQL cluster, and the takeover
/// times they measure mean something only on a machine that is not running the others too.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The test's database on a fresh cluster, or `None` (after one skip line) without PostgreSQL;
/// holds [`ONE_AT_A_TIME`] for the test.
fn database(test: &str, name: &str) -> Option<(MutexGuard<'static, ()>, PgCluster, String)> {
    let _ = env_logger::builder().is_test(true).try_init();
    let turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cluster = start_or_skip(test)?;
    let url = cluster
        .create_database(name)
        .unwrap_or_else(|e| panic!("create database {name}: {e}"));
    Some((turn, cluster, url))
}

/// Creates `count` sessions `s000`, `s001`, …, session `i` on node `i % nodes` (several
/// threads).
fn create_sessions(nodes: &Nodes, count: usize) -> Vec<String> {
    let ids: Vec<String> = (0..count).map(|i| format!("s{i:03}")).collect();
    let n = nodes.nodes.len();
    std::thread::scope(|scope| {
        for t in 0..4 {
            let ids = &ids;
            scope.spawn(move || {
                for (i, id) in ids.iter().enumerate().filter(|(i, _)| i % 4 == t) {
                    call(
                        nodes.addr(i % n),
                        "POST",
                        "/sessions",
                        Some(&json!({ "id": id, "directory": "/multi" })),
                        201,
                    );
                }
            });
        }
    });
    ids
}

/// Admits prompt `message` (`text`) to `session` through `spread`, starting at node
/// `preferred`; records it in `ledger` once a node acknowledged it (202). The message id makes
/// a retry on another node (the first one was killed) idempotent.
fn prompt(
    spread: &Spread,
    ledger: &Ledger,
    preferred: usize,
    session: &str,
    message: &str,
    text: &str,
    delivery: &str,
) -> usize {
    let body = json!({ "id": message, "text": text, "delivery": delivery });
    let path = format!("/sessions/{session}/prompt");
    let (node, status, answer) = spread.send(preferred, "POST", &path, Some(&body));
    assert_eq!(status, 202, "prompt {message} on node {node}: {answer}");
    assert_eq!(answer["id"], json!(message), "{answer}");
    ledger.ack(message, session);
    node
}

/// Asks to interrupt `session` through `spread`.
fn interrupt(spread: &Spread, preferred: usize, session: &str) {
    let path = format!("/sessions/{session}/interrupt");
    let (node, status, answer) = spread.send(preferred, "POST", &path, None);
    assert_eq!(status, 200, "interrupt {session} on node {node}: {answer}");
}

/// Every store-wide invariant on `view` (the crash matrix's, the cluster's, the SQL ones) and
/// every acknowledged prompt served (all reported together); returns the ledger's tally.
fn assert_every_invariant(
    cluster: &PgCluster,
    db: &mut postgres::Client,
    view: &PgView,
    ledger: &Ledger,
    max_attempts: u32,
    nodes: &Nodes,
    context: &str,
) -> [usize; 4] {
    let mut bad = view.store.violations(max_attempts);
    bad.extend(view.cluster_violations());
    bad.extend(sql_violations(db));
    let (tally, unserved) = ledger.problems(&view.store);
    bad.extend(unserved);
    if !bad.is_empty() {
        // The logs of a few sessions of each kind of violation (the first word tells it).
        let mut sessions: BTreeSet<String> = BTreeSet::new();
        let mut per_kind: BTreeMap<String, usize> = BTreeMap::new();
        for line in &bad {
            let kind = line.split([' ', '#', ':']).next().unwrap_or("").to_owned();
            let kind = if kind.starts_with('s') {
                "session".into()
            } else {
                kind
            };
            let session = view
                .store
                .sessions
                .keys()
                .find(|s| line.contains(s.as_str()));
            let taken = per_kind.entry(kind).or_default();
            if let Some(session) = session.filter(|_| *taken < 3) {
                if sessions.insert(session.clone()) {
                    *taken += 1;
                }
            }
        }
        let logs: Vec<String> = sessions
            .iter()
            .map(|s| format!("{s}:\n{}", view.log(s, None)))
            .collect();
        // The server's own account of the errors the nodes saw (their logs say "db error").
        let server_log = cluster.log();
        let errors: Vec<&str> = server_log
            .lines()
            .filter(|l| l.contains("ERROR") || l.contains("DETAIL") || l.contains("STATEMENT"))
            .collect();
        let errors = errors[errors.len().saturating_sub(40)..].join("\n");
        panic!(
            "{context}: {} invariant violation(s):\n{}\n\nlogs:\n{}\n\nPostgreSQL errors:\n{errors}\n\nnodes {:?}\n{}",
            bad.len(),
            bad.iter().take(40).cloned().collect::<Vec<_>>().join("\n"),
            logs.join("\n"),
            view.nodes,
            nodes.logs(15)
        );
    }
    tally
}

/// Min, median and max of `values` (ms).
fn spread_of(values: &mut [i64]) -> (i64, i64, i64) {
    values.sort_unstable();
    match values {
        [] => (0, 0, 0),
        _ => (
            values[0],
            values[values.len() / 2],
            values[values.len() - 1],
        ),
    }
}

// ---------------------------------------------------------------------------------------------

/// Three nodes with a 2 s lease, 300 sessions created and prompted across them under a
/// prompt/interrupt workload; one node is `SIGKILL`ed while it owns claimed turns (read from the
/// database: its sessions with a claim). Every one of those turns resumes on a survivor within
/// lease + 1 s of the kill, allowing the takeover tick on top (the lease lapses at most a lease
/// after the kill, and survivors adopt every half lease), exactly once, with the restart notice
/// right before its claim; every acknowledged prompt is then answered (or was interrupted), and
/// every invariant holds.
#[test]
fn a_killed_nodes_turns_resume_on_a_survivor_within_the_lease() {
    let Some((_turn, cluster, url)) = database(
        "a_killed_nodes_turns_resume_on_a_survivor_within_the_lease",
        "killed_node",
    ) else {
        return;
    };
    const LEASE: Duration = Duration::from_secs(2);
    const MAX_ATTEMPTS: u32 = 10;
    let options = NodeOptions {
        lease: LEASE,
        word_delay: Duration::from_millis(100),
        max_resume_attempts: MAX_ATTEMPTS,
        server_log: Some(cluster.dir().join("postgres.log")),
    };
    let mut nodes = Nodes::start(&url, 3, &options);
    let mut db = connect(&url);
    let begun = Instant::now();
    let sessions = create_sessions(&nodes, 300);
    let created = begun.elapsed();
    let ledger = Ledger::default();
    let spread = nodes.spread();
    let interrupts = Arc::new(AtomicBool::new(true));
    let interrupted = Arc::new(AtomicUsize::new(0));
    const VICTIM: usize = 1;
    // Admissions wait for a group commit: more clients, more throughput.
    const THREADS: usize = 12;

    // The workload: per session, three queued prompts of 12 words (a turn of ~1.3 s each), the
    // first through the next node, the others through the ones after; one session in four is
    // interrupted right after its first prompt (through yet another node) while interrupts
    // are allowed.
    let workload: Vec<_> = (0..THREADS)
        .map(|t| {
            let (spread, ledger, sessions) = (spread.clone(), ledger.clone(), sessions.clone());
            let (interrupts, interrupted) = (interrupts.clone(), interrupted.clone());
            std::thread::spawn(move || {
                let mine: Vec<(usize, &String)> = sessions
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| i % THREADS == t)
                    .collect();
                for round in 0..3 {
                    for &(i, session) in &mine {
                        let text = words(12, &format!("{session}r{round}"));
                        let message = format!("{session}-p{round}");
                        prompt(
                            &spread,
                            &ledger,
                            i + round + 1,
                            session,
                            &message,
                            &text,
                            "queue",
                        );
                        if round == 0 && i % 4 == 0 && interrupts.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(5));
                            interrupt(&spread, i + 2, session);
                            interrupted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();

    // Kill the victim once it owns claimed turns.
    let mut victim_id;
    let owned_claims =
        "SELECT count(*) FROM session WHERE owner_node = $1 AND time_suspended IS NOT NULL";
    // As many as it gets (about a third of the sessions), or at least 10 once its count is
    // clearly past its peak (a fast machine runs the whole workload in seconds) or after 20 s.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut peak = 0;
    loop {
        // Its newest id: a node that missed its lease renewals (a loaded machine) rejoins
        // under a new one.
        victim_id = nodes.nodes[VICTIM].node_id(&mut db);
        let owned: i64 = db.query_one(owned_claims, &[&victim_id]).unwrap().get(0);
        peak = peak.max(owned);
        if owned >= 75 || (owned >= 10 && (owned <= peak - 10 || Instant::now() > deadline)) {
            break;
        }
        if Instant::now() >= deadline + Duration::from_secs(10) {
            let owners: Vec<String> = db
                .query(
                    "SELECT coalesce(s.owner_node, '-'), coalesce(n.name, '-'), \
                     count(*) FILTER (WHERE s.time_suspended IS NOT NULL), count(*) \
                     FROM session s LEFT JOIN node n ON n.node_id = s.owner_node \
                     GROUP BY 1, 2 ORDER BY 1",
                    &[],
                )
                .unwrap()
                .iter()
                .map(|r| {
                    let (id, name): (String, String) = (r.get(0), r.get(1));
                    let (claimed, all): (i64, i64) = (r.get(2), r.get(3));
                    format!("{id} ({name}): {claimed} claimed of {all}")
                })
                .collect();
            let events: i64 = db
                .query_one("SELECT count(*) FROM event", &[])
                .unwrap()
                .get(0);
            panic!(
                "node n{VICTIM} ({victim_id}) never owned 10 claimed turns ({owned}, at most {peak}); \
                 owners: {owners:?}; {events} events, {} prompts acknowledged\n{}",
                ledger.acked().len(),
                nodes.logs(20)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    interrupts.store(false, Ordering::SeqCst);
    let killed_at = now_ms();
    let kill_instant = Instant::now();
    let kill_after = begun.elapsed();
    nodes.kill(VICTIM);
    // When its lease lapses (the database's clock; same machine as ours): at most a lease
    // after the kill, at least two thirds of one (it renews every lease / 3).
    let lapse_at: i64 = db
        .query_one(
            "SELECT (extract(epoch FROM lease_until) * 1000)::bigint FROM node \
             WHERE node_id = $1",
            &[&victim_id],
        )
        .unwrap()
        .get(0);
    // What it left: its claimed turns, and where each log stood at the kill.
    let left: BTreeMap<String, (u64, i64)> = db
        .query(
            "SELECT s.id, q.seq, s.owner_epoch FROM session s JOIN event_sequence q \
             ON q.aggregate_id = s.id WHERE s.owner_node = $1 AND s.time_suspended IS NOT NULL",
            &[&victim_id],
        )
        .unwrap()
        .into_iter()
        .map(|r| {
            let seq: i64 = r.get(1);
            (r.get::<_, String>(0), (seq as u64, r.get::<_, i64>(2)))
        })
        .collect();
    assert!(
        left.len() >= 10,
        "the victim held only {} claimed turns at its kill",
        left.len()
    );

    // Watch every one of them be taken over: the first event a survivor writes after the kill
    // that settles it — the restart notice, or the sweep's `interrupted`/`aborted` terminal.
    let ids: Vec<&str> = left.keys().map(String::as_str).collect();
    let mut taken: BTreeMap<String, (i64, i64, String)> = BTreeMap::new();
    let watch_deadline = kill_instant + LEASE * 4;
    while taken.len() < left.len() {
        let rows = db
            .query(
                "SELECT aggregate_id, seq, type, data, time FROM event \
                 WHERE aggregate_id = ANY($1) AND node <> $2 \
                 AND type IN ('session.synthetic', 'session.execution.interrupted', \
                              'session.execution.failed') ORDER BY seq",
                &[&ids, &victim_id],
            )
            .unwrap();
        let seen = now_ms();
        for row in rows {
            let session: String = row.get(0);
            let seq: i64 = row.get(1);
            if taken.contains_key(&session) || (seq as u64) <= left[&session].0 {
                continue;
            }
            let kind: String = row.get(2);
            let data: String = row.get(3);
            taken.insert(session, (row.get(4), seen, format!("{kind} {data}")));
        }
        if Instant::now() > watch_deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let missing: Vec<&String> = left.keys().filter(|s| !taken.contains_key(*s)).collect();
    if !missing.is_empty() {
        let view = PgView::read(&mut db);
        let detail: Vec<String> = missing
            .iter()
            .map(|s| {
                format!(
                    "{s}: row {:?}, owner {:?}, log at the kill #{}:\n{}",
                    view.store.sessions[*s],
                    view.owners[*s],
                    left[*s].0,
                    view.log(s, Some(left[*s].0.saturating_sub(6)))
                )
            })
            .collect();
        panic!(
            "{} of the victim's {} claimed turns not taken over within {:?}: {missing:?}\n\
             nodes {:?}\n{}\n{}",
            missing.len(),
            left.len(),
            LEASE * 4,
            view.nodes,
            detail.join("\n"),
            nodes.logs(30)
        );
    }
    for handle in workload {
        handle.join().expect("workload thread");
    }
    nodes.assert_alive();

    // How long the takeover took, printed before anything else is checked.
    // From the kill: the lease (its lapse) + 1 s, allowing the takeover tick (every lease / 2)
    // on top: a survivor's tick comes at most lease / 2 after the lapse, and the adoption of
    // all the turns (counted, then noticed and claimed, in two transactions) must commit within
    // the second after it.
    let tick = LEASE / 2;
    let bound = LEASE + Duration::from_secs(1) + tick;
    let (mut stamped, mut observed, mut after_lapse) = (Vec::new(), Vec::new(), Vec::new());
    let mut late = Vec::new();
    for (session, (time, seen, what)) in &taken {
        stamped.push(time - killed_at);
        observed.push(seen - killed_at);
        after_lapse.push(seen - lapse_at);
        // Seen committed (polled every 20 ms): an upper bound of when it resumed.
        if u128::try_from(seen - killed_at).unwrap_or(0) > bound.as_millis() {
            late.push(format!(
                "{session}: seen {} ms after the kill, stamped {} ms ({what})",
                seen - killed_at,
                time - killed_at
            ));
        }
    }
    let (stamp_min, stamp_median, stamp_max) = spread_of(&mut stamped);
    let (_, seen_median, seen_max) = spread_of(&mut observed);
    let (_, _, lapse_max) = spread_of(&mut after_lapse);
    eprintln!(
        "killed node n{VICTIM} ({victim_id}) at {kill_after:?} holding {} claimed turns; \
         takeover after the kill (event time) min {stamp_min} ms, median {stamp_median} ms, \
         max {stamp_max} ms (seen committed: median {seen_median} ms, max {seen_max} ms); the \
         lease lapsed {} ms after the kill, the last adoption was seen {lapse_max} ms after the \
         lapse; lease {} ms, tick {} ms, bound {} ms",
        left.len(),
        lapse_at - killed_at,
        LEASE.as_millis(),
        tick.as_millis(),
        bound.as_millis(),
    );

    // Settle, then check.
    let workload_done = begun.elapsed();
    let view = quiesce(&mut db, SETTLE, "after the kill");
    let settled = begun.elapsed();
    let tally = assert_every_invariant(
        &cluster,
        &mut db,
        &view,
        &ledger,
        MAX_ATTEMPTS,
        &nodes,
        "killed",
    );
    let (mut resumed, mut fenced) = (0, 0);
    for (session, &(at_kill, epoch)) in &left {
        let what = &taken[session].2;
        let notices = notices_after(&view, session, at_kill);
        let log = || view.log(session, Some(at_kill));
        if notices.is_empty() {
            // Only a user interrupt the victim had not carried out stops a turn from resuming:
            // the survivor records it instead (interrupts stopped before the kill).
            assert!(
                what.starts_with(kind::EXECUTION_INTERRUPTED),
                "{session}: taken over without a notice: {what}\n{}",
                log()
            );
            fenced += 1;
            continue;
        }
        assert_eq!(
            notices.len(),
            1,
            "{session}: resumed more than once\n{}",
            log()
        );
        let (notice, writer) = notices[0];
        let survivor = writer.node.clone().unwrap_or_default();
        assert_ne!(survivor, victim_id, "{session}: resumed by the dead node");
        assert!(
            writer.epoch.is_some_and(|e| e > epoch),
            "{session}: resumed at epoch {:?}, the victim's was {epoch}\n{}",
            writer.epoch,
            log()
        );
        let events = &view.store.events[session];
        let claim = &events[notice.seq as usize + 1];
        let claimer = &view.writers[session][notice.seq as usize + 1];
        assert!(
            claim.kind == kind::EXECUTION_STARTED && claimer.node.as_deref() == Some(&survivor),
            "{session}: the notice is not followed by the survivor's claim\n{}",
            log()
        );
        resumed += 1;
    }
    eprintln!(
        "{resumed} resumed, {fenced} recorded as interrupted; {} prompts acknowledged: {} \
         answered, {} interrupted mid-turn, {} fenced before running, {} given up; {} interrupt \
         requests; 300 sessions created in {created:?}, the workload sent by \
         {workload_done:?}, settled at {settled:?}",
        ledger.acked().len(),
        tally[0],
        tally[1],
        tally[2],
        tally[3],
        interrupted.load(Ordering::Relaxed)
    );
    assert!(
        late.is_empty(),
        "{} turns resumed later than lease + 1 s + the tick ({} ms) after the kill:\n{}",
        late.len(),
        bound.as_millis(),
        late.join("\n")
    );
}

/// A node frozen with `SIGSTOP` past its lease while it runs turns: the other nodes take its
/// sessions over (a new epoch each) and resume its turns; continued with `SIGCONT`, the zombie
/// wakes mid-drain and tries to go on writing. Every one of those late writes is rejected: no
/// event of the zombie's node lands in a session's log after the takeover's first write (none
/// of an older epoch, none at all), no turn has two terminals, and along every session's log
/// the epoch never decreases.
#[test]
fn a_paused_zombie_node_is_fenced_and_writes_nothing_after_takeover() {
    let Some((_turn, cluster, url)) = database(
        "a_paused_zombie_node_is_fenced_and_writes_nothing_after_takeover",
        "zombie_node",
    ) else {
        return;
    };
    const LEASE: Duration = Duration::from_secs(2);
    const MAX_ATTEMPTS: u32 = 10;
    let options = NodeOptions {
        lease: LEASE,
        // Long turns (~4 s): the zombie is still mid-reply when it wakes.
        word_delay: Duration::from_millis(200),
        max_resume_attempts: MAX_ATTEMPTS,
        server_log: Some(cluster.dir().join("postgres.log")),
    };
    let mut nodes = Nodes::start(&url, 3, &options);
    let mut db = connect(&url);
    let sessions = create_sessions(&nodes, 60);
    let ledger = Ledger::default();
    let spread = nodes.spread();
    const ZOMBIE: usize = 2;
    // Every session prompted twice (queued), through every node in turn: each node wakes (and so
    // owns) about a third of them.
    for (i, session) in sessions.iter().enumerate() {
        for round in 0..2 {
            let text = words(18, &format!("{session}r{round}"));
            let message = format!("{session}-p{round}");
            prompt(&spread, &ledger, i, session, &message, &text, "queue");
        }
    }
    let zombie_id = nodes.nodes[ZOMBIE].node_id(&mut db);
    let owned = |db: &mut postgres::Client| -> BTreeMap<String, i64> {
        db.query(
            "SELECT id, owner_epoch FROM session WHERE owner_node = $1 \
             AND time_suspended IS NOT NULL",
            &[&zombie_id],
        )
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while owned(&mut db).len() < 10 {
        assert!(Instant::now() < deadline, "the zombie never ran 10 turns");
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = |nodes: &Nodes| call(nodes.addr(ZOMBIE), "GET", "/stats", None, 200);
    let failed_before = stats(&nodes)["failed_write_requests"].as_u64().unwrap_or(0);
    // Freeze it mid-turn (no client talks to it from now on).
    nodes.take_out(ZOMBIE);
    nodes.nodes[ZOMBIE].pause();
    let paused_at = Instant::now();
    let frozen = owned(&mut db);
    // Where each of its logs stood: nothing of the zombie can commit after this.
    let at_pause: BTreeMap<String, u64> = db
        .query(
            "SELECT aggregate_id, seq FROM event_sequence WHERE aggregate_id = ANY($1)",
            &[&frozen.keys().map(String::as_str).collect::<Vec<_>>()],
        )
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get::<_, i64>(1) as u64))
        .collect();
    // The others take over every one of its sessions with a claim.
    let deadline = paused_at + LEASE * 4;
    loop {
        let still: Vec<String> = db
            .query(
                "SELECT id FROM session WHERE owner_node = $1 AND time_suspended IS NOT NULL",
                &[&zombie_id],
            )
            .unwrap()
            .into_iter()
            .map(|r| r.get(0))
            .collect();
        if still.is_empty() && paused_at.elapsed() > LEASE + Duration::from_millis(500) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the zombie's claimed sessions {still:?} were not taken over\n{}",
            nodes.logs(30)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Let the survivors get well into the resumed turns, then wake the zombie mid-reply.
    std::thread::sleep(Duration::from_millis(500));
    nodes.nodes[ZOMBIE].resume();
    // Its word timers fire at once: every drain goes on with its reply (the words are
    // live-only, so a drain's next durable write is its reply's append) while its lease thread
    // finds the lease lapsed; give it a few words' time.
    std::thread::sleep(Duration::from_secs(2));
    nodes.assert_alive();
    // It did wake up to go on: its journal rejected writes (the fence), or it found its lease
    // lost and cancelled its turns before they wrote again (which of the two comes first is a
    // race: the replies' remaining words against one lease renewal), and it is still up.
    let failed_after = stats(&nodes)["failed_write_requests"].as_u64().unwrap_or(0);
    let cancelled = nodes.nodes[ZOMBIE].log_count("lease lost; cancelling every local turn");
    assert!(
        failed_after > failed_before || cancelled > 0,
        "the zombie's journal rejected no write after it woke ({failed_before} → \
         {failed_after}) and it never cancelled its turns: did it wake?\n{}",
        nodes.nodes[ZOMBIE].log_tail(40)
    );
    let view = quiesce(&mut db, SETTLE, "after the zombie woke");
    let tally = assert_every_invariant(
        &cluster,
        &mut db,
        &view,
        &ledger,
        MAX_ATTEMPTS,
        &nodes,
        "zombie",
    );

    // No late write of the zombie: in each of its sessions, nothing of its node after the first
    // write of the epoch that took the session over.
    let mut checked = 0;
    for (session, &epoch) in &frozen {
        let writers = &view.writers[session];
        let Some(first) = writers
            .iter()
            .find(|w| w.epoch.is_some_and(|e| e > epoch) && w.node.as_deref() != Some(&zombie_id))
        else {
            panic!(
                "{session}: never taken over from epoch {epoch}\n{}",
                view.log(session, None)
            );
        };
        assert!(
            first.seq > at_pause[session],
            "{session}: taken over before the pause?\n{}",
            view.log(session, None)
        );
        let late: Vec<_> = writers
            .iter()
            .filter(|w| w.seq > first.seq && w.node.as_deref() == Some(&zombie_id))
            .collect();
        let older = late
            .iter()
            .filter(|w| w.epoch.is_some_and(|e| e < first.epoch.unwrap()));
        assert_eq!(
            older.count(),
            0,
            "{session}: the zombie wrote at an older epoch after the takeover\n{}",
            view.log(session, None)
        );
        assert!(
            late.is_empty(),
            "{session}: the zombie wrote after the takeover's first write (#{})\n{}",
            first.seq,
            view.log(session, None)
        );
        checked += 1;
    }
    // Its writes that committed after the pause was read (in flight at the `SIGSTOP`, all
    // before the takeover, as checked above).
    let after_pause: usize = frozen
        .keys()
        .map(|s| {
            view.writers[s]
                .iter()
                .filter(|w| w.seq > at_pause[s] && w.node.as_deref() == Some(&zombie_id))
                .count()
        })
        .sum();
    let fenced_lines = nodes.nodes[ZOMBIE].log_count("enced");
    eprintln!(
        "zombie n{ZOMBIE} ({zombie_id}) frozen with {} claimed turns, {checked} sessions \
         checked; its writes committed after the pause: {after_pause} (all before the takeover); \
         write requests its journal failed after it woke: {}; its log mentions fencing \
         {fenced_lines} times; {} prompts: {} answered, {} interrupted, {} \
         fenced, {} given up",
        frozen.len(),
        failed_after - failed_before,
        ledger.acked().len(),
        tally[0],
        tally[1],
        tally[2],
        tally[3]
    );

    // Fenced, it rejoined under a new id with a live lease, and serves sessions again.
    let rejoined = nodes.nodes[ZOMBIE].node_id(&mut db);
    assert_ne!(
        rejoined,
        zombie_id,
        "the zombie did not rejoin under a new node id\n{}",
        nodes.nodes[ZOMBIE].log_tail(40)
    );
    let live: bool = db
        .query_one(
            "SELECT lease_until > now() FROM node WHERE node_id = $1",
            &[&rejoined],
        )
        .unwrap()
        .get(0);
    assert!(live, "the rejoined node {rejoined} holds no live lease");
    let addr = nodes.addr(ZOMBIE).to_owned();
    call(
        &addr,
        "POST",
        "/sessions",
        Some(&json!({ "id": "after-rejoin", "directory": "/multi" })),
        201,
    );
    call(
        &addr,
        "POST",
        "/sessions/after-rejoin/prompt",
        Some(&json!({ "id": "after-rejoin-p", "text": "back again" })),
        202,
    );
    let deadline = Instant::now() + SETTLE;
    loop {
        let owner: Option<String> = db
            .query_opt(
                "SELECT owner_node FROM session WHERE id = 'after-rejoin'",
                &[],
            )
            .unwrap()
            .and_then(|r| r.get(0));
        let answered: i64 = db
            .query_one(
                "SELECT COUNT(*) FROM session_message WHERE session_id = 'after-rejoin' \
                 AND type = 'assistant'",
                &[],
            )
            .unwrap()
            .get(0);
        if answered == 1 {
            assert_eq!(
                owner.as_deref(),
                Some(rejoined.as_str()),
                "served by another node"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rejoined node never answered a new session\n{}",
            nodes.nodes[ZOMBIE].log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A session created on node A, prompted on node B, interrupted on node C and prompted again:
/// event streams opened on C (from the start, following live; and replaying from the middle with
/// `Last-Event-ID`, then following; and `?after=` at the end) see every event of the session in
/// order, with no gap and no duplicate, exactly as the database holds them — including the
/// events the owner (another node) committed. Each of three sessions gives the roles to other
/// nodes.
#[test]
fn any_node_admits_and_streams_any_session() {
    let Some((_turn, cluster, url)) =
        database("any_node_admits_and_streams_any_session", "any_node")
    else {
        return;
    };
    let options = NodeOptions {
        lease: Duration::from_secs(5),
        word_delay: Duration::from_millis(50),
        max_resume_attempts: 10,
        server_log: Some(cluster.dir().join("postgres.log")),
    };
    let nodes = Nodes::start(&url, 3, &options);
    let mut db = connect(&url);
    let node_ids: Vec<String> = nodes.nodes.iter().map(|n| n.node_id(&mut db)).collect();
    let ledger = Ledger::default();
    let spread = nodes.spread();
    for k in 0..3 {
        let (a, b, c) = (k, (k + 1) % 3, (k + 2) % 3);
        let session = format!("any{k}");
        call(
            nodes.addr(a),
            "POST",
            "/sessions",
            Some(&json!({ "id": session, "directory": "/any" })),
            201,
        );
        // Followed live on C from the beginning.
        let mut live = Sse::open(nodes.addr(c), &session, None, None).expect("stream on C");
        let mut live_seen = Vec::new();
        assert!(
            live.read_until(&mut live_seen, Duration::from_secs(10), |s| !s.is_empty()),
            "no created event on C's stream"
        );
        // A long turn, admitted on B (B owns it: nobody did), interrupted on C mid-reply.
        let long = words(40, "long");
        prompt(
            &spread,
            &ledger,
            b,
            &session,
            &format!("{session}-p0"),
            &long,
            "queue",
        );
        // (The reply's words are live-only events, which stay on the node running the turn:
        // C sees the promotion, durable, then the interrupt mid-reply.)
        let promoted = |s: &[SseEvent]| s.iter().any(|e| e.kind == kind::PROMPT_PROMOTED);
        assert!(
            live.read_until(&mut live_seen, Duration::from_secs(10), promoted),
            "C's stream saw no promotion by the turn B runs: {live_seen:?}"
        );
        let answer = call(
            nodes.addr(c),
            "POST",
            &format!("/sessions/{session}/interrupt"),
            None,
            200,
        );
        assert_eq!(answer["interrupted"], json!(true), "{answer}");
        let ended = |s: &[SseEvent]| s.iter().any(|e| e.kind == kind::EXECUTION_INTERRUPTED);
        assert!(
            live.read_until(&mut live_seen, Duration::from_secs(10), ended),
            "C's stream saw no interrupted terminal: {live_seen:?}"
        );
        // Replay from the middle on C, then follow: a second prompt, through A this time.
        let middle = live_seen[live_seen.len() / 2].id;
        let mut replay = Sse::open(nodes.addr(c), &session, Some(0), Some(middle)).expect("replay");
        prompt(
            &spread,
            &ledger,
            a,
            &session,
            &format!("{session}-p1"),
            "short reply",
            "queue",
        );
        let view = quiesce(&mut db, Duration::from_secs(30), "any node");
        let last = view.store.sequences[&session];
        let all_read = |s: &[SseEvent]| s.last().is_some_and(|e| e.id >= last);
        let mut replay_seen = Vec::new();
        assert!(live.read_until(&mut live_seen, Duration::from_secs(10), all_read));
        assert!(replay.read_until(&mut replay_seen, Duration::from_secs(10), all_read));
        // `?after=` at the end: a pure replay.
        let mut tail = Sse::open(nodes.addr(c), &session, Some(last - 3), None).expect("tail");
        let mut tail_seen = Vec::new();
        assert!(tail.read_until(&mut tail_seen, Duration::from_secs(10), all_read));
        // Nothing more comes on any of them.
        std::thread::sleep(Duration::from_millis(300));
        for (stream, seen) in [
            (&mut live, &mut live_seen),
            (&mut replay, &mut replay_seen),
            (&mut tail, &mut tail_seen),
        ] {
            let extra = stream.next(Instant::now() + Duration::from_millis(200));
            assert!(
                matches!(extra, Ok(None)),
                "an extra frame: {extra:?} after {seen:?}"
            );
        }

        let events = &view.store.events[&session];
        let writers = &view.writers[&session];
        let check = |what: &str, seen: &[SseEvent], from: u64| {
            let expected: Vec<u64> = (from..=last).collect();
            let ids: Vec<u64> = seen.iter().map(|e| e.id).collect();
            assert_eq!(
                ids, expected,
                "{session}: {what} stream on C: gap or duplicate"
            );
            for e in seen {
                let stored = &events[e.id as usize];
                assert_eq!(e.kind, stored.kind, "{session}#{}: {what}", e.id);
                assert_eq!(e.data["data"], stored.data, "{session}#{}: {what}", e.id);
                assert_eq!(e.data["seq"], json!(e.id), "{session}#{}: {what}", e.id);
                assert_eq!(e.data["session_id"], json!(session), "{what}");
            }
        };
        check("live", &live_seen, 0);
        check("Last-Event-ID", &replay_seen, middle + 1);
        check("?after=", &tail_seen, last - 2);
        // The roles: created by A, admitted by B then A, interrupt requested by C, the turns
        // written by their owner — not C.
        let by = |seq: usize| writers[seq].node.clone().unwrap_or_default();
        assert_eq!(by(0), node_ids[a], "{session}: created elsewhere than A");
        let writer_of = |kind_: &str| -> BTreeSet<String> {
            events
                .iter()
                .filter(|e| e.kind == kind_)
                .map(|e| by(e.seq as usize))
                .collect()
        };
        assert_eq!(
            writer_of(kind::INTERRUPT_REQUESTED),
            BTreeSet::from([node_ids[c].clone()]),
            "{session}"
        );
        assert_eq!(
            writer_of(kind::PROMPT_ADMITTED),
            BTreeSet::from([node_ids[a].clone(), node_ids[b].clone()]),
            "{session}"
        );
        let turn_writers = writer_of(kind::PROMPT_PROMOTED);
        assert!(
            !turn_writers.is_empty() && !turn_writers.contains(&node_ids[c]),
            "{session}: the turns ran on {turn_writers:?}, C is {}\n{}",
            node_ids[c],
            view.log(&session, None)
        );
        assert_eq!(
            view.store.count_kind(&session, kind::EXECUTION_INTERRUPTED),
            1
        );
        assert_eq!(
            view.store.count_kind(&session, kind::EXECUTION_SUCCEEDED),
            1
        );
        eprintln!(
            "{session}: created on n{a}, prompted on n{b} and n{a}, interrupted on n{c}, turns \
             run by {:?}; streams on n{c} read {} (live), {} (Last-Event-ID {middle}) and {} \
             (?after={}) events, none missing or repeated",
            turn_writers
                .iter()
                .map(|n| &view.nodes[n])
                .collect::<Vec<_>>(),
            live_seen.len(),
            replay_seen.len(),
            tail_seen.len(),
            last - 3
        );
    }
    let view = PgView::read(&mut db);
    assert_every_invariant(&cluster, &mut db, &view, &ledger, 10, &nodes, "any node");
}

/// At least 50 `SIGKILL`s of random nodes (each restarted after a random pause, so at least two
/// of the three nodes run at any time) under a prompt/interrupt workload over 60 sessions with
/// a 1 s lease; then, once every turn settled, the crash matrix's store-wide invariants over the
/// shared tables: per-session seqs gap-free from 0; at most one terminal per claimed turn; every
/// acknowledged prompt promoted and answered (or interrupted, or fenced by a later interrupt, or
/// given up by an aborted turn); no claim left on a session whose turn ended; the resume budget
/// respected; and the epoch never decreasing along a log, one writer per epoch.
#[test]
fn random_node_kills_keep_every_invariant() {
    let Some((_turn, cluster, url)) =
        database("random_node_kills_keep_every_invariant", "random_kills")
    else {
        return;
    };
    const KILLS: usize = 50;
    let mut chaos = Chaos::start(
        "random_node_kills_keep_every_invariant",
        &cluster,
        &url,
        Duration::from_secs(1),
    );
    let started = Instant::now();
    let mut kills_per_node = [0usize; 3];
    for _ in 0..KILLS {
        std::thread::sleep(Duration::from_millis(500 + chaos.rng.below(1000)));
        chaos.nodes.assert_alive();
        let victim = chaos.rng.below(3) as usize;
        chaos.nodes.kill(victim);
        kills_per_node[victim] += 1;
        // Sometimes restart at once (the dead boot's lease still runs), sometimes after it
        // lapsed.
        std::thread::sleep(Duration::from_millis(chaos.rng.below(1500)));
        chaos.nodes.restart(victim);
    }
    let done = format!(
        "{KILLS} kills ({kills_per_node:?} per node) in {:?}",
        started.elapsed()
    );
    let notices = chaos.finish(&cluster, &url, "kills", &done);
    assert!(
        notices > 0,
        "no turn was ever resumed: the kills hit nothing"
    );
}

/// A chaos test's running system: three nodes on the shared database, 60 sessions, the random
/// workload of four clients, and the seeded random source the disruptions draw from.
struct Chaos {
    nodes: Nodes,
    ledger: Ledger,
    stop: Arc<AtomicBool>,
    interrupts: Arc<AtomicUsize>,
    workload: Vec<std::thread::JoinHandle<()>>,
    rng: XorShift,
}

impl Chaos {
    /// The resume budget of every node of a chaos test.
    const MAX_ATTEMPTS: u32 = 3;

    /// Starts the nodes (leases of `lease`), the sessions and the workload, seeded from
    /// `DS_SEED` (printed, to replay a run).
    fn start(test: &str, cluster: &PgCluster, url: &str, lease: Duration) -> Chaos {
        let seed = run_seed();
        eprintln!("{test}: DS_SEED={seed}");
        let options = NodeOptions {
            lease,
            word_delay: Duration::from_millis(40),
            max_resume_attempts: Self::MAX_ATTEMPTS,
            server_log: Some(cluster.dir().join("postgres.log")),
        };
        let nodes = Nodes::start(url, 3, &options);
        let sessions = create_sessions(&nodes, 60);
        let ledger = Ledger::default();
        let stop = Arc::new(AtomicBool::new(false));
        let interrupts = Arc::new(AtomicUsize::new(0));
        let workload = random_workload(
            &nodes.spread(),
            &ledger,
            &sessions,
            seed,
            &stop,
            &interrupts,
        );
        Chaos {
            nodes,
            ledger,
            stop,
            interrupts,
            workload,
            rng: XorShift::new(seed),
        }
    }

    /// Stops the workload, waits until the store settles, checks every invariant after
    /// `what` (the disruptions, `done` saying which) and returns how many restart notices
    /// the turns got.
    fn finish(mut self, cluster: &PgCluster, url: &str, what: &str, done: &str) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        for handle in self.workload {
            handle.join().expect("workload thread");
        }
        self.nodes.assert_alive();
        let mut db = connect(url);
        let settling = Instant::now();
        let view = quiesce(&mut db, SETTLE, &format!("after the {what}"));
        eprintln!("{done}, settled {:?} later", settling.elapsed());
        let tally = assert_every_invariant(
            cluster,
            &mut db,
            &view,
            &self.ledger,
            Self::MAX_ATTEMPTS,
            &self.nodes,
            what,
        );
        summarize(&view, &self.ledger, tally, &self.interrupts)
    }
}

/// The random workload of the chaos tests: four clients (seeded from `seed`) sending requests to
/// random sessions through random nodes until `stop`, 5 to 45 ms apart: 12% interrupts, the
/// rest prompts of 3 to 10 words (30% of them `steer`, the others `queue`).
fn random_workload(
    spread: &Spread,
    ledger: &Ledger,
    sessions: &[String],
    seed: u64,
    stop: &Arc<AtomicBool>,
    interrupts: &Arc<AtomicUsize>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..4u64)
        .map(|t| {
            let (spread, ledger, sessions) = (spread.clone(), ledger.clone(), sessions.to_vec());
            let (stop, interrupts) = (stop.clone(), interrupts.clone());
            std::thread::spawn(move || {
                let mut rng = XorShift::new(seed ^ (t + 1));
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let i = rng.below(sessions.len() as u64) as usize;
                    let session = &sessions[i];
                    let node = rng.below(3) as usize;
                    if rng.chance(120) {
                        interrupt(&spread, node, session);
                        interrupts.fetch_add(1, Ordering::Relaxed);
                    } else {
                        let delivery = if rng.chance(300) { "steer" } else { "queue" };
                        let text = words(3 + rng.below(8) as usize, &format!("t{t}n{n}"));
                        let message = format!("{session}-t{t}-{n}");
                        prompt(&spread, &ledger, node, session, &message, &text, delivery);
                        n += 1;
                    }
                    std::thread::sleep(Duration::from_millis(5 + rng.below(40)));
                }
            })
        })
        .collect()
}

/// How many restart notices and `aborted` terminals the store holds, over every session.
fn notices_and_aborts(store: &StoreView) -> (usize, usize) {
    let sessions = store.sessions.keys();
    sessions.fold((0, 0), |(notices, aborts), s| {
        (notices + store.notices(s), aborts + store.aborts(s))
    })
}

/// Prints what a chaos test's workload left (events, prompts by fate, notices, aborts, changes
/// of owner); returns the number of restart notices.
fn summarize(view: &PgView, ledger: &Ledger, tally: [usize; 4], interrupts: &AtomicUsize) -> usize {
    let (notices, aborts) = notices_and_aborts(&view.store);
    let events: usize = view.store.events.values().map(Vec::len).sum();
    let epochs: i64 = view.owners.values().map(|(_, e)| *e).sum();
    eprintln!(
        "{events} events; {} prompts \
         acknowledged: {} answered, {} interrupted mid-turn, {} fenced before running, {} given \
         up; {} interrupt requests; {notices} restart notices, {aborts} aborted turns; {epochs} \
         changes of owner",
        ledger.acked().len(),
        tally[0],
        tally[1],
        tally[2],
        tally[3],
        interrupts.load(Ordering::Relaxed)
    );
    notices
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL outages

/// What became of one prompt a client sent straight to one node (no retry elsewhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Offered {
    /// `202`: acknowledged, in the ledger.
    Acknowledged,
    /// `503` (`store_unavailable`, or the session's actor unreachable): refused, nothing promised.
    Refused,
    /// No answer (the connection broke or timed out): nothing promised either.
    Unanswered,
}

/// Sends prompt `message` to `session` on node `addr` once; records it in `ledger` when
/// acknowledged. Any other answer than `202` or `503` is returned as an error line.
fn offer(
    addr: &str,
    ledger: &Ledger,
    session: &str,
    message: &str,
    text: &str,
) -> Result<Offered, String> {
    let body = json!({ "id": message, "text": text, "delivery": "queue" });
    let path = format!("/sessions/{session}/prompt");
    match request(addr, "POST", &path, Some(&body)) {
        Ok((202, answer)) if answer["id"] == json!(message) => {
            ledger.ack(message, session);
            Ok(Offered::Acknowledged)
        }
        Ok((503, _)) => Ok(Offered::Refused),
        Ok((status, answer)) => Err(format!("prompt {message} on {addr}: {status} {answer}")),
        Err(_) => Ok(Offered::Unanswered),
    }
}

/// Two nodes with a 10 s lease; PostgreSQL stopped (a fast or an immediate shutdown, by the
/// seed: every connection broken) for about 3 s while turns stream their replies (100 ms a word, ~1 s a turn) and four clients
/// keep prompting, then started again on the same data directory and port. A turn whose reply
/// or terminal the outage failed stays claimed and is resumed in place (or its terminal
/// retried); its owner's lease never lapses, so nothing takes it over, and no later prompt's
/// turn is claimed over it. Prompts sent during the outage may be refused (`503`); every
/// acknowledged one is answered exactly once (or interrupted, or given up by `aborted`), and
/// every store invariant holds — among them, no `execution.started` over an open claim without
/// a terminal or a restart notice in between.
#[test]
fn a_postgres_outage_shorter_than_the_lease_strands_no_acknowledged_prompt() {
    let test = "a_postgres_outage_shorter_than_the_lease_strands_no_acknowledged_prompt";
    let Some((_turn, mut cluster, url)) = database(test, "pg_outage") else {
        return;
    };
    const LEASE: Duration = Duration::from_secs(10);
    const OUTAGE: Duration = Duration::from_secs(3);
    const MAX_ATTEMPTS: u32 = 10;
    let seed = run_seed();
    // A fast shutdown (open transactions rolled back) or an immediate one (a crash: a COMMIT
    // in flight may be stored with its answer lost).
    let mode = if seed.is_multiple_of(2) {
        ShutdownMode::Fast
    } else {
        ShutdownMode::Immediate
    };
    eprintln!("{test}: DS_SEED={seed} ({} shutdown)", mode.name());
    let options = NodeOptions {
        lease: LEASE,
        word_delay: Duration::from_millis(100),
        max_resume_attempts: MAX_ATTEMPTS,
        server_log: Some(cluster.dir().join("postgres.log")),
    };
    let nodes = Nodes::start(&url, 2, &options);
    let mut db = connect(&url);
    let node_ids: Vec<String> = nodes.nodes.iter().map(|n| n.node_id(&mut db)).collect();
    let sessions = create_sessions(&nodes, 40);
    let ledger = Ledger::default();
    let addrs: Vec<String> = (0..2).map(|i| nodes.addr(i).to_owned()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let outage = Arc::new(AtomicBool::new(false));
    // Per outcome (acknowledged, refused, unanswered): [before or after the outage, during].
    let counts = Arc::new(Mutex::new(BTreeMap::<String, [usize; 2]>::new()));
    const THREADS: u64 = 4;
    let workload: Vec<_> = (0..THREADS)
        .map(|t| {
            let (ledger, sessions, addrs) = (ledger.clone(), sessions.clone(), addrs.clone());
            let (stop, outage, counts) = (stop.clone(), outage.clone(), counts.clone());
            std::thread::spawn(move || -> Vec<String> {
                let mut rng = XorShift::new(seed ^ (t + 1));
                let mut unexpected = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let session = &sessions[rng.below(sessions.len() as u64) as usize];
                    let addr = &addrs[rng.below(addrs.len() as u64) as usize];
                    let text = words(6 + rng.below(8) as usize, &format!("t{t}n{n}"));
                    let message = format!("{session}-t{t}-{n}");
                    n += 1;
                    let during = usize::from(outage.load(Ordering::SeqCst));
                    match offer(addr, &ledger, session, &message, &text) {
                        Ok(what) => {
                            counts
                                .lock()
                                .unwrap()
                                .entry(format!("{what:?}"))
                                .or_default()[during] += 1;
                        }
                        Err(line) => unexpected.push(line),
                    }
                    std::thread::sleep(Duration::from_millis(20 + rng.below(80)));
                }
                unexpected
            })
        })
        .collect();

    // Stop the server once turns are streaming (several sessions claimed).
    let claimed = "SELECT count(*) FROM session WHERE time_suspended IS NOT NULL";
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now: i64 = db.query_one(claimed, &[]).unwrap().get(0);
        if now >= 8 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never 8 claimed turns at once ({now})\n{}",
            nodes.logs(20)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let events_before: i64 = db
        .query_one("SELECT count(*) FROM event", &[])
        .unwrap()
        .get(0);
    drop(db);
    outage.store(true, Ordering::SeqCst);
    let stopping = Instant::now();
    cluster
        .stop_server(mode)
        .unwrap_or_else(|e| panic!("stop PostgreSQL: {e}"));
    let stopped_in = stopping.elapsed();
    std::thread::sleep(OUTAGE);
    let starting = Instant::now();
    cluster
        .start_server()
        .unwrap_or_else(|e| panic!("start PostgreSQL again: {e}"));
    let away = stopping.elapsed();
    let started_in = starting.elapsed();
    outage.store(false, Ordering::SeqCst);
    // The clients go on for a while after it is back: their prompts claim over nothing.
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::SeqCst);
    let mut unexpected = Vec::new();
    for handle in workload {
        unexpected.extend(handle.join().expect("workload thread"));
    }
    let mut db = connect(&url);
    let view = quiesce(&mut db, SETTLE, "after the outage");
    let tally = assert_every_invariant(
        &cluster,
        &mut db,
        &view,
        &ledger,
        MAX_ATTEMPTS,
        &nodes,
        "outage",
    );
    assert!(
        unexpected.is_empty(),
        "answers other than 202 or 503:\n{}",
        unexpected.join("\n")
    );
    // No node lost its lease: the turns the outage failed were resumed by their own owner.
    let rejoined: Vec<String> = nodes.nodes.iter().map(|n| n.node_id(&mut db)).collect();
    assert_eq!(
        rejoined,
        node_ids,
        "a node rejoined under a new id: its lease lapsed in a {away:?} outage (lease {LEASE:?})\n{}",
        nodes.logs(20)
    );
    let (notices, aborts) = notices_and_aborts(&view.store);
    let counts = counts.lock().unwrap().clone();
    eprintln!(
        "PostgreSQL away {away:?} (stopped in {stopped_in:?}, ready {started_in:?} after its \
         start); {events_before} events before it; prompts [outside, during] the outage: \
         {counts:?}; {} acknowledged: {} answered, {} interrupted, {} fenced, {} given up; \
         {notices} restart notices (turns resumed in place), {aborts} aborted",
        ledger.acked().len(),
        tally[0],
        tally[1],
        tally[2],
        tally[3]
    );
    assert!(
        notices > 0,
        "no turn was resumed in place: the outage hit no turn's writes"
    );
}

/// One disruption of the chaos test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Disruption {
    /// `SIGKILL` a random node, restart it after 0 to 1.5 s.
    Kill,
    /// `SIGSTOP` a random node past its lease, then `SIGCONT`: a zombie the others took over.
    Pause,
    /// `pg_ctl restart -m fast`: every connection of every node broken at once.
    DatabaseRestart,
}

/// Three nodes with a 2 s lease under the random prompt/interrupt workload of
/// `random_node_kills_keep_every_invariant` over 60 sessions, and 20 disruptions in a seeded
/// order, 0.3 to 1.2 s apart: 13 `SIGKILL`s (each node restarted after a random pause), 4
/// `SIGSTOP`s past the lease then `SIGCONT`, and 3 PostgreSQL restarts (`pg_ctl restart -m
/// fast`). Then, once every turn settled, every invariant of the crash matrix over the shared
/// tables (`StoreView::violations`: seqs gap-free, at most one terminal per claimed turn, no
/// `started` over an open claim without a terminal or a restart notice between, the resume
/// budget), the cluster's (one writer per epoch, epochs never decreasing, no claim taken over a
/// live claim of the same session without the restart notice), the SQL ones, and every
/// acknowledged prompt answered once, interrupted, fenced by a later interrupt, or given up by
/// `aborted`. Seeded by `DS_SEED` (printed); about a minute.
#[test]
fn random_node_kills_pauses_and_database_restarts_keep_every_invariant() {
    let test = "random_node_kills_pauses_and_database_restarts_keep_every_invariant";
    let Some((_turn, mut cluster, url)) = database(test, "random_chaos") else {
        return;
    };
    const LEASE: Duration = Duration::from_secs(2);
    /// No disruption starts after this long (a bound on a loaded machine).
    const CHAOS_LIMIT: Duration = Duration::from_secs(60);
    let mut chaos = Chaos::start(test, &cluster, &url, LEASE);
    let mut plan: Vec<Disruption> = [
        (Disruption::Kill, 13),
        (Disruption::Pause, 4),
        (Disruption::DatabaseRestart, 3),
    ]
    .into_iter()
    .flat_map(|(d, n)| std::iter::repeat_n(d, n))
    .collect();
    for i in (1..plan.len()).rev() {
        plan.swap(i, chaos.rng.below(i as u64 + 1) as usize);
    }
    let started = Instant::now();
    let mut done: Vec<String> = Vec::new();
    for disruption in plan {
        if started.elapsed() > CHAOS_LIMIT {
            break;
        }
        std::thread::sleep(Duration::from_millis(300 + chaos.rng.below(900)));
        chaos.nodes.assert_alive();
        match disruption {
            Disruption::Kill => {
                let victim = chaos.rng.below(3) as usize;
                chaos.nodes.kill(victim);
                std::thread::sleep(Duration::from_millis(chaos.rng.below(1500)));
                chaos.nodes.restart(victim);
                done.push(format!("kill n{victim}"));
            }
            Disruption::Pause => {
                let victim = chaos.rng.below(3) as usize;
                let frozen = LEASE + Duration::from_millis(300 + chaos.rng.below(1000));
                chaos.nodes.take_out(victim);
                chaos.nodes.nodes[victim].pause();
                std::thread::sleep(frozen);
                chaos.nodes.nodes[victim].resume();
                chaos.nodes.put_back(victim);
                done.push(format!("pause n{victim} {} ms", frozen.as_millis()));
            }
            Disruption::DatabaseRestart => {
                let away = cluster
                    .restart(ShutdownMode::Fast)
                    .unwrap_or_else(|e| panic!("restart PostgreSQL: {e}"));
                done.push(format!("database restart ({} ms away)", away.as_millis()));
            }
        }
    }
    let summary = format!(
        "{} disruptions in {:?} ({})",
        done.len(),
        started.elapsed(),
        done.join(", ")
    );
    let notices = chaos.finish(
        &cluster,
        &url,
        "kills, pauses and database restarts",
        &summary,
    );
    assert!(
        notices > 0,
        "no turn was ever resumed: the disruptions hit nothing"
    );
    assert_eq!(
        done.len(),
        20,
        "only {} disruptions within {CHAOS_LIMIT:?}",
        done.len()
    );
}
