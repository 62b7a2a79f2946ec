//! What a drain answers: promotions of pending prompts into the transcript, the inbox, and
//! [`Turn::take_inputs`], which gives a drain the inputs its turn serves.

use std::sync::atomic::Ordering;

use super::Turn;
use crate::error::Result;
use crate::records::{Admission, Delivery};

impl Turn {
    /// Promotes every pending `steer` input admitted at or before `cutoff` (all when `None`)
    /// into the transcript, in admission order. Each promotion commits its
    /// `session.prompt.promoted` event, `promoted_seq` and transcript row together; concurrent
    /// promotion promotes each input exactly once.
    ///
    /// # Errors
    /// [`Error::Store`](crate::Error::Store) when the write failed (nothing was promoted); [`Error::Fenced`](crate::Error::Fenced) when
    /// another node took the session over (several nodes sharing a database): stop the drain.
    pub async fn promote_steer(&self, cutoff: Option<u64>) -> Result<Vec<Admission>> {
        let promoted = self
            .journal
            .promote_steer(self.session_id.clone(), cutoff, self.epoch)
            .await
            .map_err(|e| self.failed(e))?;
        if let Some(seq) = promoted.iter().filter_map(|a| a.promoted_seq).max() {
            self.committed(seq);
        }
        Ok(promoted)
    }

    /// The inputs this drain is to answer, promoting them: on a resumed or retried turn (the
    /// first call of its drain) first those the earlier attempt promoted and did not finish
    /// ([`Resumption::inputs`](crate::Resumption::inputs)); then every pending `steer` prompt, promoted now; then, when
    /// no `queue` prompt was among them, the oldest pending `queue` prompt (one per turn: the
    /// runtime starts the next turn for the next). Empty when there is nothing to answer.
    ///
    /// The simple runner is crash-correct with it alone: answer each input it returns, and a
    /// turn killed mid-reply answers its prompt when it is resumed.
    ///
    /// # Errors
    /// [`Error::Store`](crate::Error::Store) when a promotion failed; [`Error::Fenced`](crate::Error::Fenced) when another node took the
    /// session over.
    pub async fn take_inputs(&self) -> Result<Vec<Admission>> {
        let mut inputs: Vec<Admission> = Vec::new();
        if !self.shared.resumed_taken.swap(true, Ordering::AcqRel) {
            if let Some(resumption) = self.resumption() {
                inputs.extend(resumption.inputs.iter().cloned());
            }
        }
        inputs.extend(self.promote_steer(None).await?);
        if !inputs.iter().any(|a| a.delivery == Delivery::Queue) {
            inputs.extend(self.promote_queue().await?);
        }
        Ok(inputs)
    }

    /// Promotes only the oldest pending `queue` input (one per turn), if any.
    ///
    /// # Errors
    /// [`Error::Store`](crate::Error::Store) when the write failed.
    pub async fn promote_queue(&self) -> Result<Option<Admission>> {
        let promoted = self
            .journal
            .promote_queue(self.session_id.clone(), self.epoch)
            .await
            .map_err(|e| self.failed(e))?;
        if let Some(seq) = promoted.as_ref().and_then(|a| a.promoted_seq) {
            self.committed(seq);
        }
        Ok(promoted)
    }

    /// The inputs still pending in the session's inbox, in admission order.
    ///
    /// # Errors
    /// [`Error::Store`](crate::Error::Store) when the read failed.
    pub async fn pending(&self) -> Result<Vec<Admission>> {
        self.journal
            .pending(self.session_id.clone())
            .await
            .map_err(|e| self.failed(e))
    }
}
