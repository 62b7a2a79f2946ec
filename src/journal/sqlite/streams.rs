//! Log numbers: which `event_stream.k` a session's next event goes to ([`stream_key`]; a log
//! is numbered on its first event, and continues in a new segment after a long absence: see
//! [`super::segments`]), and the writer's memory of them, so that an event's append does not
//! look the number up by session id each time.
//!
//! At 1,000,000 sessions that lookup descends a B-tree of a million text keys, and so does
//! `check_fence`'s probe of the session row: a good part of what the writer spends more per
//! turn there than at 1,000 sessions (`growth`, docs/bench-notes/cost-that-stays-flat.md). A
//! session with a log number is a stored session: its number is given with its first event, in
//! the transaction that creates it, and deleted with its row.
//!
//! The memory belongs to one writer's store ([`super::SqliteStore`]: the writer's connection
//! and what it remembers, owned together). It answers only inside that writer's transaction
//! ([`Streams::begin`] to [`Streams::commit`] or [`Streams::rollback`]); a store over a pooled
//! connection never opens one, so its memory stays empty. What a transaction learns stays
//! *pending* until its COMMIT succeeds: a rollback, or a rollback to a savepoint, forgets it (a
//! number given inside it may not exist any more). A deletion forgets the session at once.
//! Forgetting is always safe: the next append asks the table.
//!
//! Within one transaction it also keeps the newest seq appended to each log, so the second
//! event of a log in that transaction (the restart sweep's claim after its notice, a prompt's
//! promotion after its turn's start) takes the next seq without probing the indexes. That part
//! is cleared when the transaction ends, however it ends, and by a savepoint's rollback: the
//! write lock is held only until then, and another connection may append after it.
//!
//! A claim relies on the memory too: a session whose log number the writer knows is stored,
//! so its claim row is written without a probe of the session table
//! (`ProjectionRows::write_claim`, in `projection.rs`), and so is a turn's fence check
//! (`OwnershipRows::check_fence`, in `ownership.rs`).

use std::collections::HashMap;

use rusqlite::Connection;

use super::segments::{self, Placed};
use super::StoreError;
use crate::id::SessionId;

/// At most this many numbers are remembered; past it, the memory starts again from what the
/// next transactions learn (about 6 MiB at this size).
const CAPACITY: usize = 1 << 16;

/// One writer's memory of log numbers.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    /// Inside the writer's transaction.
    open: bool,
    /// Numbers committed.
    known: HashMap<SessionId, i64>,
    /// Numbers learned by the transaction in progress.
    pending: HashMap<SessionId, i64>,
    /// The newest seq the transaction in progress appended to each log (by number): the next
    /// event of that log in the same transaction gets the one after it, with no probe of the
    /// indexes. Only while the transaction holds the write lock: no other connection can
    /// append in between.
    appended: HashMap<i64, u64>,
}

impl Streams {
    /// The writer's transaction has begun: from now until it ends, the memory answers.
    pub(crate) fn begin(&mut self) {
        self.pending.clear();
        self.appended.clear();
        self.open = true;
    }

    /// The transaction committed: what it learned is known.
    pub(crate) fn commit(&mut self) {
        if self.open {
            if self.known.len() + self.pending.len() > CAPACITY {
                self.known.clear();
            }
            self.known.extend(self.pending.drain());
        }
        self.appended.clear();
        self.open = false;
    }

    /// The transaction rolled back (or its COMMIT failed): what it learned is forgotten.
    pub(crate) fn rollback(&mut self) {
        self.pending.clear();
        self.appended.clear();
        self.open = false;
    }

    /// A savepoint of the transaction rolled back: what the transaction learned is forgotten
    /// (some of it may have been the savepoint's).
    pub(crate) fn rollback_to(&mut self) {
        self.pending.clear();
        self.appended.clear();
    }

    /// `session`'s log number, if the writer's transaction is open and knows it.
    pub(crate) fn lookup(&self, session: &SessionId) -> Option<i64> {
        if self.open {
            self.known
                .get(session)
                .or_else(|| self.pending.get(session))
                .copied()
        } else {
            None
        }
    }

    /// `session`'s log is numbered `k` (read or given in the open transaction).
    pub(crate) fn learn(&mut self, session: &SessionId, k: i64) {
        if self.open {
            self.pending.insert(session.clone(), k);
        }
    }

    /// The seq the next event of log `stream` gets, if the open transaction appended to that
    /// log: one past the newest it appended.
    pub(crate) fn next_appended(&self, stream: i64) -> Option<u64> {
        if self.open {
            self.appended.get(&stream).map(|seq| seq + 1)
        } else {
            None
        }
    }

    /// The open transaction appended `seq` to log `stream`.
    pub(crate) fn appended(&mut self, stream: i64, seq: u64) {
        if self.open {
            self.appended.insert(stream, seq);
        }
    }

    /// `session` is being deleted: its number is forgotten now, whatever its transaction does
    /// (and what the transaction appended: a number may be given again).
    pub(crate) fn forget(&mut self, session: &SessionId) {
        self.known.remove(session);
        self.pending.remove(session);
        self.appended.clear();
    }

    /// The open transaction rewrote logs other than by appending (a compaction): what it
    /// appended is asked of the tables again.
    pub(crate) fn forget_appended(&mut self) {
        self.appended.clear();
    }

    /// Drops the memory (the writer gives its memory back, or went idle).
    pub(crate) fn release(&mut self) {
        *self = Self::default();
    }

    /// Where `session`'s next event goes (see [`super::segments`]): the segment this memory
    /// knows, when its transaction knows it, else the one the table says (the first, given
    /// with the first event; a new one, opened past a long absence, with its first seq read by
    /// `next_seq`), which is then remembered.
    pub(super) fn stream_key(
        &mut self,
        conn: &Connection,
        session: &SessionId,
        next_seq: impl FnOnce(Option<i64>) -> Result<u64, StoreError>,
    ) -> Result<Placed, StoreError> {
        if let Some(k) = self.lookup(session) {
            return Ok(Placed { k, seq: None });
        }
        let placed = segments::place(conn, session, next_seq)?;
        self.learn(session, placed.k);
        Ok(placed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::backend::WriterConnection;
    use crate::journal::sqlite::backend::SqliteWriter;
    use crate::journal::sqlite::test_support::rows::*;
    use crate::journal::sqlite::test_support::{create, sid, test_db, TestDb};
    use crate::journal::sqlite::{self, SqliteStore};

    fn writer(db: &TestDb) -> Result<SqliteWriter, StoreError> {
        Ok(SqliteWriter::new(
            sqlite::open_connection(&db.cfg)?,
            sqlite::open(&db.cfg)?,
        ))
    }

    fn conn(w: &mut SqliteWriter) -> &mut SqliteStore {
        w.sqlite_store()
    }

    fn log_len(conn: &mut SqliteStore, s: &str) -> usize {
        conn.events_after(&sid(s), None, 100).expect("read").len()
    }

    /// A number given inside a transaction that rolled back (or to a savepoint that did) is
    /// not used again: another session may have it by then, and the log would be theirs.
    #[test]
    fn a_number_given_in_a_rolled_back_transaction_is_not_used_again() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let mut w = writer(&db)?;
        w.begin()?;
        create(conn(&mut w), "a", None, 1)?;
        w.rollback();
        // Another connection creates `b`: it gets the number `a` had.
        create(&mut db.conn, "b", None, 2)?;
        w.begin()?;
        create(conn(&mut w), "a", None, 3)?;
        w.savepoint()?;
        create(conn(&mut w), "c", None, 4)?;
        w.rollback_to()?;
        w.release()?;
        // `d` gets the number `c` had inside the savepoint.
        create(conn(&mut w), "d", None, 5)?;
        create(conn(&mut w), "c", None, 6)?;
        w.commit()?;
        for s in ["a", "b", "c", "d"] {
            assert_eq!(
                log_len(&mut db.conn, s),
                1,
                "the log of {s}: its created event alone"
            );
        }
        Ok(())
    }

    /// A deleted session is fenced although the writer knew its number, and created again it
    /// gets a new log.
    #[test]
    fn a_deleted_session_is_fenced_though_the_writer_knew_its_number() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let mut w = writer(&db)?;
        let a = sid("a");
        w.begin()?;
        create(conn(&mut w), "a", None, 1)?;
        w.commit()?;
        w.begin()?;
        w.store().check_fence(&a, 0)?;
        w.store().delete_session(&a)?;
        w.commit()?;
        w.begin()?;
        let fenced = w.store().check_fence(&a, 0);
        assert!(
            matches!(fenced, Err(StoreError::Fenced { .. })),
            "{fenced:?}"
        );
        create(conn(&mut w), "a", None, 2)?;
        w.commit()?;
        let log = db.conn.events_after(&a, None, 100)?;
        assert_eq!(log.iter().map(|e| e.seq).collect::<Vec<_>>(), [0]);
        Ok(())
    }

    #[test]
    fn a_deleted_session_is_not_claimed_though_the_writer_knew_its_number() -> Result<(), StoreError>
    {
        let db = test_db()?;
        let mut w = writer(&db)?;
        let a = sid("a");
        w.begin()?;
        create(conn(&mut w), "a", None, 1)?;
        assert!(crate::journal::sqlite::test_support::claim(
            conn(&mut w),
            &a,
            5,
            0,
            "b"
        )?);
        w.commit()?;
        w.begin()?;
        note(conn(&mut w), "a", "x")?;
        w.store().delete_session(&a)?;
        let claimed = crate::journal::sqlite::test_support::claim(conn(&mut w), &a, 6, 2, "b")?;
        w.commit()?;
        assert!(!claimed, "no session, no claim");
        let rows: i64 = db
            .conn
            .query_row("SELECT COUNT(*) FROM session_claim", [], |row| row.get(0))?;
        assert_eq!(rows, 0);
        Ok(())
    }

    /// The seqs and types of `s`'s log.
    fn log(conn: &mut SqliteStore, s: &str) -> Vec<(u64, String)> {
        conn.events_after(&sid(s), None, 100)
            .expect("read")
            .into_iter()
            .map(|e| (e.seq, e.kind))
            .collect()
    }

    fn note(conn: &mut SqliteStore, s: &str, kind: &str) -> Result<u64, StoreError> {
        Ok(conn.publish(&sid(s), kind, &serde_json::json!({}), 9)?.seq)
    }

    #[test]
    fn a_rolled_back_savepoint_gives_its_seqs_again() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let mut w = writer(&db)?;
        w.begin()?;
        create(conn(&mut w), "a", None, 1)?;
        assert_eq!(note(conn(&mut w), "a", "x")?, 1);
        w.savepoint()?;
        assert_eq!(note(conn(&mut w), "a", "gone")?, 2);
        w.rollback_to()?;
        w.release()?;
        assert_eq!(
            note(conn(&mut w), "a", "y")?,
            2,
            "the rolled-back seq, again"
        );
        assert_eq!(note(conn(&mut w), "a", "z")?, 3);
        w.commit()?;
        let expected = [(0, "session.created"), (1, "x"), (2, "y"), (3, "z")];
        let expected: Vec<(u64, String)> = expected
            .iter()
            .map(|(q, k)| (*q, (*k).to_owned()))
            .collect();
        assert_eq!(log(&mut db.conn, "a"), expected);
        Ok(())
    }

    #[test]
    fn an_append_of_another_connection_between_two_transactions_is_seen() -> Result<(), StoreError>
    {
        let mut db = test_db()?;
        let mut w = writer(&db)?;
        w.begin()?;
        create(conn(&mut w), "a", None, 1)?;
        assert_eq!(note(conn(&mut w), "a", "x")?, 1);
        w.commit()?;
        assert_eq!(note(&mut db.conn, "a", "theirs")?, 2);
        w.begin()?;
        assert_eq!(
            note(conn(&mut w), "a", "y")?,
            3,
            "after the other connection's"
        );
        w.commit()?;
        assert_eq!(log(&mut db.conn, "a").len(), 4);
        Ok(())
    }

    #[test]
    fn only_an_open_transaction_of_its_writer_sees_the_memory() {
        let (mut w, mut other) = (Streams::default(), Streams::default());
        let s = sid("s");
        w.begin();
        w.learn(&s, 7);
        assert_eq!(w.lookup(&s), Some(7), "pending, in the transaction");
        w.commit();
        assert_eq!(w.lookup(&s), None, "outside a transaction");
        w.begin();
        assert_eq!(w.lookup(&s), Some(7), "known after the commit");
        w.rollback();
        other.begin();
        assert_eq!(other.lookup(&s), None, "another writer starts afresh");
        other.rollback();
        other.release();
    }

    #[test]
    fn a_rollback_forgets_what_the_transaction_learned_and_a_deletion_forgets_at_once() {
        let mut w = Streams::default();
        let (a, b) = (sid("a"), sid("b"));
        w.begin();
        w.learn(&a, 1);
        w.commit();
        w.begin();
        w.learn(&b, 2);
        w.rollback_to();
        assert_eq!(w.lookup(&b), None, "a savepoint's rollback");
        w.learn(&b, 2);
        w.rollback();
        w.begin();
        assert_eq!(w.lookup(&b), None, "the transaction's rollback");
        assert_eq!(w.lookup(&a), Some(1));
        w.forget(&a);
        assert_eq!(w.lookup(&a), None);
        w.rollback();
        w.release();
        w.begin();
        assert_eq!(w.lookup(&a), None, "released");
        w.rollback();
        w.release();
    }
}
